"""`trtbuild push`: which of a recipe's built targets may be published, with what deploy hosts
need (their validation reports), and why the others may not.

A target is refused, one line each, when the one rule of what a store publishes
(trtbuild/lock/publication.py) holds it back, as the build said (a validation failed or did not run,
`--no-validate` unless --allow-unvalidated, a stand-in made it), and when the local store no
longer has it whole or a stand-in made one of its validations.
"""

from __future__ import annotations

import contextlib
import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Optional

from trtbuild.lock import publication, verdict
from trtbuild.errors import InvalidInput
from trtbuild.lock.lockfile import LockFile, targets_of
from trtbuild.store.base import Store
from trtbuild.store.transfer import Moved, PushItem

UNVALIDATED = publication.UNVALIDATED


@dataclass
class PushPlan:
    items: list[PushItem] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)  # the targets published (their validations go with them)
    refused: list[str] = field(default_factory=list)  # one line per refused target


validations = verdict.lock_validations  # (its callers' name for it)


def select(lock: LockFile, patterns: list[str], lock_path: Path) -> list[str]:
    built = [tid for tid, _ in targets_of(lock)]
    if not patterns:
        return built
    chosen = []
    for pattern in patterns:
        matched = [tid for tid in built if fnmatch.fnmatchcase(tid, pattern)]
        if not matched:
            raise InvalidInput(f"--target {pattern}: matches no built target of {lock_path} ({', '.join(built) or 'none'})")
        chosen += [tid for tid in matched if tid not in chosen]
    return chosen


def plan_push(lock: LockFile, lock_path: Path, local: Store, patterns: list[str], allow_unvalidated: bool) -> PushPlan:
    out = PushPlan()
    for target_id in select(lock, patterns, lock_path):
        why = verdict.lock_verdict(lock, target_id, allow_unvalidated)
        if why:  # the build's words (its lock's `held_back`), or the rule on what the lock shows
            unless = " without --allow-unvalidated" if why in publication.OVERRIDABLE else ""
            out.refused.append(f"{target_id}: held back: {why}; not pushed{unless}")
            continue
        checks = validations(lock, target_id)
        items, problem = [], None
        for node_id in [target_id, *checks]:
            problem = _unpushable(lock, lock_path, local, node_id)
            if problem:
                who = "" if node_id == target_id else f"its validation {node_id}: "
                problem = f"{target_id}: {who}{problem}"
                break
            entry = lock.targets[node_id]
            items.append(PushItem(local.get_record(entry.key), (lock.recipe.name, node_id)))
        if problem:
            out.refused.append(problem)
            continue
        out.items += items
        out.targets.append(target_id)
    return out


def _unpushable(lock: LockFile, lock_path: Path, local: Store, node_id: str):
    """Why the node's artifact cannot be published from `local`, or None."""
    entry = lock.targets[node_id]
    record = local.get_record(entry.key)
    if record is None or record.digest != entry.digest:
        return f"not in the local store as {lock_path} records it ({local.describe_record(entry.key)}); build it first"
    damaged = local.artifact_problem(entry.digest)
    if damaged:
        return f"damaged in the local store ({damaged}); rebuild it"
    if record.standin:
        return f"made by a stand-in toolchain ({', '.join(record.standin)}); stand-ins are never pushed"
    return None


# A bar of the bytes moved, labelled (cli.transferbar.bar): opened once something is to move.
ProgressBar = Callable[[str], ContextManager]


def publish(local: Store, remote: Store, plan: PushPlan, recipe: str, identity: str, lock_bytes: bytes,
            progress: Optional[ProgressBar] = None) -> Moved:
    """The one push, of `trtbuild push` and `build --push`: the recipe's claim is checked before
    anything is written, then the plan's items go (transfer.push), then the lock, last (the remote's
    gc keeps what it pins)."""
    from trtbuild.store.transfer import push

    if not plan.items:
        return Moved()
    remote.check_claim(recipe, identity)  # refused before anything is written
    with local.using(), remote.using(), (progress or no_bar)("push") as bar:
        return push(local, remote, plan.items, lock=(recipe, lock_bytes), progress=bar, claim=(recipe, identity))


def no_bar(label: str) -> ContextManager:
    return contextlib.nullcontext()


@dataclass
class Pushed:
    """What `trtbuild push` did: docs/schemas/push.schema.json (as_json)."""

    store: str
    targets: list[str]
    refused: list[str]
    moved: Moved

    def as_json(self) -> dict:
        return {"store": self.store, "pushed": self.targets, "refused": self.refused, "moved": self.moved.as_json()}


def push_recipe(recipe: Optional[Path], store_url: Optional[str], patterns: list[str], allow_unvalidated: bool,
                progress: Optional[ProgressBar] = None) -> Pushed:
    """`trtbuild push`: publish what the last build of RECIPE (None: the embedded demo) made, from
    the local store to --store (else the recipe's publish.store), refusing what plan_push refuses."""
    from trtbuild.deploy.shared import shared_store
    from trtbuild.lock import lockfile
    from trtbuild.recipe.schema import load_recipe_or_demo, recipe_identity
    from trtbuild.store.local import open_store

    if recipe is not None and recipe.suffix == ".lock":  # what `pull` takes; push publishes a recipe's build
        raise InvalidInput(f"{recipe}: a lock file; push takes the recipe it belongs to: {_recipe_of_lock(recipe)}")
    loaded = load_recipe_or_demo(recipe)
    named = "--store" if store_url else f"{recipe}: publish.store"
    store_url = shared_store(store_url, loaded, "push to")
    local = open_store(None)
    remote = open_store(store_url, create=True)
    if getattr(remote, "root", None) == getattr(local, "root", object()):
        raise InvalidInput(f"{named} {store_url}: that is the local store; push to another one")
    lock_path = lockfile.lock_path_for(loaded, local)
    lock = lockfile.read(lock_path)
    if lock is None:
        raise InvalidInput(f"{lock_path}: no lock file; run `{loaded.command('build')}` first")
    if lock.recipe.digest != lockfile.recipe_digest(loaded):
        raise InvalidInput(f"{loaded.path} changed since {lock_path} was written; run `{loaded.command('build')}` first")
    chosen = plan_push(lock, lock_path, local, patterns, allow_unvalidated)
    moved = publish(local, remote, chosen, lock.recipe.name, recipe_identity(loaded), lock_path.read_bytes(), progress)
    return Pushed(store_url, chosen.targets, chosen.refused, moved)


def _recipe_of_lock(lock: Path) -> str:
    """The command that pushes the recipe a lock file belongs to: the recipe beside it, the bare
    command for the embedded demo's (kept in the store as <name>.lock), else RECIPE."""
    from trtbuild.recipe.schema import load_recipe_or_demo

    beside = lock.with_suffix(".yaml")
    if beside.is_file():
        return f"`trtbuild push {beside}`"
    if lock.name == f"{load_recipe_or_demo(None).recipe.name}.lock":
        return "`trtbuild push` (the embedded demo)"
    return "`trtbuild push RECIPE`"
