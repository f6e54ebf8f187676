"""The stat cache: (path, device, inode, size, mtime_ns, ctime_ns) -> sha256, in sqlite, so an
unchanged file is never read twice. A changed file changes its size, mtime or inode, and misses; a
write whose mtime was put back (os.utime) still moves the ctime, which no user can set, so it
misses too (git compares ctime for the same reason). Linking or chmod-ing a file also moves its
ctime: such a file is hashed once more, never trusted wrongly.

Racy entries (git's "racy git"): a write lands on a timestamp tick, not an instant, so a file
changed in the tick in which it was read can change again in that tick without its stat moving. A
digest is kept only when the file's last change (the later of mtime and ctime) lies a whole tick
before the read began (`settled`): every later write then moves the stat. The clock is the
kernel's real-time clock, which local file systems stamp files with."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Optional

from trtbuild import fsfaults
from trtbuild.store.hash import Progress, file_sha256


# How long before a read a file's last change must lie for its digest to be kept: more than one
# timestamp tick. A kernel stamps files from a clock that may lag time.time_ns by a scheduler tick
# (4-10 ms) and file systems keep 1 ns (ext4, xfs, btrfs, tmpfs) to 10 ms (exFAT): 0.1 s covers
# both. Stamps in whole seconds come from a coarser file system (ext3's small inodes, HFS+: 1 s; FAT:
# 2 s), whose tick the wider window covers.
RACY_NS = 100_000_000
COARSE_RACY_NS = 2_100_000_000
SCHEMA = 2  # PRAGMA user_version; 1 (no version set) had no ctime column


def settled(st: os.stat_result, read_at_ns: int) -> bool:
    """Whether a file with stat `st`, read from `read_at_ns` (time.time_ns) on, can be kept: its last
    change is more than a tick before the read, so no later write leaves its stat as it was."""
    changed = max(st.st_mtime_ns, st.st_ctime_ns)
    coarse = st.st_mtime_ns % 1_000_000_000 == 0 and st.st_ctime_ns % 1_000_000_000 == 0
    return read_at_ns - changed > (COARSE_RACY_NS if coarse else RACY_NS)


class StatCache:
    def __init__(self, db_path: Optional[Path]) -> None:
        self.db_path = db_path
        self._local = threading.local()
        self._opened: list[sqlite3.Connection] = []  # every thread's connection, for close()
        if db_path is not None:
            db_path.parent.mkdir(parents=True, exist_ok=True)
            with self._faults():
                self._migrate(self._connect())

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        """Create the tables; an index.db of an older schema loses its stat rows (they lack the
        ctime, so none of them may answer), never the remote ones, which are still right."""
        db.execute("BEGIN IMMEDIATE")  # two processes opening an old index.db migrate it once
        try:
            if db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA:
                db.execute("DROP TABLE IF EXISTS stat")
            db.execute("CREATE TABLE IF NOT EXISTS stat (path TEXT PRIMARY KEY, dev INTEGER, ino INTEGER, "
                       "size INTEGER, mtime_ns INTEGER, ctime_ns INTEGER, sha256 TEXT)")
            # Remote objects hashed once: an S3 object is the same bytes while its ETag and size are.
            db.execute("CREATE TABLE IF NOT EXISTS remote (url TEXT PRIMARY KEY, etag TEXT, size INTEGER, sha256 TEXT)")
            if db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA:  # no write when current: a full disk opens it
                db.execute(f"PRAGMA user_version = {SCHEMA}")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # a failed COMMIT (a full disk) has already rolled back
                db.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def _faults(self):
        """A full disk or a read-only store under index.db: the OSError it is, naming index.db."""
        try:
            yield
        except sqlite3.Error as exc:
            fault = fsfaults.from_sqlite(exc, self.db_path)
            if fault is None:
                raise
            raise fault from exc

    @contextlib.contextmanager
    def _unless_full(self):
        """A new entry that a full disk (or a read-only store) cannot take is left out: the cache only
        misses it later (the file is hashed again), it never answers wrongly. Removing an entry
        (forget) stays strict."""
        try:
            with self._faults():
                yield
        except OSError as exc:
            if not fsfaults.is_fault(exc):
                raise

    def _connect(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            # WAL lets concurrent builders read while one writes; a busy store waits, it does not fail.
            db = sqlite3.connect(self.db_path, timeout=60, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
            self._opened.append(db)
        return db

    def close(self) -> None:
        """Close every connection (before index.db is removed: SQLite closing a connection later
        would unlink the WAL file by name, whatever file then has that name)."""
        for db in self._opened:
            try:
                db.close()
            except sqlite3.ProgrammingError:  # opened by another thread; closed when that thread is collected
                pass
        self._opened.clear()
        self._local = threading.local()

    @staticmethod
    def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def get(self, path: Path, st: os.stat_result) -> Optional[str]:
        if self.db_path is None:
            return None
        row = self._connect().execute(
            "SELECT dev, ino, size, mtime_ns, ctime_ns, sha256 FROM stat WHERE path = ?", (str(path),)
        ).fetchone()
        if row and tuple(row[:5]) == self._identity(st):
            return row[5]
        return None

    def put(self, path: Path, st: os.stat_result, sha256: str) -> None:
        if self.db_path is None:
            return
        with self._unless_full():
            self._connect().execute(
                "INSERT OR REPLACE INTO stat VALUES (?, ?, ?, ?, ?, ?, ?)",
                (str(path), *self._identity(st), sha256),
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
        return self.rehash(path, progress, st)

    def rehash(self, path: Path, progress: Progress = None, st: Optional[os.stat_result] = None) -> str:
        """Read the file and return its sha256, keeping it when the file stayed as `st` (its stat
        before the read) throughout and was settled when the read began."""
        path = Path(os.path.abspath(path))
        st = st if st is not None else path.stat()
        read_at = time.time_ns()  # before the read: a write after it, in st's tick, would go unseen
        digest = file_sha256(path, progress)
        after = path.stat()
        if self._identity(after) == self._identity(st) and settled(after, read_at):
            self.put(path, after, digest)
        return digest

    def known_sha256(self, path: Path) -> Optional[str]:
        """The file's sha256 when the cache vouches for it (hashed before, its stat unchanged), else
        None; the file is never read."""
        path = Path(os.path.abspath(path))
        return self.get(path, path.stat())

    def forget(self, path: Path) -> None:
        if self.db_path is not None:
            with self._faults():
                self._connect().execute("DELETE FROM stat WHERE path = ?", (str(Path(os.path.abspath(path))),))

    def remote_sha256(self, url: str, etag: str, size: int) -> Optional[str]:
        if self.db_path is None:
            return None
        row = self._connect().execute("SELECT etag, size, sha256 FROM remote WHERE url = ?", (url,)).fetchone()
        return row[2] if row and (row[0], row[1]) == (etag, size) else None

    def put_remote(self, url: str, etag: str, size: int, sha256: str) -> None:
        if self.db_path is not None:
            with self._unless_full():
                self._connect().execute("INSERT OR REPLACE INTO remote VALUES (?, ?, ?, ?)", (url, etag, size, sha256))

    # Values computed from a file's content, such as the model config a GGUF header implies: `kind`
    # names what and the code that computed it, `sha256` the file. The table is made by the first
    # put, not by opening index.db (opening writes nothing to a store that is current).
    def derived(self, kind: str, sha256: str) -> Optional[str]:
        if self.db_path is None:
            return None
        try:
            row = self._connect().execute("SELECT value FROM derived WHERE kind = ? AND sha256 = ?",
                                          (kind, sha256)).fetchone()
        except sqlite3.OperationalError:  # no such table yet (or a busy database): a miss
            return None
        return row[0] if row else None

    def put_derived(self, kind: str, sha256: str, value: str) -> None:
        if self.db_path is not None:
            with self._unless_full():
                db = self._connect()
                db.execute("CREATE TABLE IF NOT EXISTS derived (kind TEXT, sha256 TEXT, value TEXT, "
                           "PRIMARY KEY (kind, sha256))")
                db.execute("INSERT OR REPLACE INTO derived VALUES (?, ?, ?)", (kind, sha256, value))
