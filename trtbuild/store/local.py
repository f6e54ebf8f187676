"""The store on a local folder: cas/ blobs, manifests/, ac/ action records, refs/, index.db, tmp/,
locks/, checkouts/, and failed/, downloads/, reports/, roots/ (the Store interface, base.py).

Opening a store creates nothing; its first write (a build) creates the layout.

Every write is a temp file, fsync, rename; blobs go in before the manifest that names them, the
manifest before the action record, the record before the ref, so a crash at any point leaves only
unreferenced leftovers (which `cache gc` removes), never a record pointing at missing bytes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import tempfile
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterator, Optional

from pydantic import ValidationError

from trtbuild import fsfaults
from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.keys import canonical_json
from trtbuild.store.records import ActionRecord, Digest, RecipeClaim, Ref, RefEntry, dump
from trtbuild.store.base import CorruptStore, Store, first_error, parse_record
from trtbuild.store import ingest
from trtbuild.store.hash import Progress, atomic_write, bytes_sha256, copy_with_sha256, file_sha256, fsync_dir, is_digest
from trtbuild.store.location import store_url
from trtbuild.store.state import StatCache
from trtbuild.store.tree import BadTree, Manifest

if TYPE_CHECKING:
    from filelock import FileLock

# cas/ comes last: exists() tests it, so a build that sees a store another process is creating
# finds locks/ and the rest already there.
LAYOUT = ("manifests", "ac", "refs", "tmp", "locks", "checkouts", "cas/sha256")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _file_lock(path: Path) -> "FileLock":
    """filelock is imported by the first lock taken: a build that finds everything stored takes none."""
    from filelock import FileLock

    return FileLock(str(path))


Say = Callable[[str], None]  # where a store's one-line notices go (a build's progress lines)


def _to_stderr(line: str) -> None:
    """A notice of a command without a progress reporter (push, pull): a line on stderr, looked up
    when written, so that a live progress bar (rich redirects stderr) prints it above itself."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def lock_holder(path: Path) -> Optional[str]:
    """Who holds the flock on `path`, from the kernel's table (/proc/locks, Linux): "pid N (its
    command line)", or None when that cannot be told. Nothing is written to say who holds a lock:
    a stale note could only mislead, the kernel's table cannot."""
    try:
        st = os.stat(path)
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []  # "1: FLOCK  ADVISORY  WRITE 4711 fe:00:2157153 0 EOF"; "1: -> FLOCK ..." is a waiter
    for fields in (line.split() for line in table.splitlines()):
        # an overlay file system names its upper layer's device: the inode alone, after an exact match
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(st.st_ino):
            pids.insert(0 if fields[5] == device else len(pids), fields[4])
    if not pids:
        return None
    try:
        command = " ".join(Path(f"/proc/{pids[0]}/cmdline").read_bytes().decode(errors="replace").split("\0")).strip()
    except OSError:
        command = ""
    if len(command) > 80:
        command = command[:77] + "..."
    return f"pid {pids[0]} ({command})" if command else f"pid {pids[0]}"


@contextlib.contextmanager
def _waiting(lock: "FileLock", what: str, say: Optional[Say]) -> Iterator[None]:
    """Hold `lock`; when another process holds it, say so (naming the holder when the kernel tells)
    before waiting for it."""
    from filelock import Timeout

    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = lock_holder(Path(lock.lock_file))
        (say or _to_stderr)(f"{what}: waiting for {lock.lock_file}" + (f", held by {holder}" if holder else ""))
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def open_store(url: Optional[str] = None, create: bool = False, missing_ok: bool = False) -> Store:
    """--store URL, else $TRTBUILD_CACHE, else ./cache: a folder (LocalStore) or `s3://bucket/prefix`
    (S3Store). Opening creates nothing. `create`: the store may not exist yet; its first write (a
    build, through using()) creates it. `missing_ok`: a missing store reads as an empty one
    (explain). Otherwise a missing store is refused."""
    url = store_url(url)
    if url.startswith("s3://"):
        from trtbuild.store.s3 import S3Store

        store: Store = S3Store(url)
    elif "://" in url:
        raise InvalidInput(f"--store {url}: a store is a local folder or an s3://BUCKET/PREFIX URL")
    else:
        store = LocalStore(Path(url))
    if not (create or missing_ok):
        store.require()
    return store


class LocalStore(Store):
    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.abspath(root))
        if self.root.exists() and not self.root.is_dir():
            raise InvalidInput(f"store {self.root}: not a folder")
        self._state: Optional[StatCache] = None
        self._announce: Optional[Callable[[], None]] = None  # "new store at ...", said when it first stores

    def __repr__(self) -> str:
        return f"LocalStore({self.root})"

    # ---- life ------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return (self.root / "cas").is_dir()

    def require(self) -> None:
        """Refuse, in one line, a store that nothing was ever built into."""
        if not self.root.exists():
            raise InvalidInput(f"store {self.root}: no such store (nothing has been built there)")
        if not self.exists():
            raise InvalidInput(f"store {self.root}: not a trtbuild store (it has no cas/ folder; nothing has been built there)")

    def create(self) -> None:
        try:
            for sub in LAYOUT:
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
            self._state = StatCache(self.root / "index.db" if self.exists() else None)
        return self._state

    @property
    def location(self) -> str:
        return str(self.root)

    def _writing(self) -> None:
        if not self.exists():
            self.create()

    def _storing(self) -> None:
        """The first write that stores something (a blob, a manifest, a failure's logs): what makes
        a store that using() created stay, and so the moment to say it is new."""
        self._writing()
        if self._announce is not None:
            announce, self._announce = self._announce, None
            announce()

    # ---- paths -----------------------------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        return self.root / "cas" / "sha256" / digest[:2] / digest

    def manifest_path(self, digest: str) -> Path:
        return self.root / "manifests" / f"{digest}.json"

    def record_path(self, key: str) -> Path:
        return self.root / "ac" / f"{key}.json"

    def ref_path(self, recipe: str, target: str) -> Path:
        return self.root / "refs" / recipe / target

    def checkout_path(self, digest: str) -> Path:
        return self.root / "checkouts" / digest

    def describe_blob(self, name: str) -> str:
        return str(self._blob_file(name))

    def describe_manifest(self, digest: str) -> str:
        return str(self.manifest_path(digest))

    def describe_record(self, key: str) -> str:
        return str(self.record_path(key))

    def describe_ref(self, recipe: str, target: str) -> str:
        return str(self.ref_path(recipe, target))

    # ---- areas -----------------------------------------------------------------------------------
    def tmpdir(self, prefix: str) -> Path:
        self._writing()
        return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=self.root / "tmp"))

    def downloads_dir(self) -> Path:
        return self.root / "downloads"

    def state_db_path(self) -> Optional[Path]:
        return self.state.db_path

    def keep_failure(self, key: str, logs: Path) -> Path:
        """failed/<key>/logs holds the latest failure of a key until `cache gc` sees the key built."""
        self._storing()
        dest = self.root / "failed" / key
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copytree(logs, dest / "logs")
        return dest / "logs"

    def failures(self) -> list[str]:
        folder = self.root / "failed"
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def remove_failure(self, key: str) -> None:
        shutil.rmtree(self.root / "failed" / key, ignore_errors=True)

    def checkouts(self) -> list[str]:
        folder = self.root / "checkouts"
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def remove_checkout(self, name: str) -> None:
        path = self.root / "checkouts" / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def report_dir(self, recipe: str) -> Path:
        return self.root / "reports" / recipe

    # ---- locks -----------------------------------------------------------------------------------
    def key_lock(self, key: str, waiter: str = "", say: Optional[Say] = None) -> contextlib.AbstractContextManager:
        """Held while a key is built: a second process wanting the same key waits, then hits. A wait
        is said in one line (to `say`, else stderr), which begins with `waiter` (the node's id)."""
        self._writing()
        return _waiting(_file_lock(self.root / "locks" / f"{key}.lock"), waiter or f"key {key[:16]}...", say)

    def checkout_lock(self, digest: str) -> FileLock:
        self._writing()
        return _file_lock(self.root / "locks" / f"checkout-{digest}.lock")

    @contextlib.contextmanager
    def using(self, exclusive: bool = False, wait: bool = True, say: Optional[Say] = None) -> Iterator[None]:
        """Builds hold the store shared, and create it: a build creates its store when it first
        writes, not before its recipe was checked. `cache gc` holds it exclusive, so it never
        deletes bytes a running build has written but not yet recorded; exclusive use needs a store
        that exists (gc and repair never create one). A store this call created is removed again
        when the work ends in an error (a source refused at build time, a hub that cannot be
        reached, Ctrl-C) before storing anything: then nothing was written.

        `say` (else stderr) gets the store's one-line notices: a wait for the store held exclusive,
        and "new store at PATH" when this call made the store's folder (a mistyped --store starts
        an empty store), said when it first stores something (_storing), so a run that ends
        without storing anything (and leaves no store) does not say it."""
        made = None
        new_folder = not exclusive and not self.root.exists()
        if exclusive:
            self.require()
        elif not self.exists():
            made = self._missing_layout()
        handle = self._lock_store(exclusive, wait, say or _to_stderr)
        if new_folder:
            self._announce = lambda: (say or _to_stderr)(f"new store at {self.root}")
        try:
            yield
        except BaseException:
            if made is not None:
                self._discard_if_empty(handle, made)
            raise
        finally:
            self._announce = None
            handle.close()  # closing the last descriptor releases the flock

    def _lock_store(self, exclusive: bool, wait: bool, say: Say):
        """locks/store.lock, flocked. A store removed (by _discard_if_empty) between opening the
        file and locking it leaves a lock on a file no one else will open: then again, on the new one.
        A wait (a build while `cache gc` runs) is said first, once."""
        said = False
        while True:
            if not exclusive:
                self._writing()
            path = self.root / "locks" / "store.lock"
            try:
                handle = open(path, "a+")
            except FileNotFoundError:  # removed just after it was made: make it again
                if exclusive:
                    self.require()
                continue
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            try:
                fcntl.flock(handle, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    handle.close()
                    raise TrtbuildError(f"store {self.root} is in use by a running build; try again when it ends") from None
                if not said:
                    holder = lock_holder(path)
                    say(f"store {self.root}: waiting for {path}" + (f", held by {holder}" if holder else ""))
                    said = True
                fcntl.flock(handle, mode)
            try:
                if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                    return handle
            except FileNotFoundError:
                pass
            handle.close()
            if exclusive:
                self.require()

    def _missing_layout(self) -> list[Path]:
        """What creating the store makes: the topmost missing folder of the root, or, in a folder
        that is there but not a store, the layout entries it lacks."""
        if not self.root.exists():
            top = self.root
            while not top.parent.exists():
                top = top.parent
            return [top]
        return [self.root / name for name in (*{sub.split("/")[0] for sub in LAYOUT}, "index.db", "index.db-wal",
                                                "index.db-shm") if not (self.root / name).exists()]

    def _holds_nothing(self, made: list[Path]) -> bool:
        """Nothing under `made` but what opening and locking a store writes: folders, lock files,
        the stat cache, and the recipe claims under refs/ (no blob, manifest, record, ref,
        checkout, log or report)."""
        for path in (p for top in made for p in (top, *(top.rglob("*") if top.is_dir() else ()))):
            if path.is_dir() and not path.is_symlink():
                continue  # a folder holds nothing by itself
            if self.root not in path.parents:
                return False  # a file beside the store, in a folder made for it: someone else's
            rel = path.relative_to(self.root).parts
            if rel[0] == "locks" or (len(rel) == 1 and rel[0] in ("index.db", "index.db-wal", "index.db-shm")):
                continue
            if len(rel) == 3 and rel[0] == "refs" and rel[2] == ".recipe.json":
                continue
            return False
        return True

    def _discard_if_empty(self, handle, made: list[Path]) -> None:
        """Remove what this process created of the store, when no other process uses the store
        (the shared lock becomes exclusive, or nothing is removed) and it holds nothing stored."""
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return
        try:
            if not self._holds_nothing(made):
                return
            if self._state is not None:
                self._state.close()
                self._state = None
            for path in made:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
        except OSError:
            pass  # an empty store left behind is harmless; the error that brought us here is what counts

    # ---- blobs -----------------------------------------------------------------------------------
    def _blob_file(self, name: str) -> Path:
        """A digest's place in cas/, or a misplaced file named by its path under cas/sha256/."""
        return self.root / "cas" / "sha256" / name if "/" in name else self.blob_path(name)

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).exists()

    def blob_file(self, digest: str) -> Optional[Path]:
        return self.blob_path(digest)

    def put_blob(self, source: Path, digest: str, owned: bool = False, link: bool = False) -> None:
        """Put `source` (whose sha256 is `digest`) into cas/. `owned`: the file is the store's own
        (a stage's output or a pulled blob in tmp/) and the store takes it: it is renamed into cas/,
        so ingest moves no bytes and no second name is left to be removed later (dropping a hard
        link moves the blob's ctime, and the stat cache would re-hash it on every later read).
        `link`: a file of a download cache, which stays where it is: hard-linked. Anything else is
        copied and re-verified. The blob is protected (0444) before its stat cache entry is
        written, so the entry holds the ctime of the protected file and later reads trust it
        without re-hashing (dvc-data's protect() then state.save())."""
        self._storing()
        blob = self.blob_path(digest)
        if blob.exists():
            if self.state.sha256(blob) == digest:
                return
            self.remove_blob(digest)  # a damaged copy: the new bytes replace it
        tmp = self.root / "tmp" / f"blob-{digest[:16]}-{os.getpid()}-{os.urandom(4).hex()}"
        ingest.write_blob(source, digest, blob, tmp, self.state, owned=owned, link=link)

    _add_blob = put_blob

    def open_blob(self, digest: str) -> BinaryIO:
        try:
            return open(self.blob_path(digest), "rb")
        except FileNotFoundError:
            raise CorruptStore(f"blob {digest} is missing from {self.root / 'cas'}") from None

    def verify_blob(self, digest: str, use_state: bool = True) -> None:
        """Raise CorruptStore unless the blob exists and hashes to its name."""
        blob = self.blob_path(digest)
        if not blob.exists():
            raise CorruptStore(f"blob {digest} is missing from {self.root / 'cas'}")
        actual = self.state.sha256(blob) if use_state else file_sha256(blob)
        if actual != digest:
            raise CorruptStore(f"blob {blob} is corrupt: its sha256 is {actual}; run `trtbuild cache verify`")

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
            raise CorruptStore(f"blob {blob} is corrupt: its sha256 is {copied}; run `trtbuild cache verify`")
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
        folder = self.root / "cas" / "sha256"
        if not folder.is_dir():
            return
        for path in sorted(folder.glob("*/*")):
            if not path.is_file():
                continue
            name = path.name if is_digest(path.name) and path.parent.name == path.name[:2] \
                else path.relative_to(folder).as_posix()
            yield name, path.stat().st_size

    def rehash_blob(self, name: str, progress: Progress = None) -> str:
        return self.state.rehash(self._blob_file(name), progress)  # the read refreshes the stat cache

    def remove_blob(self, name: str) -> None:
        path = self._blob_file(name)
        path.unlink(missing_ok=True)
        self.state.forget(path)

    # ---- manifests -------------------------------------------------------------------------------
    def ingest(self, folder: Path, progress: Progress = None, include=None, links_within: Optional[Path] = None,
               link: bool = False) -> Manifest:
        """Store the files of `folder` (those `include` accepts) and their manifest; returns the
        manifest (its digest names the artifact). Files under tmp/ are the store's own: the store
        takes them (they are gone from `folder` afterwards); files of a download cache (`link`) are
        hard-linked and stay; anything else, such as a user's model folder, is copied, hashing
        while copying."""
        manifest = self.ingest_files(folder, progress, include, links_within, link)
        self.put_manifest(manifest)
        return manifest

    def ingest_files(self, folder: Path, progress: Progress = None, include=None, links_within: Optional[Path] = None,
                     link: bool = False) -> Manifest:
        """ingest without storing the manifest: the blobs of `folder`'s files, and the manifest that
        names them, for a caller that stores another manifest holding these entries (an overlay
        stage's artifact: its input's files plus these), so that no manifest is left that nothing
        names (one `cache gc` would remove at once)."""
        self._writing()
        folder = Path(os.path.abspath(folder))
        owned = not link and folder.is_relative_to(self.root / "tmp")
        return ingest.ingest_folder(folder, self.state, self.put_blob, owned, progress, include, links_within, link)

    def put_manifest(self, manifest: Manifest) -> str:
        digest = manifest.digest
        path = self.manifest_path(digest)
        if not path.exists():
            self._storing()
            missing = [e.path for e in manifest.entries if not self.has_blob(e.sha256)]
            if missing:
                raise CorruptStore(f"manifest {digest} names blobs the store lacks: {', '.join(missing[:3])}")
            atomic_write(path, manifest.to_bytes(), 0o444)
        return digest

    def has_manifest(self, digest: str) -> bool:
        return self.manifest_path(digest).exists()

    def get_manifest(self, digest: str) -> Manifest:
        path = self.manifest_path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CorruptStore(f"manifest {digest} is missing from {self.root / 'manifests'}") from None
        if bytes_sha256(data) != digest:
            raise CorruptStore(f"manifest {path} is corrupt or tampered: its content does not hash to its name")
        try:
            return Manifest.from_bytes(data, str(path))
        except BadTree as exc:
            raise CorruptStore(str(exc)) from None

    def manifest_digests(self) -> list[str]:
        return sorted(p.stem for p in (self.root / "manifests").glob("*.json") if is_digest(p.stem))

    # ---- artifacts -------------------------------------------------------------------------------
    def artifact_problem(self, digest: str) -> Optional[str]:
        """Why the artifact cannot be served as it is (manifest missing or tampered, a blob missing,
        of the wrong size or corrupt), or None. Blobs are checked through the stat cache: a blob the
        store wrote and protected is trusted while its stat (ctime included) is unchanged."""
        try:
            manifest = self.get_manifest(digest)
        except CorruptStore as exc:
            return str(exc)
        for entry in manifest.entries:
            blob = self.blob_path(entry.sha256)
            try:
                size = blob.stat().st_size
            except FileNotFoundError:
                return f"blob {entry.sha256} ({entry.path}) is missing from {self.root / 'cas'}"
            if size != entry.size:
                return f"blob {blob} ({entry.path}) has {size} bytes, its manifest says {entry.size}"
            try:
                self.verify_blob(entry.sha256)
            except CorruptStore as exc:
                return str(exc)
        return None

    def put_file_blob(self, path: Path) -> Digest:
        """Store one file (a stage's log) as a blob; returns its digest with its size."""
        digest, size = self.state.sha256(path), path.stat().st_size
        self.put_blob(path, digest, owned=Path(os.path.abspath(path)).is_relative_to(self.root / "tmp"))
        return Digest(hash=digest, size_bytes=size)

    def read_manifest_bytes(self, digest: str) -> bytes:
        return self.manifest_path(digest).read_bytes()

    def remove_manifest(self, digest: str) -> None:
        self.manifest_path(digest).unlink(missing_ok=True)

    # ---- action records --------------------------------------------------------------------------
    def get_record(self, key: str) -> Optional[ActionRecord]:
        """The record under `key`; None when there is none, or only one of an older layout (it is
        rebuilt and replaced). A record that does not parse is a corrupt store."""
        path = self.record_path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return parse_record(key, data, str(path))

    def put_record(self, record: ActionRecord, replace: bool = False) -> ActionRecord:
        """Record key -> artifact. The first artifact stored under a key stays; a later, different
        one is kept as a divergence beside it, never written over it (design.md s.4). `replace`
        (the first one is lost or damaged, or the user asked for --rebuild) makes the new one the
        record, and keeps the old digest among the divergences."""
        key = record.key
        existing = self.get_record(key)
        if existing is None or (replace and existing.digest != record.digest):
            if existing is not None:
                self._note_divergence(key, existing.digest, existing.created)
            atomic_write(self.record_path(key), canonical_json(dump(record)) + b"\n")
            return record
        if existing.digest != record.digest:
            self._note_divergence(key, record.digest, record.created)
        return existing

    def _note_divergence(self, key: str, digest: str, created: str) -> None:
        path = self.root / "ac" / f"{key}.divergent.json"
        seen = json.loads(path.read_text()) if path.exists() else []
        if digest not in {d["digest"] for d in seen}:
            seen.append({"digest": digest, "created": created})
            atomic_write(path, canonical_json(seen) + b"\n")

    def records(self) -> list[ActionRecord]:
        """Every readable record of the current layout (`cache verify` names the others)."""
        out = []
        for path in sorted((self.root / "ac").glob("*.json")):
            if path.name.endswith(".divergent.json"):
                continue
            try:
                record = self.get_record(path.stem)
            except CorruptStore:
                continue
            if record is not None:
                out.append(record)
        return out

    def read_record_bytes(self, key: str) -> bytes:
        return self.record_path(key).read_bytes()

    def record_keys(self) -> list[str]:
        return sorted(p.stem for p in (self.root / "ac").glob("*.json") if not p.name.endswith(".divergent.json"))

    def delete_record(self, key: str) -> None:
        self.record_path(key).unlink(missing_ok=True)
        (self.root / "ac" / f"{key}.divergent.json").unlink(missing_ok=True)

    # ---- refs ------------------------------------------------------------------------------------
    def read_ref(self, recipe: str, target: str) -> Optional[Ref]:
        path = self.ref_path(recipe, target)
        try:
            return Ref.model_validate_json(path.read_bytes(), strict=True)
        except FileNotFoundError:
            return None
        except ValidationError as exc:
            raise CorruptStore(f"ref {path} is malformed ({first_error(exc)}); run `trtbuild cache verify --repair`") from None

    def update_ref(self, recipe: str, target: str, digest: str, key: str) -> None:
        """Point refs/<recipe>/<target> at `digest`, appending to its history. A ref that already
        points there (every ref of a no-op build) is left as it is without taking its lock: a ref
        is replaced whole (atomic_write), so reading one needs no lock."""
        ref = self._ref_to_replace(recipe, target)
        if ref is not None and (ref.digest, ref.key) == (digest, key):
            return
        path = self.ref_path(recipe, target)
        with _file_lock(self.root / "locks" / f"ref-{bytes_sha256(f'{recipe}/{target}'.encode())[:32]}.lock"):
            ref = self._ref_to_replace(recipe, target)  # another build may have moved it meanwhile
            if ref is not None and (ref.digest, ref.key) == (digest, key):
                return
            history = [*(ref.history if ref else []), RefEntry(digest=digest, key=key, time=_now())]
            atomic_write(path, canonical_json(dump(Ref(digest=digest, key=key, history=history))) + b"\n")

    def _ref_to_replace(self, recipe: str, target: str) -> Optional[Ref]:
        try:
            return self.read_ref(recipe, target)
        except CorruptStore:
            return None  # a damaged ref is replaced by the artifact that just passed

    def delete_ref(self, recipe: str, target: str) -> None:
        self.ref_path(recipe, target).unlink(missing_ok=True)

    def refs(self, malformed: Optional[list] = None) -> Iterator[tuple[str, str, Ref]]:
        for path in sorted((self.root / "refs").glob("*/*")):
            if path.name.startswith("."):
                continue
            try:
                ref = Ref.model_validate_json(path.read_bytes(), strict=True)
            except ValidationError as exc:
                if malformed is not None:  # `cache verify` names it
                    malformed.append((path.parent.name, path.name, first_error(exc)))
                continue
            yield path.parent.name, path.name, ref

    def check_claim(self, name: str, identity: str) -> None:
        """Refuse (InvalidInput) a recipe whose name another recipe claimed; write nothing. A build
        checks before it runs anything and claims (claim_recipe) only when it moves refs, so a
        build that stores nothing leaves no claim behind."""
        path = self.root / "refs" / name / ".recipe.json"
        claim = self._read_claim(path, name)
        if claim is not None and claim.identity != identity:
            self._refuse_claim(name, identity, claim, path)

    def claim_recipe(self, name: str, identity: str) -> None:
        """Refs under refs/<name>/ belong to one recipe: the first to build under that name. Another
        recipe with the same `name:` is refused, so it cannot move the first one's refs. A claim is
        written once, whole (atomic_write): it is read without the lock, which only the first
        claim takes."""
        path = self.root / "refs" / name / ".recipe.json"
        claim = self._read_claim(path, name)
        if claim is None:
            with _file_lock(self.root / "locks" / f"claim-{bytes_sha256(name.encode())[:32]}.lock"):
                claim = self._read_claim(path, name)  # another build may have claimed it meanwhile
                if claim is None:
                    atomic_write(path, canonical_json(dump(RecipeClaim(name=name, identity=identity))) + b"\n")
                    return
        if claim.identity != identity:
            self._refuse_claim(name, identity, claim, path)

    def _refuse_claim(self, name: str, identity: str, claim: RecipeClaim, path: Path) -> None:
        raise InvalidInput(f"recipe {identity}: name {name!r} already belongs to {claim.identity} in store "
                           f"{self.root}; give this recipe another `name:` (or remove {path} to hand the name over)")

    @staticmethod
    def _read_claim(path: Path, name: str) -> Optional[RecipeClaim]:
        try:
            return RecipeClaim.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except ValidationError:
            raise CorruptStore(f"{path} is malformed; remove it to let a recipe claim the name {name!r}") from None

    # ---- lock files that pin artifacts (gc roots) ------------------------------------------------
    def embedded_lock_path(self, recipe: str) -> Path:
        return self.root / f"{recipe}.lock"

    def published_lock_path(self, recipe: str) -> Path:
        """The lock `push` last published for `recipe` into this store, for a deploy host that has
        only the recipe (transfer.publish_lock; an S3 store keeps it at locks/<recipe>.lock)."""
        return self.root / "published" / f"{recipe}.lock"

    def publish_lock(self, recipe: str, data: bytes) -> None:
        """Replace the recipe's published lock, whole (atomic_write), registered first as a gc root:
        gc keeps what it names while it is there, and never sees it without its pins."""
        self._writing()
        path = self.published_lock_path(recipe)
        self.register_lockfile(path)
        path.parent.mkdir(exist_ok=True)
        atomic_write(path, data)

    def register_lockfile(self, lock_path: Path) -> None:
        """Remember a lock file written against this store: gc keeps what it names while it exists."""
        self._writing()
        lock_path = Path(os.path.abspath(lock_path))
        root = self.root / "roots" / f"{bytes_sha256(str(lock_path).encode())[:32]}.json"
        body = canonical_json({"lockfile": str(lock_path)}) + b"\n"
        try:  # read, not only stat-ed: a damaged root (cut short, or naming another path) is written again
            if root.read_bytes() == body:
                return
        except FileNotFoundError:
            pass
        atomic_write(root, body)

    def registered_lockfiles(self) -> list[Path]:
        found = []
        for path in sorted((self.root / "roots").glob("*.json")) if (self.root / "roots").exists() else []:
            try:
                found.append(Path(json.loads(path.read_text())["lockfile"]))
            except (ValueError, KeyError):
                continue
        return found

    # ---- housekeeping ----------------------------------------------------------------------------
    def clean_tmp(self, older_than_s: float = 24 * 3600, dry_run: bool = False) -> int:
        """Remove (dry: count) tmp/ entries not touched for `older_than_s`."""
        removed = 0
        now = time.time()
        for path in (self.root / "tmp").iterdir() if (self.root / "tmp").is_dir() else ():
            try:
                if now - path.lstat().st_mtime > older_than_s:
                    if not dry_run:
                        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed
