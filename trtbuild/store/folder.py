"""The folder backend of the transport (store/transport.py): a store's objects and blobs as files
under one root, in the layout of store/layout.py.

Opening creates nothing; the first write creates the layout. Every write is a temp file, fsync,
rename (hash.atomic_write); a conditional write of one object holds a flock of its own while it
compares and replaces, so two processes of one host get S3's If-None-Match / If-Match behaviour.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Optional

from trtbuild.errors import InvalidInput
from trtbuild.store import ingest, layout
from trtbuild.store.errors import CorruptStore
from trtbuild.store.hash import Progress, atomic_write, bytes_sha256, copy_with_sha256, file_sha256, fsync_dir, is_digest
from trtbuild.store.state import StatCache
from trtbuild.store.transport import Found, Transport


def file_lock(path: Path):
    """filelock is imported by the first lock taken: a build that finds everything stored takes none."""
    from filelock import FileLock

    return FileLock(str(path))


class FolderTransport(Transport):
    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.abspath(root))
        if self.root.exists() and not self.root.is_dir():
            raise InvalidInput(f"store {self.root}: not a folder")
        self._state: Optional[StatCache] = None
        #: said once, when the first thing is stored ("new store at ...", set by Workspace.using)
        self.announce: Optional[Callable[[], None]] = None

    def path(self, rel: str) -> Path:
        return self.root / rel

    @property
    def location(self) -> str:
        return str(self.root)

    def describe(self, rel: str) -> str:
        return str(self.root / rel)

    # ---- life ------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return (self.root / "cas").is_dir()

    def missing(self) -> str:
        if not self.root.exists():
            return f"store {self.root}: no such store (nothing has been built there)"
        return f"store {self.root}: not a trtbuild store (it has no cas/ folder; nothing has been built there)"

    def create(self) -> None:
        try:
            for sub in layout.FOLDER_LAYOUT:
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a path under a file, a read-only folder: one line, not a traceback
            raise InvalidInput(f"store {self.root}: cannot create it ({exc.strerror})") from None
        if self._state is not None and self._state.db_path is None:
            self._state = None  # a store that exists now keeps its stat cache on disk

    @property
    def state(self) -> StatCache:
        """The stat cache in index.db; a store that does not exist (yet) gets one in memory only,
        so reading it creates nothing."""
        if self._state is None:
            self._state = StatCache(self.root / layout.STATE_DB if self.exists() else None)
        return self._state

    def close_state(self) -> None:
        if self._state is not None:
            self._state.close()
            self._state = None

    def writing(self) -> None:
        if not self.exists():
            self.create()

    def storing(self) -> None:
        """The first write that stores something: what makes a store that using() created stay,
        and so the moment to say it is new."""
        self.writing()
        if self.announce is not None:
            announce, self.announce = self.announce, None
            announce()

    # ---- small objects ---------------------------------------------------------------------------
    def get(self, rel: str) -> Optional[Found]:
        try:
            data = (self.root / rel).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return Found(data, bytes_sha256(data))

    def has(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def put(self, rel: str, data: bytes) -> None:
        self.storing()
        atomic_write(self.root / rel, data)

    def put_if_absent(self, rel: str, data: bytes) -> bool:
        """Written beside, then hard-linked into place: link() fails on an existing name, atomically.
        A manifest, named by its content, is read-only (0444)."""
        self.storing()
        path = self.root / rel
        mode = 0o444 if rel.startswith(layout.MANIFESTS) else 0o644
        if path.exists():
            return False
        staged = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.new")
        atomic_write(staged, data, mode)
        try:
            os.link(staged, path)
        except FileExistsError:
            return False
        finally:
            staged.unlink(missing_ok=True)
        fsync_dir(path.parent)
        return True

    def put_if_match(self, rel: str, data: bytes, tag: str) -> bool:
        self.storing()
        with file_lock(self.root / layout.object_lock(bytes_sha256(rel.encode()))):
            found = self.get(rel)
            if found is None or found.tag != tag:
                return False
            atomic_write(self.root / rel, data)
            return True

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        base = self.root / prefix
        if not base.is_dir():
            return
        for path in sorted(base.rglob("*")):
            if path.is_file() and not path.name.endswith((".tmp", ".new")):
                yield path.relative_to(self.root).as_posix(), path.stat().st_size

    def delete(self, rel: str) -> None:
        (self.root / rel).unlink(missing_ok=True)

    # ---- blobs -----------------------------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        return self.root / layout.blob(digest)

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).exists()

    def blob_file(self, digest: str) -> Optional[Path]:
        return self.blob_path(digest)

    def put_blob(self, source: Path, digest: str, owned: bool = False, link: bool = False) -> None:
        """Put `source` (whose sha256 is `digest`) into cas/. `owned`: the file is the store's own
        (a stage's output or a pulled blob in tmp/) and the store takes it (renamed: no second
        name is left whose removal would move the blob's ctime); `link`: a download cache's file,
        which stays (hard-linked); anything else is copied and re-verified. The blob is protected
        (0444) before its stat cache entry is written (dvc-data's protect() then state.save())."""
        self.storing()
        blob = self.blob_path(digest)
        if blob.exists():
            if self.state.sha256(blob) == digest:
                return
            self.remove_blob(digest)  # a damaged copy: the new bytes replace it
        tmp = self.root / layout.TMP / f"blob-{digest[:16]}-{os.getpid()}-{os.urandom(4).hex()}"
        ingest.write_blob(source, digest, blob, tmp, self.state, owned=owned, link=link)

    def ingest_files(self, folder: Path, progress: Progress = None, include=None, links_within: Optional[Path] = None,
                     link: bool = False):
        """Files under tmp/ are the store's own and are taken; a download cache's (`link`) are
        hard-linked; anything else (a user's model folder) is copied, hashing while copying."""
        self.writing()
        folder = Path(os.path.abspath(folder))
        return ingest.ingest_folder(folder, self.state, self.put_blob, self.owns(folder) and not link, progress,
                                    include, links_within, link)

    def owns(self, path: Path) -> bool:
        """Whether `path` is in the store's tmp/ (the store's own, to take rather than copy)."""
        return Path(os.path.abspath(path)).is_relative_to(self.root / layout.TMP)

    def open_blob(self, digest: str) -> BinaryIO:
        try:
            return open(self.blob_path(digest), "rb")
        except FileNotFoundError:
            raise CorruptStore(f"blob {digest} is missing from {self.root / 'cas'}") from None

    def verify_blob(self, digest: str, use_state: bool = True) -> None:
        """`use_state`: a blob the store wrote and protected, unchanged since, is trusted unread."""
        blob = self.blob_path(digest)
        if not blob.exists():
            raise CorruptStore(f"blob {digest} is missing from {self.root / 'cas'}")
        actual = self.state.sha256(blob) if use_state else file_sha256(blob)
        if actual != digest:
            raise CorruptStore(f"blob {blob} is corrupt: its sha256 is {actual}; {self.verify_hint()}")

    def blob_problem(self, digest: str, size: int, label: str) -> Optional[str]:
        blob = self.blob_path(digest)
        try:
            actual = blob.stat().st_size
        except FileNotFoundError:
            return f"blob {digest} ({label}) is missing from {self.root / 'cas'}"
        if actual != size:
            return f"blob {blob} ({label}) has {actual} bytes, its manifest says {size}"
        try:
            self.verify_blob(digest)
        except CorruptStore as exc:
            return str(exc)
        return None

    def place_blob(self, digest: str, dest: Path, executable: bool) -> None:
        """A hard link to the read-only blob when on one filesystem (not for executables: the blob
        is 0444), else a copy verified while copying."""
        blob = self.blob_path(digest)
        if not executable:
            before = blob.stat()
            try:
                os.link(blob, dest)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
            else:
                self._relinked(blob, before, digest)
                return
        copied = copy_with_sha256(blob, dest)
        if copied != digest:
            raise CorruptStore(f"blob {blob} is corrupt: its sha256 is {copied}; {self.verify_hint()}")
        os.chmod(dest, 0o555 if executable else 0o444)

    def _relinked(self, blob: Path, before: os.stat_result, digest: str) -> None:
        """A new link moves the blob's ctime; its bytes did not change. If the stat cache vouched for
        the blob just before, it vouches for it after (else it would be re-hashed on every read
        following a checkout)."""
        if self.state.get(blob, before) != digest:
            return
        after = blob.stat()
        if (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns):
            self.state.put(blob, after, digest)

    def iter_blobs(self) -> Iterator[tuple[str, int]]:
        for rel, size in self.list(layout.CAS):
            yield layout.blob_name(rel, is_digest), size

    def rehash_blob(self, name: str, progress: Progress = None) -> str:
        return self.state.rehash(self.root / layout.blob(name), progress)  # the read refreshes the stat cache

    def remove_blob(self, name: str) -> None:
        path = self.root / layout.blob(name)
        path.unlink(missing_ok=True)
        self.state.forget(path)
