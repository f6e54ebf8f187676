"""`trtbuild cache gc`: a store's garbage collected (store/gc.py) with the pins its users hold,
which the store itself cannot read: in a folder store, what the lock files builds registered there
name (those that still exist); in an s3:// one, what every lock push published names
(remote_cache.pushed_pins)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from trtbuild.errors import InvalidInput

if TYPE_CHECKING:
    from trtbuild.store.gc import GcReport


@dataclass
class Collected:
    report: GcReport
    location: str
    remote: bool  # an s3:// store: `objects` lists what was (or would be) removed
    dry_run: bool
    objects: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        out = self.report.as_json()
        if self.remote:
            out.update(dry_run=self.dry_run, objects=self.objects)
        return out


def collect_garbage(store_url: Optional[str], keep_last: Optional[int] = None, max_size: Optional[int] = None,
                    dry_run: bool = False, yes: bool = False) -> Collected:
    """On s3:// a dry run unless `yes` (and both at once is one line); a folder store as asked."""
    from trtbuild.deploy.remote_cache import pushed_pins
    from trtbuild.lock import lockfile
    from trtbuild.store.gc import gc, remote_gc
    from trtbuild.store.local import open_store

    store = open_store(store_url, create=False)
    if store.location.startswith("s3://"):
        if dry_run and yes:
            raise InvalidInput("--dry-run and --yes: pick one")
        collected = Collected(None, store.location, remote=True, dry_run=not yes)
        collected.report = remote_gc(store, lambda: pushed_pins(store), keep_last=keep_last, max_size=max_size,
                                     dry_run=collected.dry_run, named=collected.objects.append)
        return collected
    pinned: set[str] = set()
    for path in store.workspace().registered_lockfiles():
        if path.exists():
            pinned |= lockfile.digests(path)
    return Collected(gc(store, pinned, keep_last=keep_last, max_size=max_size, dry_run=dry_run), store.location,
                     remote=False, dry_run=dry_run)
