"""The one rule for what a store publishes: which targets get a ref when they are built, are
pushed, are listed by `trtbuild ls` and may be pulled. `held_back` says it; everything else calls it
(trtbuild/lock/verdict.py for a lock file's targets).

A target (checkpoint, hf-checkpoint, engine) is published when the build validated it, every
validation of it that ran passed its gates (an engine's include its checkpoint's), at least one
ran, and every validation that did not run was one this host could not run (TensorRT-LLM's or
vLLM's, without the runtime or a GPU) while torch's ran and passed; and when no stand-in toolchain
made it or its deciding validations. The build applies the rule with everything it knows and
records why a target is held back in the lock (`held_back`); push and pull read the lock, so they
say what the build said, word for word. A lock written before that field (or by hand) is judged by
what it shows: its validations' gates, `validation: skipped (--no-validate)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from trtbuild.facts.nodeids import checkpoint_of_engine, trtllm_validate_id, validate_id, vllm_validate_id

UNVALIDATED = "skipped (--no-validate)"  # a lock's `validation:` after `build --no-validate`

NO_VALIDATE = "built with --no-validate"
NONE_RAN = "no validation of it ran"
OVERRIDABLE = (NO_VALIDATE, NONE_RAN)  # what `push --allow-unvalidated` publishes anyway

PASSED, FAILED, ELSEWHERE, NOT_RUN = "passed", "failed", "elsewhere", "not run"


@dataclass(frozen=True)
class Check:
    """One validation of a target as a build (or a lock) left it."""

    id: str
    state: str  # PASSED; FAILED; ELSEWHERE (a runtime this host lacks); NOT_RUN
    detail: str = ""  # FAILED: "its gates" when it reported figures; NOT_RUN: its status (skipped, ...)
    standin: Sequence[str] = field(default_factory=tuple)  # the toolchain parts of it that were stand-ins


def held_back(validated: bool, checks: Sequence[Check], standin: Sequence[str] = (),
              allow_unvalidated: bool = False) -> Optional[str]:
    """Why the target may not be published, or None. `validated`: the build ran validation (not
    --no-validate); `checks`: its validations, deciding first; `standin`: the stand-in parts that
    made it. `allow_unvalidated` (`push`/`pull --allow-unvalidated`) lets through a --no-validate
    build's targets and one no validation of exists (OVERRIDABLE); never one a validation failed, a
    stand-in's, nor one whose validation was skipped by this build (`--until`: build it through
    its validations)."""
    failed = sorted((c for c in checks if c.state == FAILED), key=lambda c: not c.detail)  # gates first: the cause
    failed = failed[0] if failed else None
    if failed is not None:
        return f"{failed.id} failed {failed.detail}".rstrip()
    if standin:
        return f"made by a stand-in toolchain ({', '.join(standin)})"
    measured = next((c for c in checks if c.state == PASSED and c.standin), None)
    if measured is not None:
        return f"its validation {measured.id} was made by a stand-in toolchain ({', '.join(measured.standin)})"
    if not validated:
        return None if allow_unvalidated else NO_VALIDATE
    pending = next((c for c in checks if c.state == NOT_RUN), None)
    if pending is not None:
        return f"{pending.id} was {pending.detail or 'not run'}"
    if not any(c.state == PASSED for c in checks) and not allow_unvalidated:
        return NONE_RAN
    return None


def validation_ids(target_id: str, stage: Optional[str], sm: Optional[str] = None) -> list[str]:
    """The ids a target's validations have in a lock: its own, and for an engine (built for `sm`) its
    checkpoint's."""
    ids = [validate_id(target_id), trtllm_validate_id(target_id), vllm_validate_id(target_id)]
    if stage == "engine" and sm is not None:
        ids.append(validate_id(checkpoint_of_engine(target_id, sm)))
    return ids
