"""`trtbuild build --store s3://...`: the local store in front of a remote one, as a read-through
cache (Bazel's remote action cache, Nix's binary caches: verify before use), and `build --push`.

A key the local store misses is looked up in the remote's action cache; its artifact is pulled into
the local store with every blob verified (transfer.pull_artifact) and only then recorded there, so
the runner sees an ordinary local hit. A remote artifact that does not verify is never served: the
lookup says so and the key is built here like any miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from trtbuild.errors import InvalidInput
from trtbuild.store.base import CorruptStore, Store

# The transfer and publishing code is imported by what moves artifacts: every build imports this
# module (require_remote), and a build without a remote store moves none.
if TYPE_CHECKING:
    from trtbuild.builder.graph import Graph
    from trtbuild.lock.lockfile import LockFile
    from trtbuild.deploy.push import PushPlan
    from trtbuild.store.records import ActionRecord
    from trtbuild.store.transfer import Moved
    from trtbuild.builder.pipeline import BuildOutcome, BuildRequest


@dataclass
class Pulled:
    """What one lookup found in the remote: the record it pulled (with what moved), or why not."""

    record: Optional[ActionRecord] = None  # now in the local store
    moved: Optional[Moved] = None
    note: Optional[str] = None  # the remote has the key but its artifact is damaged: not used


@dataclass
class RemoteCache:
    store: Store

    @property
    def location(self) -> str:
        return self.store.location

    def fetch(self, local: Store, key: str, replace: bool) -> Pulled:
        """Pull what the remote records under `key` into `local` (verified), or say why not.
        `replace`: the local store's record of the key is damaged; the pulled one takes its place."""
        try:
            record = self.store.get_record(key)
        except CorruptStore as exc:  # a malformed record in the bucket is a miss, not a failed node
            return Pulled(note=f"not pulled from {self.location}: {exc}")
        if record is None:
            return Pulled()
        from trtbuild.store.transfer import pull_artifact

        try:
            moved = pull_artifact(self.store, local, record.digest)
        except CorruptStore as exc:  # nothing was recorded locally: the key is built here instead
            return Pulled(note=f"not pulled from {self.location}: its artifact is damaged there ({exc})")
        return Pulled(local.put_record(record, replace=replace), moved)


# ---- build --push ------------------------------------------------------------------------------------

def plan_build_push(graph: Graph, lock: LockFile, lock_path, local: Store, patterns: list[str],
                    allow_unvalidated: bool) -> PushPlan:
    """What `trtbuild push` would take (targets and their validations, with its refusals), plus the
    nodes those targets were built from (source, calibration, quantized, reference), so that
    another builder's `--store s3://...` finds every step and builds nothing. An input a stand-in
    made is never pushed either."""
    from trtbuild.deploy.push import plan_push
    from trtbuild.store.transfer import PushItem

    chosen = plan_push(lock, lock_path, local, patterns, allow_unvalidated)
    taken = {item.ref[1] for item in chosen.items}
    needed = graph.closure(set(chosen.targets)).nodes if chosen.targets else []
    extra: list[PushItem] = []
    for node in needed:
        entry = lock.targets.get(node.id)
        if node.id in taken or entry is None:
            continue
        record = local.get_record(entry.key)
        if record is None or record.digest != entry.digest or record.standin or local.artifact_problem(entry.digest):
            continue  # its targets' own checks already named what matters; an input is pushed only whole
        extra.append(PushItem(record, (lock.recipe.name, node.id)))
    chosen.items = extra + chosen.items  # inputs first: a ref never names a target whose inputs are missing
    return chosen


def require_remote(url: Optional[str], push_asked: bool) -> None:
    if push_asked and not (url or "").startswith("s3://"):
        raise InvalidInput("--push: needs a remote store to publish to (--store s3://BUCKET/PREFIX, or the recipe's "
                           "`publish.store`)")


def publish_build(outcome, loaded, local: Store, remote: Store, patterns: list[str], allow_unvalidated: bool) -> dict:
    """`build --push`: publish what the build's lock names (the refusals of `trtbuild push`)."""
    from trtbuild.lock import lockfile
    from trtbuild.deploy.push import PushPlan, publish
    from trtbuild.recipe.schema import recipe_identity
    from trtbuild.store.transfer import Moved

    lock = lockfile.read(outcome.lock_path) if outcome.lock_path is not None else None
    if lock is None:  # nothing was built or cached: nothing to publish
        plan, moved = PushPlan(), Moved()
    else:
        plan = plan_build_push(outcome.graph, lock, outcome.lock_path, local, patterns, allow_unvalidated)
        moved = publish(local, remote, plan, lock.recipe.name, recipe_identity(loaded), outcome.lock_path.read_bytes())
    return {"store": remote.location, "pushed": plan.targets, "refused": plan.refused, "moved": moved.as_json()}


def build_and_publish(recipe, store_url: Optional[str], request: BuildRequest, reporter, push_after: bool = False,
                      allow_unvalidated: bool = False) -> BuildOutcome:
    """`trtbuild build`: RECIPE (None: the embedded demo) built into --store; an s3:// store (or
    publish.store) is a remote behind the local store, read when the local store misses; with
    `push_after`, what the build made is then published there (`outcome.pushed`)."""
    from trtbuild.builder.pipeline import build
    from trtbuild.recipe.schema import load_recipe_or_demo
    from trtbuild.store import configured
    from trtbuild.store.local import open_store

    loaded = load_recipe_or_demo(recipe)
    store_url, remote_url = configured.build_remote(store_url, loaded, push_after)
    require_remote(remote_url, push_after)
    remote = None
    if remote_url:  # the local store in front of the remote one
        remote = open_store(remote_url, create=True)
        remote.create()  # credentials, bucket, endpoint: one line now, not after the first stage
        store = open_store(None, create=True)
    else:
        store = open_store(store_url, create=True)  # created by the build's first write, not here
    outcome = build(loaded, store, request, reporter, remote=RemoteCache(remote) if remote else None)
    if push_after:
        outcome.pushed = publish_build(outcome, loaded, store, remote, request.targets, allow_unvalidated)
    return outcome


def pushed_pins(store: Store) -> set[str]:
    """Every artifact any lock file push published to the shared `store` names (its pins for
    remote `cache gc`): each push keeps its lock at locks/<recipe>/<sha256>.lock, so a newer push
    of a recipe does not release what an older lock, still in use on some deploy host, pins. One
    that cannot be read stops gc: what it pins is unknown."""
    import yaml
    from pydantic import ValidationError

    from trtbuild.errors import TrtbuildError
    from trtbuild.lock.lockfile import LockFile

    pinned: set[str] = set()
    for where, data in store.pushed_locks():
        try:
            pinned |= LockFile.model_validate(yaml.safe_load(data)).digests()
        except (yaml.YAMLError, ValidationError, TypeError, ValueError):
            raise TrtbuildError(f"{where}: not a trtbuild lock file; cache gc removed nothing "
                                "(what it pins is unknown): push that recipe again or remove it") from None
    return pinned
