"""Moving artifacts between two stores (push, pull) and materializing one into a folder of the
user's, all through the abstract Store interface: a LocalStore -> LocalStore move is the same code
as a move to or from S3.

Publish order, as in a build (design.md s.4): blobs (those the other store lacks), then the
manifest, then the action record (first writer wins), then refs, so nothing ever points at bytes
that are not there yet. Every blob pulled is hashed while it is copied and refused when it does not
hash to its name (Bazel's CAS and Nix's binary caches: verify before use).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol, TypeVar

from trtbuild import fsfaults, interrupt
from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.store.records import ActionRecord
from trtbuild.store import lease
from trtbuild.store.base import CorruptStore, Store
from trtbuild.store.checkout import checkout
from trtbuild.store.hash import CHUNK
from trtbuild.store.tree import Manifest

T, R = TypeVar("T"), TypeVar("R")


class ByteProgress(Protocol):
    """What hears a transfer's bytes (the CLI passes its bar, cli/transferbar.py): the total to
    expect, then each piece as it moves."""

    def expect(self, total: int) -> None: ...

    def advance(self, size: int) -> None: ...


@dataclass
class Moved:
    """What one push or pull did: blobs and bytes actually moved, and first-writer conflicts."""

    blobs: int = 0
    bytes: int = 0
    skipped_blobs: int = 0
    records: int = 0
    refs: int = 0
    divergences: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        return {"blobs": self.blobs, "bytes": self.bytes, "skipped_blobs": self.skipped_blobs,
                "records": self.records, "refs": self.refs, "divergences": self.divergences}


@dataclass(frozen=True)
class PushItem:
    """One artifact to publish: its action record, and the ref (recipe, target) to point at it."""

    record: ActionRecord
    ref: Optional[tuple[str, str]] = None


# ---- push ------------------------------------------------------------------------------------------

def _to_move(manifest: Manifest, present: Callable[[list], list[bool]], moved: Moved, progress=None) -> list:
    """The manifest's distinct blobs that `present` (one answer per entry) says the receiving store
    lacks; the others are counted as skipped, and `progress` is told the bytes to come."""
    entries = list({e.sha256: e for e in manifest.entries}.values())
    missing = [entry for entry, there in zip(entries, present(entries)) if not there]
    moved.skipped_blobs += len(entries) - len(missing)
    if progress is not None:
        progress.expect(sum(e.size for e in missing))
    return missing


def _push_blobs(local: Store, remote: Store, manifest: Manifest, moved: Moved, progress=None) -> None:
    # content-addressed: there means whole (the store verifies its own)
    missing = _to_move(manifest, lambda entries: remote.each(lambda e: remote.has_blob(e.sha256), entries),
                       moved, progress)
    _send_blobs(local, remote, missing, moved, progress)


def _send_blobs(local: Store, remote: Store, missing: list, moved: Moved, progress=None) -> None:
    """Send `missing` (manifest entries: sha256, size) from `local` to `remote`, each verified first."""
    if not missing:
        return
    with local.workspace("staging blobs to push").work_folder("push") as work:
        staged = []
        for entry in missing:
            local.verify_blob(entry.sha256)  # never publish bytes this store no longer vouches for
            source = local.blob_file(entry.sha256)  # read in place: a link made and dropped would move its ctime
            if source is None:
                source = work / entry.sha256
                local.place_blob(entry.sha256, source, False)
            staged.append((source, entry.sha256))
        remote.put_blobs(staged, progress)  # all in flight together (S3: one transfer manager)
        moved.blobs += len(missing)
        moved.bytes += sum(e.size for e in missing)


def push(local: Store, remote: Store, items: list[PushItem], lock: Optional[tuple[str, bytes]] = None,
         progress: Optional[ByteProgress] = None, claim: Optional[tuple[str, str]] = None) -> Moved:
    """Publish each item's artifact, then its record, then its ref; returns what moved. A record
    the remote already holds for the key with another artifact stays there (first writer wins); the
    divergence is reported, and the ref still names the artifact pushed, whose bytes are there.
    `lock` (recipe name, the lock file's bytes) is published last (Store.publish_lock).
    All of it under a push lease (store/lease.py), so a remote `cache gc` never runs meanwhile.
    `progress` hears the bytes of the blobs to send (expect) and of each one sent (advance).
    `claim` (recipe name, recipe identity): made only once the artifacts are there, before the first
    record and ref, so a push stopped earlier leaves no claim (the caller checks it, with
    remote.check_claim, before it opens the store for writing)."""
    remote.create()
    with lease.hold(remote, "push", blocked_by="gc",
                    refusal="cache gc is removing objects; push again when it ends") as held:
        moved = _push_items(local, remote, items, held, progress, claim)
        if lock is not None:
            remote.publish_lock(*lock)
    return moved


def _push_items(local: Store, remote: Store, items: list[PushItem], held, progress=None,
                claim: Optional[tuple[str, str]] = None) -> Moved:
    """Artifacts first (blobs, then manifest, one artifact after another: each transfer uses the
    whole store's concurrency), then every record and its ref; the small requests of different
    items go out together (Store.each), each item's record still before its ref."""
    moved = Moved()
    digests = list(dict.fromkeys(item.record.digest for item in items))
    there = dict(zip(digests, remote.each(remote.has_manifest, digests)))
    for item in items:
        digest = item.record.digest
        manifest = local.get_manifest(digest)
        if not there[digest]:
            _push_blobs(local, remote, manifest, moved, progress)
            remote.put_manifest(manifest)
            there[digest] = True
        else:  # counted for each item, as each one's blobs are there
            moved.skipped_blobs += len({e.sha256 for e in manifest.entries})
        if held is not None:
            held.renew()  # a long push keeps its lease
    for digest in digests:  # measured with the artifact: its measurements and warm-start caches go with it
        _push_measured(local, remote, digest, moved, progress)
        if held is not None:
            held.renew()

    if claim is not None and any(item.ref is not None for item in items):
        remote.claim_recipe(*claim)

    def publish(item: PushItem) -> ActionRecord:
        stored = remote.put_record(item.record)
        if item.ref is not None:
            recipe, target = item.ref
            remote.update_ref(recipe, target, item.record.digest, item.record.key)
        return stored

    for item, stored in zip(items, remote.each(publish, items)):
        record = item.record
        if stored.digest != record.digest:
            moved.divergences.append(
                f"{record.target}: {remote.describe_record(record.key)} already records artifact {stored.digest} "
                f"for key {record.key}; this store's {record.digest} was kept beside it as a divergence, not written "
                "over it")
        else:
            moved.records += 1
        if item.ref is not None:
            moved.refs += 1
    return moved


@dataclass(frozen=True)
class _Entry:
    """A blob to move that no manifest names (a bench record's raw results): as a manifest entry."""

    sha256: str
    size: int
    path: str


def _measured_of(store: Store, digest: str) -> tuple[list, list]:
    """The artifact's bench records and warm-start records in `store`, each checked: a raw-results blob
    or a cache artifact a record names that `store` lacks is an error naming the record, before
    anything moves."""
    bench, warm = store.bench_records(digest), store.warmstart_records(digest)
    for record in bench:
        if not store.has_blob(record.raw.hash):
            raise CorruptStore(f"bench record {store.describe_bench(digest, record.id)}: names raw results blob "
                               f"{record.raw.hash}, which {store.location} lacks; run `trtbuild bench` again")
    for record in warm:
        if not store.has_manifest(record.cache.hash):
            raise CorruptStore(f"warm-start record {store.describe_warmstart(digest, record.key.digest())}: names "
                               f"cache artifact {record.cache.hash}, whose manifest {store.location} lacks")
    return bench, warm


def _push_measured(local: Store, remote: Store, digest: str, moved: Moved, progress=None) -> None:
    """The artifact's measurements and warm-start caches, after the artifact: each record's bytes
    (raw results blob; cache artifact's blobs and manifest) before the record that names them."""
    bench, warm = _measured_of(local, digest)
    raws = list({r.raw.hash: _Entry(r.raw.hash, r.raw.size_bytes, f"raw results of bench record {r.id}")
                 for r in bench}.values())
    missing = [e for e, there in zip(raws, remote.each(lambda e: remote.has_blob(e.sha256), raws)) if not there]
    moved.skipped_blobs += len(raws) - len(missing)
    _send_blobs(local, remote, missing, moved, None)
    for record in warm:
        if not remote.has_manifest(record.cache.hash):
            manifest = local.get_manifest(record.cache.hash)
            _push_blobs(local, remote, manifest, moved, progress)
            remote.put_manifest(manifest)
    bench, warm = _newer(remote, digest, bench, warm)
    remote.each(remote.put_bench, bench)
    remote.each(remote.put_warmstart, warm)


# ---- pull ------------------------------------------------------------------------------------------

def _copy_all_verified(remote: Store, blobs: list[tuple[str, Path]], progress=None) -> list[int]:
    """Copy each remote blob (digest, new file) verified, durable on return; their sizes. A store
    that downloads verified (S3Store.download_blobs: one transfer manager for every blob, each byte
    hashed as it is written) is left to do it: hashing the same bytes again here would cost a
    second pass over every byte pulled."""
    advance = progress.advance if progress is not None else None
    download = getattr(remote, "download_blobs", None)
    if download is not None:
        return download(blobs, advance)  # CorruptStore, naming the blob, when one does not hash
    return [_copy_verified(remote, digest, dest, advance) for digest, dest in blobs]


def _copy_verified(remote: Store, digest: str, dest: Path, advance=None) -> int:
    """Copy the remote blob into `dest`, hashing each byte once as it is read; a blob that does not
    hash to its name is refused, naming it."""
    sha, size = hashlib.sha256(), 0
    with remote.open_blob(digest) as source, open(dest, "wb") as out:
        while True:
            chunk = source.read(CHUNK)
            if not chunk:
                break
            sha.update(chunk)
            out.write(chunk)
            size += len(chunk)
            if advance is not None:
                advance(len(chunk))
        out.flush()
        os.fsync(out.fileno())
    if sha.hexdigest() != digest:
        raise CorruptStore(f"blob {remote.describe_blob(digest)} is corrupt: its content hashes to {sha.hexdigest()}; "
                           "nothing was pulled")
    return size


def _local_has(local: Store, digest: str) -> bool:
    if not local.has_blob(digest):
        return False
    try:
        local.verify_blob(digest)
        return True
    except CorruptStore:
        return False  # a damaged local copy: the pulled bytes replace it


def pull_artifact(remote: Store, local: Store, digest: str, progress: Optional[ByteProgress] = None) -> Moved:
    """Copy the artifact (its manifest's blobs, then the manifest) into `local`, verifying every
    blob before anything names it there. `progress` hears the bytes of the blobs `local` lacks
    (expect, once) and each chunk as it is read (advance)."""
    moved = Moved()
    manifest = remote.get_manifest(digest)  # checked against its digest and for unsafe paths
    local.create()
    missing = _to_move(manifest, lambda entries: [_local_has(local, e.sha256) for e in entries], moved, progress)
    with local.workspace("pulling").work_folder("pull") as work:
        fetched = [(entry.sha256, work / entry.sha256) for entry in missing]
        try:
            moved.bytes += sum(_copy_all_verified(remote, fetched, progress))
        except OSError as exc:  # a full local store: name it, not a file in its tmp/
            if not fsfaults.is_fault(exc):
                raise
            raise fsfaults.at(exc, local.location) from exc
        moved.blobs += len(fetched)
        for blob, staged in fetched:  # only once every blob checked out: a bad one leaves nothing behind
            local.put_blob(staged, blob, owned=True)
        local.put_manifest(manifest)
    return moved


def pull(remote: Store, local: Store, key_or_digest: str, progress: Optional[ByteProgress] = None,
         warm_start: bool = False) -> tuple[str, Moved]:
    """Pull what an action key records (its artifact, then the record), or an artifact by its
    digest, with its serving measurements (and, with `warm_start`, its warm-start caches: tens of MB
    each, of use only to a host that installs one); returns the artifact's digest and what moved."""
    record = remote.get_record(key_or_digest)
    if record is None and not remote.has_manifest(key_or_digest):
        raise TrtbuildError(f"{key_or_digest}: neither an action record nor an artifact in {remote.describe_record(key_or_digest)}")
    digest = record.digest if record is not None else key_or_digest
    moved = pull_artifact(remote, local, digest, progress)
    if record is not None:
        local.put_record(record)
        moved.records += 1
    pull_measured(remote, local, digest, moved, warm_start)
    return digest, moved


def pull_measured(remote: Store, local: Store, digest: str, moved: Optional[Moved] = None,
                  warm_start: bool = True) -> Moved:
    """The artifact's bench records (with their raw results, verified) and, with `warm_start`, its
    warm-start records (with their cache artifacts, verified) from `remote` into `local`: the bytes
    first, then the records."""
    moved = moved if moved is not None else Moved()
    bench, warm = _measured_of(remote, digest)
    warm = warm if warm_start else []
    raws = list({r.raw.hash: r.raw for r in bench}.values())
    missing = [raw for raw in raws if not _local_has(local, raw.hash)]
    moved.skipped_blobs += len(raws) - len(missing)
    if missing:
        with local.workspace("pulling").work_folder("pull") as work:
            fetched = [(raw.hash, work / raw.hash) for raw in missing]
            moved.bytes += sum(_copy_all_verified(remote, fetched))
            moved.blobs += len(fetched)
            for blob, staged in fetched:
                local.put_blob(staged, blob, owned=True)
    for record in warm:
        if not local.has_manifest(record.cache.hash):
            got = pull_artifact(remote, local, record.cache.hash)
            moved.blobs, moved.bytes = moved.blobs + got.blobs, moved.bytes + got.bytes
            moved.skipped_blobs += got.skipped_blobs
    bench, warm = _newer(local, digest, bench, warm)
    for record in bench:
        local.put_bench(record)
    for record in warm:
        local.put_warmstart(record)
    return moved


def _newer(dest: Store, digest: str, bench: list, warm: list) -> tuple[list, list]:
    """The records `dest` lacks, or holds an older run of (same id, earlier `created`): a later run of
    a measurement replaces it, an earlier one never does."""
    if not bench and not warm:
        return [], []
    there = {r.id: r.created for r in dest.bench_records(digest)} if bench else {}
    warm_there = {r.key.digest(): r.created for r in dest.warmstart_records(digest)} if warm else {}
    return ([r for r in bench if r.id not in there or there[r.id] < r.created],
            [r for r in warm if r.key.digest() not in warm_there or warm_there[r.key.digest()] < r.created])


# ---- materialize into a folder of the user's --------------------------------------------------------

def _is_artifact(folder: Path, manifest: Manifest, store: Store) -> bool:
    """`folder` holds exactly the manifest's files with their bytes (read through the stat cache)."""
    listed = {e.path: e for e in manifest.entries}
    found = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink()}
    if found != set(listed):
        return False
    for path, entry in listed.items():
        file = folder / path
        if file.is_symlink() or file.stat().st_size != entry.size or store.state.sha256(file) != entry.sha256:
            return False
    return True


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        pass
    return True


def _start_partial(dest: Path) -> tuple[Path, int]:
    """A new hidden sibling of `dest` to assemble it in, `.NAME.partial-PID-RANDOM`, and the
    descriptor of its lock file beside it (`...partial-PID-RANDOM.lock`), flocked before the folder
    is made and held until the folder is renamed or removed: a killed process's lock is gone with
    it, which is how a later pull knows the folder is no one's (_remove_stale_partials)."""
    while True:
        work = dest.parent / f".{dest.name}.partial-{os.getpid()}-{os.urandom(4).hex()}"
        lock = work.parent / f"{work.name}.lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            ours = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            ours = False
        if ours:
            try:
                work.mkdir()
            except BaseException:
                _end_partial(work, fd)
                raise
            return work, fd
        os.close(fd)  # a cleaner took the lock file for an orphan between its creation and the flock


def _end_partial(work: Path, fd: int) -> None:
    """The folder is renamed into place or removed: its lock file goes, then the lock."""
    try:
        os.unlink(work.parent / f"{work.name}.lock")
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def _remove_stale_partials(dest: Path) -> None:
    """Remove the hidden partial folders of `dest` (and their lock files) left by pulls that were
    killed: those whose lock file no process holds. One without a lock file (an older trtbuild's)
    goes only when the process named by its pid no longer runs. Best effort: a folder that cannot
    be removed stays, and the pull goes on."""
    prefix = f".{dest.name}.partial-"
    try:
        names = os.listdir(dest.parent)
    except OSError:
        return
    for name in sorted({n[:-len(".lock")] if n.endswith(".lock") else n for n in names if n.startswith(prefix)}):
        work, lock = dest.parent / name, dest.parent / f"{name}.lock"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            pid = name[len(prefix):].split("-")[0]
            if work.is_dir() and not work.is_symlink() and pid.isdigit() and not _pid_runs(int(pid)):
                shutil.rmtree(work, ignore_errors=True)
            continue
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: a pull is writing that folder
                continue
            if work.is_dir() and not work.is_symlink():
                shutil.rmtree(work, ignore_errors=True)
            if not (work.exists() or work.is_symlink()):  # the lock file goes last, with its folder gone
                os.unlink(lock)
        except OSError:
            pass
        finally:
            os.close(fd)


def materialize_to(store: Store, digest: str, dest: Path) -> Path:
    """The artifact as the folder `dest`: assembled (verified) in a hidden sibling folder, then
    renamed into place, so a `dest` that exists is complete. An existing `dest` is refused unless it
    already is this artifact. Hidden siblings that killed pulls left are removed first."""
    manifest = store.get_manifest(digest)
    dest = Path(os.path.abspath(dest))
    if dest.exists() or dest.is_symlink():
        if dest.is_dir() and not dest.is_symlink() and _is_artifact(dest, manifest, store):
            _remove_stale_partials(dest)
            return dest
        raise InvalidInput(f"--dest {dest}: already exists and is not artifact {digest}; remove it or pick another folder")
    work, held = None, None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(dest)
        with interrupt.held():  # Ctrl-C between its mkdir and this assignment would leave the folder
            work, held = _start_partial(dest)
        checkout(store, digest, work)
        os.rename(work, dest)
        done, held = held, None
        _end_partial(work, done)
    except OSError as exc:
        _give_up(work, held)
        if dest.exists():  # another process finished first
            if _is_artifact(dest, manifest, store):
                return dest
            raise InvalidInput(f"--dest {dest}: already exists and is not artifact {digest}; remove it or pick another folder") from None
        # a folder that cannot be written is the user's choice of path (2); a full disk is not
        fault = InvalidInput if exc.errno in fsfaults.DENIED else TrtbuildError
        raise fault(f"--dest {dest}: cannot write it ({exc.strerror or exc})") from None
    except BaseException:
        _give_up(work, held)
        raise
    return dest


def _give_up(work: Optional[Path], held: Optional[int]) -> None:
    if work is not None and held is not None:
        shutil.rmtree(work, ignore_errors=True)
        _end_partial(work, held)
