"""`trtbuild push`: which of a recipe's built targets may be published, with what deploy hosts
need (their validation reports), and why the others may not.

A target is refused, one line each, when the one rule of what a store publishes
(trtbuild/lock/publication.py) holds it back, as the build said (a validation failed or did not run,
`--no-validate` unless --allow-unvalidated, a stand-in made it), and when the local store no
longer has it whole or a stand-in made one of its validations.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from trtbuild.lock import publication
from trtbuild.errors import InvalidInput
from trtbuild.lock.lockfile import LockFile, targets_of
from trtbuild.store.base import Store
from trtbuild.store.transfer import PushItem

UNVALIDATED = publication.UNVALIDATED


@dataclass
class PushPlan:
    items: list[PushItem] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)  # the targets published (their validations go with them)
    refused: list[str] = field(default_factory=list)  # one line per refused target


validations = publication.lock_validations  # (its callers' name for it)


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
        why = publication.lock_verdict(lock, target_id, allow_unvalidated)
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
