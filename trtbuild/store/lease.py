"""Leases: how a publish and a remote `cache gc` keep out of each other's way on a shared store,
where no host can hold a lock for another.

A push writes `leases/push-<host>-<pid>-<random>.json` (who, since when, until when) before it
sends anything, renews it after each artifact (at most once a minute), and removes it when it ends,
failed or not. gc refuses while an unexpired push lease exists, naming it; a lease whose holder died simply expires.
gc in turn writes a `gc-...` lease before it deletes, then looks for push leases once more, and a
push that finds a gc lease after writing its own refuses: both write first and read second, so at
least one of two that start together sees the other (S3 reads its writes).

A store with a workspace (a folder) needs none of this: there push holds the store's lock shared
and gc holds it exclusively. Leases are small objects of the store's transport (store/transport.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
from typing import Iterator, Optional

from pydantic import BaseModel, ValidationError

from trtbuild.errors import TrtbuildError
from trtbuild.store import layout
from trtbuild.store.base import Store

TTL_S = 2 * 3600  # renewed after each artifact: one artifact's transfer must fit in it
RENEW_AFTER_S = 60  # a renewal rewrites the lease only when the last write is older: a request saved per artifact


class Lease(BaseModel):
    kind: str  # "push" or "gc"
    host: str
    pid: int
    started: str
    expires: str  # UTC; compared with the reading host's clock

    def expired(self, now: dt.datetime) -> bool:
        return _parse(self.expires) <= now


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _stamp(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)


def supported(store: Store) -> bool:
    """Whether the store is shared without a lock any host could hold (it has no workspace)."""
    return not store.has_workspace


def active(store: Store, kind: str) -> list[tuple[str, Lease]]:
    """(object key relative to the store, lease) of every unexpired lease of `kind`. A lease that
    cannot be read counts as active: nobody can say when it ends."""
    now, found = _now(), []
    for rel, _ in list(store.transport.list(layout.LEASES)):
        name = rel[len(layout.LEASES):]
        if not name.startswith(f"{kind}-") or not name.endswith(".json"):
            continue
        stored = store.transport.get(rel)
        if stored is None:  # removed meanwhile
            continue
        try:
            lease = Lease.model_validate_json(stored.data)
        except ValidationError:
            lease = Lease(kind=kind, host="?", pid=0, started="?", expires="9999-12-31T23:59:59Z")
        if not lease.expired(now):
            found.append((rel, lease))
    return found


def describe(store: Store, rel: str, lease: Lease) -> str:
    return f"lease {store.transport.describe(rel)}, {lease.host} pid {lease.pid}, until {lease.expires}"


class Held:
    """A lease this process wrote; `renew` pushes its expiry out again."""

    def __init__(self, store: Store, kind: str, ttl_s: float) -> None:
        self.store, self.kind, self.ttl_s = store, kind, ttl_s
        host = socket.gethostname() or "host"
        self.rel = layout.lease(f"{kind}-{host}-{os.getpid()}-{os.urandom(4).hex()}.json")
        self.lease = Lease(kind=kind, host=host, pid=os.getpid(), started=_stamp(_now()), expires="")
        self.written: Optional[dt.datetime] = None
        self.renew()

    def renew(self) -> None:
        """Expire `ttl_s` from now; the object is rewritten only when its last write is more than
        RENEW_AFTER_S old (the expiry it holds is then at most that much short of `ttl_s`)."""
        now = _now()
        if self.written is not None and (now - self.written).total_seconds() < RENEW_AFTER_S:
            return
        self.lease.expires = _stamp(now + dt.timedelta(seconds=self.ttl_s))
        self.store.transport.put(self.rel, self.lease.model_dump_json().encode() + b"\n")
        self.written = now

    def release(self) -> None:
        self.store.transport.delete(self.rel)


@contextlib.contextmanager
def hold(store: Store, kind: str, blocked_by: str, refusal: str, ttl_s: float = TTL_S) -> Iterator[Optional[Held]]:
    """Write a `kind` lease, then refuse (TrtbuildError, lease removed) if an unexpired `blocked_by`
    lease exists: "<store>: <refusal> (<that lease>)". Removed on the way out, whatever happened.
    Yields None on a store without leases."""
    if not supported(store):
        yield None
        return
    held = Held(store, kind, ttl_s)
    try:
        others = active(store, blocked_by)
        if others:
            raise TrtbuildError(f"store {store.location}: {refusal} ({describe(store, *others[0])})")
        yield held
    finally:
        held.release()
