"""`cache gc`: remove what nothing needs. Kept, always: the artifact each ref points at now, and
every artifact named by a lock file in use (one that a build registered in this store and that
still exists at its path). `--keep-last N` also drops records outside the last N artifacts of each
ref's history; `--max-size` then drops the oldest unprotected records until the store fits."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import Optional

from trtbuild.store.local import LocalStore


@dataclass
class GcReport:
    records: list[str] = field(default_factory=list)
    manifests: int = 0
    blobs: int = 0
    bytes_freed: int = 0
    checkouts: int = 0
    tmp: int = 0
    size_after: int = 0
    over_budget: bool = False

    def as_json(self) -> dict:
        return dict(self.__dict__)


def gc(store: LocalStore, pinned: set[str], keep_last: Optional[int] = None, max_size: Optional[int] = None,
       dry_run: bool = False) -> GcReport:
    report = GcReport()
    with store.using(exclusive=True, wait=False):
        refs = list(store.refs())
        protected = set(pinned) | {ref.digest for _, _, ref in refs}
        records = store.records()
        keep = set(protected)
        if keep_last is None:
            keep |= {r.digest for r in records}
        else:
            for _, _, ref in refs:
                recent: list[str] = []
                for item in reversed(ref.history):
                    if item.digest not in recent:
                        recent.append(item.digest)
                keep |= set(recent[:keep_last])
        doomed = [r for r in records if r.digest not in keep]

        def size_of(digests: set[str]) -> int:
            seen: dict[str, int] = {}
            for d in digests:
                if store.has_manifest(d):
                    for e in store.get_manifest(d).entries:
                        seen[e.sha256] = e.size
            return sum(seen.values())

        survivors = [r for r in records if r not in doomed]
        if max_size is not None:
            survivors.sort(key=lambda r: r.created)
            while size_of({r.digest for r in survivors} | protected) > max_size:
                victim = next((r for r in survivors if r.digest not in protected), None)
                if victim is None:
                    report.over_budget = True
                    break
                survivors.remove(victim)
                doomed.append(victim)

        live = {r.digest for r in survivors} | protected
        live_blobs: set[str] = set()
        for digest in live:
            if store.has_manifest(digest):
                live_blobs |= {e.sha256 for e in store.get_manifest(digest).entries}

        report.records = sorted(r.key for r in doomed)
        if not dry_run:
            for r in doomed:
                store.delete_record(r.key)
        for digest in store.manifest_digests():
            if digest not in live:
                report.manifests += 1
                if not dry_run:
                    store.manifest_path(digest).unlink(missing_ok=True)
        for blob in (store.root / "cas" / "sha256").glob("*/*"):
            if blob.name not in live_blobs:
                report.blobs += 1
                report.bytes_freed += blob.stat().st_size
                if not dry_run:
                    blob.unlink(missing_ok=True)
                    store.state.forget(blob)
        for checkout in (store.root / "checkouts").iterdir():
            if checkout.name not in live:
                report.checkouts += 1
                if not dry_run:
                    shutil.rmtree(checkout, ignore_errors=True)
        if not dry_run:
            # No build is running (we hold the store exclusively): everything in tmp/ is a leftover.
            report.tmp = store.clean_tmp(older_than_s=0)
            for failure in (store.root / "failed").glob("*") if (store.root / "failed").exists() else ():
                if store.record_path(failure.name).exists():  # the key has been built since
                    shutil.rmtree(failure, ignore_errors=True)
        report.size_after = size_of(live)
    return report
