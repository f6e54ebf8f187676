"""The store: one cache layer over a transport (store/transport.py: a folder, or S3), and, for a
folder store only, its workspace (store/workspace.py).

The policy lives here once, for every backend: blobs before the manifest that names them, the
manifest before the action record, the record before the ref; the first artifact recorded under a
key wins and a different one is kept beside it as a divergence; a ref moves by compare-and-swap and
keeps its history; refs under a recipe name belong to the first recipe that claimed it. The
transport gives the conditional writes this needs (put_if_absent, put_if_match). Callers never
build paths inside a store (store/layout.py does): they ask it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterator, Optional, TypeVar

from pydantic import ValidationError

from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.keys import canonical_json
from trtbuild.store import layout
from trtbuild.store.errors import CorruptStore, NoWorkspace  # noqa: F401 (what callers catch, named with the store)
from trtbuild.store.records import ActionRecord, Digest, RecipeClaim, Ref, RefEntry, dump, first_error, format_utc, \
    parse_record, utc_now
from trtbuild.store.hash import Progress, bytes_sha256, is_digest
from trtbuild.store.state import StatCache
from trtbuild.store.transport import CONFLICT_RETRIES, Found, Transport
from trtbuild.store.tree import BadTree, Manifest

if TYPE_CHECKING:
    from trtbuild.store.workspace import Workspace

T, R = TypeVar("T"), TypeVar("R")


def _json_line(value) -> bytes:
    return canonical_json(value) + b"\n"


def _backoff(attempt: int) -> None:
    time.sleep(random.uniform(0, min(0.5, 0.01 * 2 ** min(attempt, 6))))


class Store:
    """A store: its transport (where the bytes live) and, on a folder, its workspace."""

    def __init__(self, transport: Transport, workspace: Optional[Workspace] = None) -> None:
        self.transport = transport
        self._workspace = workspace

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location})"

    @property
    def location(self) -> str:
        """How messages name the store: its folder, or its s3:// URL."""
        return self.transport.location

    @property
    def state(self) -> StatCache:
        """The stat cache the store's own reads go through (and stages hash their inputs with)."""
        return self.transport.state

    @property
    def requests_at_once(self) -> int:
        return self.transport.requests_at_once

    def each(self, work: Callable[[T], R], things: list[T]) -> list[R]:
        """`work` over `things`, results in order: requests_at_once at a time (a remote's round trips)."""
        workers = min(self.requests_at_once, len(things))
        if workers <= 1:
            return [work(thing) for thing in things]
        with ThreadPoolExecutor(workers, thread_name_prefix="trtbuild-request") as pool:
            return list(pool.map(work, things))

    # ---- life and workspace ------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.transport.exists()

    def require(self) -> None:
        """Refuse, in one line, a store that nothing was ever stored into."""
        if not self.exists():
            raise InvalidInput(self.transport.missing())

    def create(self) -> None:
        self.transport.create()

    @property
    def has_workspace(self) -> bool:
        return self._workspace is not None

    def workspace(self, operation: str = "a local work area") -> Workspace:
        """This store's workspace; NoWorkspace ("<store>: <operation> needs a local store") on S3."""
        if self._workspace is None:
            raise NoWorkspace(f"{self.location}: {operation} needs a local store")
        return self._workspace

    def using(self, exclusive: bool = False, wait: bool = True, say=None) -> contextlib.AbstractContextManager:
        """Builds hold a folder store shared (and create it); `cache gc` and repair hold it
        exclusive. A store without a workspace has no lock to hold: its bucket is checked once."""
        if self._workspace is not None:
            return self._workspace.using(exclusive, wait, say)
        if exclusive:
            raise NoWorkspace(f"{self.location}: exclusive use (cache gc, repair) needs a local store")
        self.create()
        return contextlib.nullcontext()

    def verify_hint(self) -> str:
        return self.transport.verify_hint()

    # ---- blobs (the transport's) --------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        return self.transport.has_blob(digest)

    def put_blob(self, source: Path, digest: str, owned: bool = False, link: bool = False) -> None:
        self.transport.put_blob(source, digest, owned, link)

    def put_blobs(self, sources: list[tuple[Path, str]], progress=None) -> None:
        self.transport.put_blobs(sources, progress)

    def blob_file(self, digest: str) -> Optional[Path]:
        return self.transport.blob_file(digest)

    def open_blob(self, digest: str) -> BinaryIO:
        return self.transport.open_blob(digest)

    def verify_blob(self, digest: str, use_state: bool = True) -> None:
        self.transport.verify_blob(digest, use_state)

    def place_blob(self, digest: str, dest: Path, executable: bool) -> None:
        self.transport.place_blob(digest, dest, executable)

    def iter_blobs(self) -> Iterator[tuple[str, int]]:
        return self.transport.iter_blobs()

    def rehash_blob(self, name: str, progress: Progress = None) -> str:
        return self.transport.rehash_blob(name, progress)

    def remove_blob(self, name: str) -> None:
        self.transport.remove_blob(name)

    def describe_blob(self, name: str) -> str:
        return self.transport.describe(layout.blob(name))

    def put_file_blob(self, path: Path) -> Digest:
        """Store one file (a stage's log) as a blob; its digest with its size."""
        digest, size = self.state.sha256(path), Path(path).stat().st_size
        owned = self._workspace is not None and self._workspace.folder.owns(path)
        self.put_blob(Path(path), digest, owned=owned)
        return Digest(hash=digest, size_bytes=size)

    # ---- manifests -----------------------------------------------------------------------------------
    def ingest(self, folder: Path, progress: Progress = None, include=None, links_within: Optional[Path] = None,
               link: bool = False) -> Manifest:
        """Store a folder's files and their manifest; returns the manifest (its digest names the artifact)."""
        manifest = self.ingest_files(folder, progress, include, links_within, link)
        self.put_manifest(manifest)
        return manifest

    def ingest_files(self, folder: Path, progress: Progress = None, include=None,
                     links_within: Optional[Path] = None, link: bool = False) -> Manifest:
        """ingest without storing the manifest (an overlay stage stores another one holding these entries)."""
        return self.transport.ingest_files(folder, progress, include, links_within, link)

    def put_manifest(self, manifest: Manifest) -> str:
        """Written after its blobs (checked: a manifest never names missing bytes), once."""
        digest, rel = manifest.digest, layout.manifest(manifest.digest)
        if self.transport.has(rel):
            return digest
        present = self.each(self.has_blob, [e.sha256 for e in manifest.entries])
        missing = [e.path for e, there in zip(manifest.entries, present) if not there]
        if missing:
            raise CorruptStore(f"manifest {digest} names blobs the store lacks: {', '.join(missing[:3])}")
        self.transport.put_if_absent(rel, manifest.to_bytes())
        return digest

    def has_manifest(self, digest: str) -> bool:
        return self.transport.has(layout.manifest(digest))

    def get_manifest(self, digest: str) -> Manifest:
        """The manifest, checked against its digest (CorruptStore when missing or tampered)."""
        rel = layout.manifest(digest)
        found = self.transport.get(rel)
        if found is None:
            raise CorruptStore(f"manifest {digest} is missing from {self.transport.describe(layout.MANIFESTS[:-1])}")
        if bytes_sha256(found.data) != digest:
            raise CorruptStore(f"manifest {self.transport.describe(rel)} is corrupt or tampered: its content does not "
                               "hash to its name")
        try:
            return Manifest.from_bytes(found.data, self.transport.describe(rel))
        except BadTree as exc:
            raise CorruptStore(str(exc)) from None

    def manifest_digests(self) -> list[str]:
        names = (layout.manifest_digest(rel) for rel, _ in self.transport.list(layout.MANIFESTS))
        return sorted(name for name in names if name is not None and is_digest(name))

    def read_manifest_bytes(self, digest: str) -> bytes:
        """The stored bytes as they are, unchecked (for verify)."""
        return self._read(layout.manifest(digest))

    def remove_manifest(self, digest: str) -> None:
        self.transport.delete(layout.manifest(digest))

    def describe_manifest(self, digest: str) -> str:
        return self.transport.describe(layout.manifest(digest))

    def artifact_problem(self, digest: str) -> Optional[str]:
        """Why the artifact cannot be served as it is (a missing or tampered manifest, a blob
        missing, of the wrong size or known corrupt), or None."""
        try:
            manifest = self.get_manifest(digest)
        except CorruptStore as exc:
            return str(exc)
        problems = self.each(lambda e: self.transport.blob_problem(e.sha256, e.size, e.path), manifest.entries)
        return next((p for p in problems if p is not None), None)

    def _read(self, rel: str) -> bytes:
        found = self.transport.get(rel)
        if found is None:
            raise FileNotFoundError(self.transport.describe(rel))
        return found.data

    # ---- conditional writes --------------------------------------------------------------------------
    def _settle(self, rel: str, decide: Callable[[Optional[Found]], Optional[bytes]], lost: str) -> None:
        """Read `rel`, ask `decide` what it should hold (None: leave it), write that conditionally on
        what was read; a write another writer beat is decided again on a fresh read."""
        for attempt in range(CONFLICT_RETRIES):
            found = self.transport.get(rel)
            data = decide(found)
            if data is None:
                return
            written = self.transport.put_if_match(rel, data, found.tag) if found is not None \
                else self.transport.put_if_absent(rel, data)
            if written:
                return
            _backoff(attempt)
        raise TrtbuildError(f"{self.transport.describe(rel)}: {lost}")

    # ---- action records ------------------------------------------------------------------------------
    def get_record(self, key: str) -> Optional[ActionRecord]:
        """The record under `key`; None when there is none, or only one of an older layout (it is
        rebuilt and replaced). A record that does not parse is a corrupt store."""
        found = self.transport.get(layout.record(key))
        return None if found is None else parse_record(key, found.data, self.describe_record(key))

    def put_record(self, record: ActionRecord, replace: bool = False) -> ActionRecord:
        """Record key -> artifact. The first artifact stored under a key stays; a later, different
        one is kept as a divergence beside it, never written over it (design.md s.4); the stored
        record is returned. `replace` (the first one is lost or damaged, or --rebuild) makes the
        new one the record, keeping the old digest among the divergences."""
        key, body = record.key, _json_line(dump(record))
        kept: list[ActionRecord] = []

        def decide(found: Optional[Found]) -> Optional[bytes]:
            kept.clear()
            existing = None
            if found is not None:
                try:
                    existing = parse_record(key, found.data, self.describe_record(key))
                except CorruptStore:
                    if not replace:
                        raise
            if existing is not None and (existing.digest == record.digest or not replace):
                if existing.digest != record.digest:
                    self._note_divergence(key, record.digest, record.created)
                kept.append(existing)
                return None
            if existing is not None:
                self._note_divergence(key, existing.digest, existing.created)
            return body

        self._settle(layout.record(key), decide, f"kept changing during {CONFLICT_RETRIES} attempts to write it")
        return kept[0] if kept else record

    def _note_divergence(self, key: str, digest: str, created: dt.datetime) -> None:
        def decide(found: Optional[Found]) -> Optional[bytes]:
            seen = json.loads(found.data) if found is not None else []
            if digest in {d["digest"] for d in seen}:
                return None
            return _json_line([*seen, {"digest": digest, "created": format_utc(created)}])

        self._settle(layout.divergence(key), decide, f"kept changing during {CONFLICT_RETRIES} attempts to write it")

    def divergences(self, key: str) -> list[dict]:
        """The other artifacts recorded for `key` ({digest, created}, in the order they came)."""
        found = self.transport.get(layout.divergence(key))
        return json.loads(found.data) if found is not None else []

    def record_keys(self) -> list[str]:
        """Every key with a record, readable or not (verify names the unreadable ones)."""
        keys = (layout.record_key(rel) for rel, _ in self.transport.list(layout.AC))
        return sorted(key for key in keys if key is not None)

    def records(self) -> list[ActionRecord]:
        """Every readable record of the current layout (`cache verify` names the others)."""
        out = []
        for key in self.record_keys():
            try:
                record = self.get_record(key)
            except CorruptStore:
                continue
            if record is not None:
                out.append(record)
        return out

    def read_record_bytes(self, key: str) -> bytes:
        """The stored record as it is, unchecked (for verify)."""
        return self._read(layout.record(key))

    def delete_record(self, key: str) -> None:
        self.transport.delete(layout.record(key))
        self.transport.delete(layout.divergence(key))

    def describe_record(self, key: str) -> str:
        return self.transport.describe(layout.record(key))

    # ---- measurements and warm-start caches (trtbuild/store/measurements.py) ------------------------------
    def put_bench(self, record) -> None:
        """Store a serving measurement beside its artifact; a later run of the same measurement (same id)
        replaces it."""
        self.transport.put(layout.bench_record(record.artifact.hash, record.id), _json_line(dump(record)))

    def bench_records(self, artifact: Optional[str] = None) -> list:
        """The measurements of `artifact` (of every artifact when None), oldest first. One that does not
        parse is a corrupt store, named."""
        from trtbuild.store.measurements import BenchRecord, parse_model

        prefix = layout.BENCH + (f"{artifact}/" if artifact is not None else "")
        out = []
        for rel, _ in self.transport.list(prefix):
            if layout.measured_of(rel, layout.BENCH) is None:
                continue
            out.append(parse_model(BenchRecord, self._read(rel), self.transport.describe(rel), "bench record"))
        return sorted(out, key=lambda r: (r.created, r.id))

    def delete_bench(self, artifact: str, measurement: str) -> None:
        self.transport.delete(layout.bench_record(artifact, measurement))

    def describe_bench(self, artifact: str, measurement: str) -> str:
        return self.transport.describe(layout.bench_record(artifact, measurement))

    def measured_files(self, area: str) -> list[tuple[str, str, str]]:
        """(artifact, record id, where) of every file under bench/ or warmstart/ (`area`: layout.BENCH or
        layout.WARMSTART), parsed or not: gc and verify judge each one by its name."""
        out = []
        for rel, _ in self.transport.list(area):
            named = layout.measured_of(rel, area)
            if named is not None:
                out.append((*named, self.transport.describe(rel)))
        return sorted(out)

    def read_measured(self, area: str, artifact: str, record_id: str) -> bytes:
        """A bench/ or warmstart/ record's bytes as stored, unchecked (for verify)."""
        rel = layout.bench_record(artifact, record_id) if area == layout.BENCH else \
            layout.warmstart_record(artifact, record_id)
        return self._read(rel)

    def put_warmstart(self, record) -> None:
        self.transport.put(layout.warmstart_record(record.key.artifact, record.key.digest()), _json_line(dump(record)))

    def warmstart_records(self, artifact: Optional[str] = None) -> list:
        """The warm-start caches captured on `artifact` (on every artifact when None), oldest first."""
        from trtbuild.store.measurements import WarmStartRecord, parse_model

        prefix = layout.WARMSTART + (f"{artifact}/" if artifact is not None else "")
        out = []
        for rel, _ in self.transport.list(prefix):
            if layout.measured_of(rel, layout.WARMSTART) is None:
                continue
            out.append(parse_model(WarmStartRecord, self._read(rel), self.transport.describe(rel), "warm-start record"))
        return sorted(out, key=lambda r: (r.created, r.key.digest()))

    def delete_warmstart(self, artifact: str, key_digest: str) -> None:
        self.transport.delete(layout.warmstart_record(artifact, key_digest))

    def describe_warmstart(self, artifact: str, key_digest: str) -> str:
        return self.transport.describe(layout.warmstart_record(artifact, key_digest))

    # ---- refs ------------------------------------------------------------------------------------------
    def _parse_ref(self, recipe: str, target: str, data: bytes) -> Ref:
        try:
            return Ref.model_validate_json(data, strict=True)
        except ValidationError as exc:
            raise CorruptStore(f"ref {self.describe_ref(recipe, target)} is malformed ({first_error(exc)}); "
                               "run `trtbuild cache verify --repair`") from None

    def read_ref(self, recipe: str, target: str) -> Optional[Ref]:
        found = self.transport.get(layout.ref(recipe, target))
        return None if found is None else self._parse_ref(recipe, target, found.data)

    def update_ref(self, recipe: str, target: str, digest: str, key: str) -> None:
        """Point the ref at `digest`, appending to its history, by compare-and-swap on what was
        read (another writer's move is read again and kept). A ref already there (every ref of a
        no-op build) is not written; a damaged one is replaced by the artifact that just passed."""
        def decide(found: Optional[Found]) -> Optional[bytes]:
            ref = None
            if found is not None:
                with contextlib.suppress(CorruptStore):
                    ref = self._parse_ref(recipe, target, found.data)
            if ref is not None and (ref.digest, ref.key) == (digest, key):
                return None
            history = [*(ref.history if ref else []), RefEntry(digest=digest, key=key, time=utc_now())]
            return _json_line(dump(Ref(digest=digest, key=key, history=history)))

        self._settle(layout.ref(recipe, target), decide,
                     f"other jobs moved it {CONFLICT_RETRIES} times in a row; try again")

    def refs(self, malformed: Optional[list] = None) -> Iterator[tuple[str, str, Ref]]:
        """Every ref that parses; one that does not is skipped, or appended to `malformed` as
        (recipe, target, why) for `cache verify` to name."""
        for rel, _ in list(self.transport.list(layout.REFS)):
            named = layout.ref_of(rel)
            found = self.transport.get(rel) if named is not None else None
            if found is None:
                continue
            try:
                ref = Ref.model_validate_json(found.data, strict=True)
            except ValidationError as exc:
                if malformed is not None:
                    malformed.append((*named, first_error(exc)))
                continue
            yield named[0], named[1], ref

    def delete_ref(self, recipe: str, target: str) -> None:
        self.transport.delete(layout.ref(recipe, target))

    def describe_ref(self, recipe: str, target: str) -> str:
        return self.transport.describe(layout.ref(recipe, target))

    # ---- recipe claims -----------------------------------------------------------------------------------
    def check_claim(self, name: str, identity: str) -> None:
        """claim_recipe's refusal, writing nothing: checked before a command writes anything, the
        claim itself made only just before its first ref, so a command stopped earlier leaves none."""
        found = self.transport.get(layout.claim(name))
        if found is not None:
            self._judge_claim(found.data, name, identity)

    def claim_recipe(self, name: str, identity: str) -> None:
        """Refs under refs/<name>/ belong to one recipe: the first to claim the name (written once,
        whole, if absent). Another recipe with the same `name:` is refused (InvalidInput), so it
        cannot move the first one's refs."""
        def decide(found: Optional[Found]) -> Optional[bytes]:
            if found is not None:
                self._judge_claim(found.data, name, identity)
                return None
            return _json_line(dump(RecipeClaim(name=name, identity=identity)))

        self._settle(layout.claim(name), decide, f"kept changing during {CONFLICT_RETRIES} attempts to write it")

    def _judge_claim(self, data: bytes, name: str, identity: str) -> None:
        where = self.transport.describe(layout.claim(name))
        try:
            claim = RecipeClaim.model_validate_json(data)
        except ValidationError:
            raise CorruptStore(f"{where} is malformed; remove it to let a recipe claim the name {name!r}") from None
        if claim.identity != identity:
            raise InvalidInput(f"recipe {identity}: name {name!r} already belongs to {claim.identity} in store "
                               f"{self.location}; give this recipe another `name:` (or remove {where} to hand the "
                               "name over)")

    # ---- published lock files ------------------------------------------------------------------------------
    def published_lock(self, recipe: str) -> tuple[str, Optional[bytes]]:
        """Where push publishes the recipe's newest lock here, and its bytes (None: none yet). Read
        on every call, never kept: the next push replaces it."""
        if self._workspace is not None:
            path = self._workspace.published_lock_path(recipe)
            try:
                return str(path), path.read_bytes()
            except FileNotFoundError:
                return str(path), None
        found = self.transport.get(layout.pushed_lock(recipe))
        return self.transport.describe(layout.pushed_lock(recipe)), None if found is None else found.data

    def publish_lock(self, recipe: str, data: bytes) -> None:
        """The lock a push's targets come from, for deploy hosts that have only the recipe. A folder
        store keeps the newest, registered as a gc root; a shared one keeps every one under its
        sha256 (remote gc keeps what each pins: written first, so the pins never lapse), then the newest."""
        if self._workspace is not None:
            self._workspace.publish_lock(recipe, data)
            return
        self.transport.put(layout.kept_pushed_lock(recipe, bytes_sha256(data)), data)
        self.transport.put(layout.pushed_lock(recipe), data)

    def pushed_locks(self) -> Iterator[tuple[str, bytes]]:
        """(where, bytes) of every lock file push published to this shared store (gc's pins)."""
        for rel, _ in list(self.transport.list(layout.PUSHED_LOCKS)):
            found = self.transport.get(rel) if rel.endswith(".lock") else None
            if found is not None:
                yield self.transport.describe(rel), found.data
