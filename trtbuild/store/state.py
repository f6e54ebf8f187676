"""The stat cache: (path, device, inode, size, mtime_ns) -> sha256, in sqlite, so an unchanged file
is never read twice. A changed file changes its size or mtime (or inode when replaced), and misses."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Optional

from trtbuild.store.hash import Progress, file_sha256


RACY_NS = 100_000_000  # 0.1 s


class StatCache:
    def __init__(self, db_path: Optional[Path]) -> None:
        self.db_path = db_path
        self._local = threading.local()
        if db_path is not None:
            db_path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as db:
                db.execute(
                    "CREATE TABLE IF NOT EXISTS stat (path TEXT PRIMARY KEY, dev INTEGER, ino INTEGER, "
                    "size INTEGER, mtime_ns INTEGER, sha256 TEXT)"
                )
                # Remote objects hashed once: an S3 object is the same bytes while its ETag and size are.
                db.execute("CREATE TABLE IF NOT EXISTS remote (url TEXT PRIMARY KEY, etag TEXT, size INTEGER, sha256 TEXT)")

    def _connect(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            # WAL lets concurrent builders read while one writes; a busy store waits, it does not fail.
            db = sqlite3.connect(self.db_path, timeout=60, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        return db

    def get(self, path: Path, st: os.stat_result) -> Optional[str]:
        if self.db_path is None:
            return None
        row = self._connect().execute(
            "SELECT dev, ino, size, mtime_ns, sha256 FROM stat WHERE path = ?", (str(path),)
        ).fetchone()
        if row and tuple(row[:4]) == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns):
            return row[4]
        return None

    def put(self, path: Path, st: os.stat_result, sha256: str) -> None:
        if self.db_path is None:
            return
        self._connect().execute(
            "INSERT OR REPLACE INTO stat VALUES (?, ?, ?, ?, ?, ?)",
            (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, sha256),
        )

    def sha256(self, path: Path, progress: Progress = None) -> str:
        """The file's sha256, from the cache when its stat is unchanged, else by reading it."""
        path = Path(os.path.abspath(path))
        st = path.stat()
        cached = self.get(path, st)
        if cached is not None:
            if progress:
                progress(st.st_size)
            return cached
        digest = file_sha256(path, progress)
        after = path.stat()
        unchanged = (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
        # A file written within the filesystem's timestamp granularity could change again without its
        # mtime moving ("racy" entries, as git calls them): do not cache it yet.
        settled = time.time_ns() - after.st_mtime_ns > RACY_NS
        if unchanged and settled:
            self.put(path, after, digest)
        return digest

    def forget(self, path: Path) -> None:
        if self.db_path is not None:
            self._connect().execute("DELETE FROM stat WHERE path = ?", (str(Path(os.path.abspath(path))),))

    def remote_sha256(self, url: str, etag: str, size: int) -> Optional[str]:
        if self.db_path is None:
            return None
        row = self._connect().execute("SELECT etag, size, sha256 FROM remote WHERE url = ?", (url,)).fetchone()
        return row[2] if row and (row[0], row[1]) == (etag, size) else None

    def put_remote(self, url: str, etag: str, size: int, sha256: str) -> None:
        if self.db_path is not None:
            self._connect().execute("INSERT OR REPLACE INTO remote VALUES (?, ?, ?, ?)", (url, etag, size, sha256))
