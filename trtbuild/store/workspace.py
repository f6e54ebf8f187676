"""A folder store's workspace: what only a store on this host has, apart from the blobs and records
it holds (store/folder.py): temporary work folders, downloads, checkouts, kept failures, reports,
the stat cache's database, the lock files it registered (gc roots), and its locks (per key, per
checkout, the store itself). A shared store (S3) has none; Store.workspace() says so in one line
(NoWorkspace), as the remote execution API keeps the action cache and CAS apart from the client's disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

from trtbuild import interrupt
from trtbuild.keys import canonical_json
from trtbuild.store import layout
from trtbuild.store.folder import FolderTransport, file_lock
from trtbuild.store.hash import atomic_write, bytes_sha256
from trtbuild.store.storelock import Say, StoreLock, waiting

if TYPE_CHECKING:
    from filelock import FileLock

class Workspace:
    """The work areas of the folder store at `folder.root` (store/layout.py names each one)."""

    def __init__(self, folder: FolderTransport) -> None:
        self.folder = folder
        self.root = folder.root
        self.store_lock = StoreLock(folder)

    def using(self, exclusive: bool = False, wait: bool = True, say: Optional[Say] = None):
        """The store lock (storelock.StoreLock.using): builds shared, gc and repair exclusive."""
        return self.store_lock.using(exclusive, wait, say)

    # ---- areas -----------------------------------------------------------------------------------
    def tmpdir(self, prefix: str) -> Path:
        """A fresh work folder inside the store (stage outputs there are ingested by rename), left to
        the caller: work_folder is the one that is removed however its block ends."""
        self.folder.writing()
        return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=self.root / layout.TMP))

    @contextlib.contextmanager
    def work_folder(self, prefix: str) -> Iterator[Path]:
        """A fresh work folder in tmp/ for the block, removed when the block ends, however it ends. It is
        made with Ctrl-C held (interrupt.held), so an interrupt cannot land between its making and the
        guard that removes it."""
        work = None
        try:
            with interrupt.held():
                work = self.tmpdir(prefix)
            yield work
        finally:
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)

    def clean_tmp(self, older_than_s: float = 24 * 3600, dry_run: bool = False) -> int:
        """Remove (dry: count) tmp/ entries not touched for `older_than_s`."""
        removed, now = 0, time.time()
        folder = self.root / layout.TMP
        for path in folder.iterdir() if folder.is_dir() else ():
            try:
                if now - path.lstat().st_mtime > older_than_s:
                    if not dry_run:
                        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed

    def downloads_dir(self) -> Path:
        """Where sources keep what they download (hub files, bucket objects)."""
        return self.root / layout.DOWNLOADS

    def state_db_path(self) -> Optional[Path]:
        """The stat cache's database, for stage processes that hash with it (None: in memory only)."""
        return self.folder.state.db_path

    def keep_failure(self, key: str, logs: Path) -> Path:
        """failed/<key>/logs holds the latest failure of a key until `cache gc` sees the key built."""
        self.folder.storing()
        dest = self.root / layout.failure(key)
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copytree(logs, dest / "logs")
        return dest / "logs"

    def failures(self) -> list[str]:
        return self._names(layout.FAILED)

    def remove_failure(self, key: str) -> None:
        shutil.rmtree(self.root / layout.failure(key), ignore_errors=True)

    def checkout_path(self, digest: str) -> Path:
        """Where the artifact's read-only folder is (or will be) materialized."""
        return self.root / layout.checkout(digest)

    def checkouts(self) -> list[str]:
        """Names of the materialized folders (artifact digests, or leftovers to remove)."""
        return self._names(layout.CHECKOUTS)

    def remove_checkout(self, name: str) -> None:
        path = self.root / layout.checkout(name)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def report_dir(self, recipe: str) -> Path:
        return self.root / layout.report(recipe)

    def _names(self, area: str) -> list[str]:
        folder = self.root / area
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    # ---- lock files that pin artifacts (gc roots) ------------------------------------------------
    def embedded_lock_path(self, recipe: str) -> Path:
        """Where the lock file of a recipe without a folder of its own (the embedded demo) lives."""
        return self.root / layout.embedded_lock(recipe)

    def published_lock_path(self, recipe: str) -> Path:
        """The lock `push` last published for `recipe` into this store (a bucket keeps it at
        layout.pushed_lock instead)."""
        return self.root / layout.published_lock(recipe)

    def publish_lock(self, recipe: str, data: bytes) -> None:
        """Replace the recipe's published lock, whole, registered first as a gc root: gc keeps
        what it names while it is there, and never sees it without its pins."""
        self.folder.writing()
        path = self.published_lock_path(recipe)
        self.register_lockfile(path)
        atomic_write(path, data)

    def register_lockfile(self, lock_path: Path) -> None:
        """Remember a lock file written against this store: gc keeps what it names while it exists."""
        self.folder.writing()
        lock_path = Path(os.path.abspath(lock_path))
        root = self.root / layout.root(bytes_sha256(str(lock_path).encode()))
        body = canonical_json({"lockfile": str(lock_path)}) + b"\n"
        try:  # read, not only stat-ed: a damaged root (cut short, or naming another path) is written again
            if root.read_bytes() == body:
                return
        except FileNotFoundError:
            pass
        atomic_write(root, body)

    def registered_lockfiles(self) -> list[Path]:
        found = []
        for rel, _ in self.folder.list(layout.ROOTS):
            try:
                found.append(Path(json.loads((self.root / rel).read_text())["lockfile"]))
            except (ValueError, KeyError):
                continue
        return found

    # ---- locks -----------------------------------------------------------------------------------
    def key_lock(self, key: str, waiter: str = "", say: Optional[Say] = None) -> contextlib.AbstractContextManager:
        """Held while a key is built: a second process wanting the same key waits, then hits. A wait
        is said in one line (to `say`, else stderr), which begins with `waiter` (the node's id)."""
        self.folder.writing()
        return waiting(file_lock(self.root / layout.key_lock(key)), waiter or f"key {key[:16]}...", say)

    def checkout_lock(self, digest: str) -> "FileLock":
        self.folder.writing()
        return file_lock(self.root / layout.checkout_lock(digest))
