"""The rows of a recipe's report: every planned target with its estimate, and what the store and
the lock file know of it (size on disk, validation metrics, gates)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtbuild.facts.nodeids import trtllm_validate_id, validate_id, vllm_validate_id
from trtbuild.facts.runtime_names import LLAMACPP_RUNTIME
from trtbuild.lock.lockfile import LockedTarget, LockFile
from trtbuild.plan.expand import Plan, Target, serving_sms_of
from trtbuild.store.local import LocalStore
from trtbuild.store.summaries import GateResult, ValidationSummary
from trtbuild.validate import gates as gate_rules


class ReportRow(BaseModel):
    """One target of the report's build matrix: what the plan, the store and the lock know of it.
    Missing values are None (a dash on the page)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    target: str = Field(description="The target's name.")
    kind: str = Field(description="checkpoint, hf-checkpoint, engine or gguf.")
    variant: Optional[str] = Field(None, description="The recipe variant it belongs to.")
    quant: Optional[str] = Field(None, description="The variant's weight quantization (a gguf variant's: its llama.cpp "
                                 "type, Q8_0 ...).")
    kv_cache: Optional[str] = Field(None, description="The variant's KV-cache quantization.")
    tp: Optional[int] = Field(None, description="Tensor parallelism.")
    pp: Optional[int] = Field(None, description="Pipeline parallelism.")
    gpu: Optional[str] = Field(None, description="An engine's SM.")
    status: str = Field(description="built, cached, failed, skipped, impossible or planned.")
    size_bytes: Optional[int] = Field(None, description="Size on disk of the built artifact.")
    weights_bytes_per_gpu: Optional[int] = Field(None, description="The plan's estimate of weights per GPU.")
    kv_tokens: Optional[int] = Field(None, description="The plan's estimate of KV-cache tokens.")
    kld_mean: Optional[float] = Field(None, description="The deciding validation's mean KL divergence.")
    kld_p99: Optional[float] = Field(None, description="Its KL divergence p99.")
    top1_agreement: Optional[float] = Field(None, description="Its top-1 agreement (0..1).")
    ppl_delta_pct: Optional[float] = Field(None, description="Its perplexity change, percent.")
    gates: Optional[dict[str, GateResult]] = Field(None, description="The shown validation's gates as stored.")
    gates_passed: Optional[bool] = Field(None, description="The target's gate verdict as decided when its validations "
                                                           "ran (the lock's); None: not validated.")
    measured_by: Optional[str] = Field(None, description="`RUNNER on DEVICE` of the numbers shown.")
    serves: Optional[str] = Field(None, description="An hf-checkpoint's runtimes and SMs; a gguf target's llama.cpp.")
    reason: Optional[str] = Field(None, description="Why it is failed, skipped or impossible.")

    @model_validator(mode="before")
    @classmethod
    def _verdict_of_the_gates(cls, data: Any) -> Any:
        """A row given gates and no verdict takes the one stored in its gates (gates.verdict)."""
        if isinstance(data, dict) and data.get("gates_passed") is None and data.get("gates"):
            shown = {name: GateResult.model_validate(g) for name, g in data["gates"].items()}
            data = {**data, "gates_passed": gate_rules.verdict(shown) == gate_rules.PASSED}
        return data

    @property
    def gate_state(self) -> str:
        """gates.PASSED, FAILED or NOT_VALIDATED: the stored verdict, never recomputed."""
        if self.gates_passed is None:
            return gate_rules.NOT_VALIDATED
        return gate_rules.PASSED if self.gates_passed else gate_rules.FAILED


def _summary(store: LocalStore, entry: Optional[LockedTarget]) -> Optional[ValidationSummary]:
    record = store.get_record(entry.key) if entry else None
    return record.summary if record is not None and isinstance(record.summary, ValidationSummary) else None


def _measured_by(summary: ValidationSummary, of: Optional[str] = None) -> str:
    """`RUNNER on DEVICE` as the validation's report names them, `(of CHECKPOINT)` for an engine
    that shares its checkpoint's numbers."""
    by = f"{summary.runner} on {summary.device}"
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


def rows(plan: Plan, store: LocalStore, lock: Optional[LockFile]) -> list[ReportRow]:
    locked = lock.targets if lock else {}
    serving_sms = serving_sms_of(plan.recipe)
    out = []
    for target in plan.targets:
        variant = plan.recipe.variants[target.variant]
        entry = locked.get(target.name)
        record = store.get_record(entry.key) if entry else None
        # the validations that ran, in the order their figures decide (refs.DECIDING_ORDER): the
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
        shown, measured_by = summary, _measured_by(summary) if summary else None
        if target.kind == "engine" and summary is None:  # an engine shares its checkpoint's numbers until validated itself
            checkpoint = locked.get(validate_id(target.depends_on[0]))
            shown = _summary(store, checkpoint)
            measured_by = _measured_by(shown, target.depends_on[0]) if shown else None
        metrics = shown.metrics if shown else None
        est = target.estimate
        serves = None
        if target.kind == "hf-checkpoint" and target.ok:  # the build's loader check, else the plan's table
            serves = _judged(target, entry.serves if entry is not None else None, serving_sms).serves_line()
        elif target.kind == "gguf" and target.ok:  # its packaged server runs llama.cpp, on the CPU
            serves = f"{LLAMACPP_RUNTIME} (CPU)"
        # the verdict decided when the validations ran (the lock's gates_passed): failed when any of them failed
        verdict = not any(v.gates_passed is False for v in ran)
        out.append(ReportRow(
            target=target.name, kind=target.kind, variant=target.variant,
            quant=variant.quant if variant.gguf is None else variant.gguf,  # a gguf variant has no `quant:`, its type instead
            kv_cache=variant.kv_cache, tp=target.tp, pp=target.pp, gpu=target.gpu, status=status,
            size_bytes=record.size if record else None,
            weights_bytes_per_gpu=est.weights_bytes_per_gpu if est else None,
            kv_tokens=est.kv_tokens if est else None,
            kld_mean=metrics.kld_mean if metrics else None, kld_p99=metrics.kld_p99 if metrics else None,
            top1_agreement=metrics.top1_agreement if metrics else None,
            ppl_delta_pct=metrics.ppl_delta_pct if metrics else None,
            gates=summary.gates if summary else None, gates_passed=verdict if summary else None,
            measured_by=measured_by, serves=serves, reason=target.reason,
        ))
    return out
