"""`cache gc`: remove what nothing needs, in two steps. `roots` names what must stay: the artifact
each ref points at now, every artifact a lock file in use pins (one a build registered in this
store that still exists at its path), and, with `--keep-last N`, the last N artifacts of each ref's
history (without it, every recorded artifact). `select` then applies `--max-size` (the oldest
unprotected records go until the store fits) and gives the live set; `sweep` removes everything
outside it: records, manifests, blobs, checkouts, tmp leftovers and failures of keys built since.
`--dry-run` runs the same sweep, counting instead of removing.

The pins are the caller's (dvc-data's `gc(odb, used)`): what the lock files in use name is read
by the command (cli), which knows lock files; this module knows only the store. On a remote store
(S3) `remote_gc` roots what refs point at now and the pins of every lock file push published
(read by the caller once the gc lease is held), and takes a lease instead of the store lock
(store/lease.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from trtbuild.errors import TrtbuildError
from trtbuild.store import lease
from trtbuild.store.base import Store


@dataclass
class Roots:
    protected: set[str]  # refs' current artifacts and lock-file pins: never removed
    kept: set[str]  # also kept, unless --max-size needs the room: recent history or every record


@dataclass
class Live:
    digests: set[str]  # artifacts whose records, manifests, blobs and checkouts stay
    doomed: list[str]  # keys of the records to drop
    over_budget: bool = False


@dataclass
class GcReport:
    records: list[str] = field(default_factory=list)
    manifests: int = 0
    blobs: int = 0
    bytes_freed: int = 0
    checkouts: int = 0
    tmp: int = 0
    failures: int = 0
    size_after: int = 0
    over_budget: bool = False
    measurements: int = 0  # bench and warm-start records of artifacts removed

    def as_json(self) -> dict:
        return dict(self.__dict__)


def roots(store: Store, pinned: set[str], keep_last: Optional[int] = None) -> Roots:
    refs = list(store.refs())
    protected = set(pinned) | {ref.digest for _, _, ref in refs}
    kept = set(protected)
    if keep_last is None:
        kept |= {r.digest for r in store.records()}
    else:
        for _, _, ref in refs:
            recent: list[str] = []
            for item in reversed(ref.history):
                if item.digest not in recent:
                    recent.append(item.digest)
            kept |= set(recent[:keep_last])
    return Roots(protected, kept)


def _size_of(store: Store, digests: set[str]) -> int:
    seen: dict[str, int] = {}
    for digest in digests:
        if store.has_manifest(digest):
            for entry in store.get_manifest(digest).entries:
                seen[entry.sha256] = entry.size
    return sum(seen.values())


def select(store: Store, found: Roots, max_size: Optional[int] = None) -> Live:
    records = store.records()
    doomed = [r for r in records if r.digest not in found.kept]
    survivors = [r for r in records if r.digest in found.kept]
    over_budget = False
    if max_size is not None:
        survivors.sort(key=lambda r: r.created)
        while _size_of(store, {r.digest for r in survivors} | found.protected) > max_size:
            victim = next((r for r in survivors if r.digest not in found.protected), None)
            if victim is None:
                over_budget = True
                break
            survivors.remove(victim)
            doomed.append(victim)
    live = {r.digest for r in survivors} | found.protected
    return Live(live, sorted(r.key for r in doomed), over_budget)


def sweep(store: Store, live: Live, dry_run: bool = False, named: Optional[Callable[[str], None]] = None) -> GcReport:
    """Remove (or, dry, count) everything outside the live set, and a folder store's leftovers
    (checkouts, tmp/, failures). Needs the store held exclusively (or, remote, a gc lease). `named`
    hears the location of each object removed (or, dry, that would be)."""
    tell = named or (lambda where: None)
    report = GcReport(records=list(live.doomed), over_budget=live.over_budget)
    doomed_measured, raws, caches = _measured(store, live.digests)
    live = Live(live.digests | caches, live.doomed, live.over_budget)  # a kept warm-start record keeps its cache
    for where, remove in doomed_measured:
        report.measurements += 1
        tell(where)
        if not dry_run:
            remove()
    live_blobs: set[str] = set(raws)
    for digest in live.digests:
        if store.has_manifest(digest):
            live_blobs |= {e.sha256 for e in store.get_manifest(digest).entries}
    doomed = set(live.doomed)
    for record in store.records():  # a kept record's logs are blobs of their own, named in its execution
        if record.key not in doomed:
            live_blobs |= {log.hash for log in record.execution.logs.values()}
    for key in live.doomed:
        tell(store.describe_record(key))
        if not dry_run:
            store.delete_record(key)
    for digest in store.manifest_digests():
        if digest not in live.digests:
            report.manifests += 1
            tell(store.describe_manifest(digest))
            if not dry_run:
                store.remove_manifest(digest)
    for name, size in list(store.iter_blobs()):
        if name not in live_blobs:
            report.blobs += 1
            report.bytes_freed += size
            tell(store.describe_blob(name))
            if not dry_run:
                store.remove_blob(name)
    if store.has_workspace:
        _sweep_workspace(store, live, report, dry_run)
    report.size_after = _size_of(store, live.digests)
    return report


def _measured(store: Store, digests: set[str]):
    """([(where, remove)] of the bench and warm-start records of artifacts outside `digests`; the raw
    results blobs and the cache artifacts that the other records name, which stay with them). A record
    that does not parse keeps nothing (`cache verify` names it)."""
    from pydantic import ValidationError

    from trtbuild.store.measurements import BenchRecord, WarmStartRecord
    from trtbuild.store import layout

    doomed, raws, caches = [], set(), set()
    for area, model, delete in ((layout.BENCH, BenchRecord, store.delete_bench),
                                (layout.WARMSTART, WarmStartRecord, store.delete_warmstart)):
        for artifact, record_id, where in store.measured_files(area):
            if artifact not in digests:
                doomed.append((where, lambda d=delete, a=artifact, r=record_id: d(a, r)))
                continue
            try:
                record = model.model_validate_json(store.read_measured(area, artifact, record_id))
            except (ValidationError, ValueError, FileNotFoundError):
                continue
            if isinstance(record, BenchRecord):
                raws.add(record.raw.hash)
            else:
                caches.add(record.cache.hash)
    return doomed, raws, caches


def _sweep_workspace(store: Store, live: Live, report: GcReport, dry_run: bool) -> None:
    """A folder store's own areas: checkouts of artifacts gone, tmp leftovers, failures of keys built since."""
    work = store.workspace()
    for name in work.checkouts():
        if name not in live.digests:
            report.checkouts += 1
            if not dry_run:
                work.remove_checkout(name)
    # No build is running (the store is held exclusively): everything in tmp/ is a leftover.
    report.tmp = work.clean_tmp(older_than_s=0, dry_run=dry_run)
    remaining = set(store.record_keys()) - (set(live.doomed) if dry_run else set())
    for key in work.failures():
        if key in remaining:  # the key has been built since
            report.failures += 1
            if not dry_run:
                work.remove_failure(key)


def gc(store: Store, pinned: set[str], keep_last: Optional[int] = None, max_size: Optional[int] = None,
       dry_run: bool = False) -> GcReport:
    with store.using(exclusive=True, wait=False):
        return sweep(store, select(store, roots(store, pinned, keep_last), max_size), dry_run)


# ---- a remote store (S3): no lock any host could hold, so leases (store/lease.py) -------------------

def remote_gc(store: Store, pins: Callable[[], set[str]], keep_last: Optional[int] = None,
              max_size: Optional[int] = None, dry_run: bool = True, named: Optional[Callable[[str], None]] = None) -> GcReport:
    """gc of a shared store: what each ref points at now (and, with `keep_last`, the last N of its
    history) and `pins()` (every pushed lock file's digests, read by the caller once the lease is
    held: a lock a push published before it is seen) stay; refused while a push holds a lease. A
    real run holds a gc lease itself, so a push that starts meanwhile refuses instead of racing."""
    refusal = "a publish is in flight; cache gc removed nothing"
    if dry_run:
        found = lease.active(store, "push")
        if found:
            raise TrtbuildError(f"store {store.location}: {refusal} ({lease.describe(store, *found[0])})")
        return _remote_sweep(store, pins, keep_last, max_size, True, named)
    with lease.hold(store, "gc", blocked_by="push", refusal=refusal):
        return _remote_sweep(store, pins, keep_last, max_size, False, named)


def _remote_sweep(store: Store, pins, keep_last: Optional[int], max_size: Optional[int], dry_run: bool,
                  named) -> GcReport:
    found = roots(store, pins(), keep_last or 1)  # the last 1 of a ref's history: where it points now
    return sweep(store, select(store, found, max_size), dry_run, named=named)
