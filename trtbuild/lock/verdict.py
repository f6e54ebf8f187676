"""The publication rule (publication.held_back) applied to a target of a lock file: what push, pull
and `pull --target auto` read, word for word what the build recorded."""

from __future__ import annotations

from typing import Optional

from trtbuild.lock.lockfile import LockFile
from trtbuild.lock.publication import FAILED, OVERRIDABLE, PASSED, UNVALIDATED, Check, held_back, validation_ids


def lock_validations(lock: LockFile, target_id: str) -> list[str]:
    """The lock's validations of a target: its own, and for an engine its checkpoint's."""
    target = lock.targets[target_id]
    sm = target.platform.sm if target.platform is not None else None
    return [v for v in validation_ids(target_id, target.stage, sm) if v in lock.targets]


def lock_verdict(lock: LockFile, target_id: str, allow_unvalidated: bool = False) -> Optional[str]:
    """held_back for a target of a lock: what the build recorded (it knew what did not run), else
    the rule on what the lock shows."""
    checks = [Check(v, FAILED if lock.targets[v].gates_passed is False else PASSED, "its gates")
              for v in lock_validations(lock, target_id)]
    # (which parts were stand-ins the lock does not say: push reads them from the records)
    shown = held_back(lock.validation != UNVALIDATED, checks, allow_unvalidated=allow_unvalidated)
    recorded = lock.targets[target_id].held_back
    if recorded in OVERRIDABLE and allow_unvalidated:
        recorded = None
    return recorded or shown
