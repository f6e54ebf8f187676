"""The rows of a recipe's report: every planned target with its estimate, and what the store and
the lock file know of it (size on disk, validation metrics, gates)."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from trtbuild.facts.nodeids import trtllm_validate_id, validate_id, vllm_validate_id
from trtbuild.lock.lockfile import LockedTarget, LockFile
from trtbuild.plan.expand import Plan, Target, serving_sms_of
from trtbuild.store.local import LocalStore


def _summary(store: LocalStore, entry: Optional[LockedTarget]) -> dict:
    record = store.get_record(entry.key) if entry else None
    return record.summary if record else {}


def _measured_by(summary: dict, of: Optional[str] = None) -> str:
    """`RUNNER on DEVICE` as the validation's report names them, `(of CHECKPOINT)` for an engine
    that shares its checkpoint's numbers."""
    by = str(summary.get("runner") or "?") + (f" on {summary['device']}" if summary.get("device") else "")
    return f"{by} (of {of})" if of else by


def _judged(target: Target, checked: Optional[dict[str, list[str]]], sms: list[str]) -> Target:
    """The hf-checkpoint `target` as its build's loader check judged it: that verdict on `sms`, the
    SMs plan names (plan.serving_sms_of: the recipe's `gpus:`; the check judges every SM, the
    checkpoint being the same for all), so that the column says what `trtbuild plan` says, in its
    words (Target.serves_line)."""
    if checked is None or target.serves is None:
        return target
    serves = {runtime: tuple(sm for sm in sms if sm in (checked.get(runtime) or ())) for runtime in target.serves}
    notes = {runtime: {sm: note for sm, note in by_sm.items() if sm in serves.get(runtime, ())}
             for runtime, by_sm in (target.serve_notes or {}).items()}
    return replace(target, serves=serves, serve_notes={runtime: by_sm for runtime, by_sm in notes.items() if by_sm})


def rows(plan: Plan, store: LocalStore, lock: Optional[LockFile]) -> list[dict]:
    locked = lock.targets if lock else {}
    serving_sms = serving_sms_of(plan.recipe)
    out = []
    for target in plan.targets:
        variant = plan.recipe.variants[target.variant]
        entry = locked.get(target.name)
        record = store.get_record(entry.key) if entry else None
        # the validations that ran, in the order their figures decide (runner.DECIDING_ORDER): the
        # numbers shown are TensorRT-LLM's, else vLLM's, else torch's (an engine's own is TensorRT-LLM's),
        # those of the first that failed its gates when one did (they say why the target failed)
        ran = [locked[v] for v in (trtllm_validate_id(target.name), vllm_validate_id(target.name),
                                   validate_id(target.name)) if v in locked]
        validation = next((v for v in ran if v.gates_passed is False), ran[0] if ran else None)
        summary = _summary(store, validation)
        if not target.ok:
            status = "impossible"
        elif record is None:
            status = "planned"
        else:  # any validation that ran and failed its gates fails the target, whichever shows its numbers
            status = "failed" if any(v.gates_passed is False for v in ran) else "built"
        metrics = summary.get("metrics", {})
        measured_by = _measured_by(summary) if metrics else None
        if target.kind == "engine" and not metrics:  # an engine shares its checkpoint's numbers until validated itself
            checkpoint = locked.get(validate_id(target.depends_on[0]))
            inherited = _summary(store, checkpoint)
            metrics = inherited.get("metrics", {})
            measured_by = _measured_by(inherited, target.depends_on[0]) if metrics else None
        est = target.estimate
        serves = None
        if target.kind == "hf-checkpoint" and target.ok:  # the build's loader check, else the plan's table
            serves = _judged(target, entry.serves if entry is not None else None, serving_sms).serves_line()
        out.append({
            "target": target.name, "kind": target.kind, "variant": target.variant, "quant": variant.quant,
            "kv_cache": variant.kv_cache, "tp": target.tp, "pp": target.pp, "gpu": target.gpu, "status": status,
            "size_bytes": record.size if record else None,
            "weights_bytes_per_gpu": est.weights_bytes_per_gpu if est else None,
            "kv_tokens": est.kv_tokens if est else None,
            "kld_mean": metrics.get("kld_mean"), "kld_p99": metrics.get("kld_p99"),
            "top1_agreement": metrics.get("top1_agreement"), "ppl_delta_pct": metrics.get("ppl_delta_pct"),
            "gates": summary.get("gates"), "measured_by": measured_by, "serves": serves, "reason": target.reason,
        })
    return out
