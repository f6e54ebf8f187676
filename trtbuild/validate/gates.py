"""What the graph and the runner need to know about validation without numpy: how many
log-probabilities the reference keeps, the default gates per quantization family, and which gates
a validation report failed."""

from __future__ import annotations

from typing import Mapping, Optional

from trtbuild.facts import quantformats
from trtbuild.store.summaries import GateResult, StageSummary, ValidationSummary

TOP_K = 256  # top-64 underestimated KL by 15% on SmolLM2 FP8; 256 costs 2 MB (benchmarks/RESULTS.md)

# Default gates per quantization family: generous enough that a healthy quantization passes on a
# small model (measured on SmolLM2-135M, benchmarks/RESULTS.md), tight enough that a broken one
# (a permuted layer, token salad) fails by orders of magnitude. A recipe's validate.gates override.
DEFAULT_GATES: dict[str, dict[str, float]] = {
    "none": {"kld_mean": 0.01, "kld_p99": 0.1, "top1_agreement": 0.97, "ppl_delta_pct": 1.0},
    "8bit": {"kld_mean": 0.15, "kld_p99": 2.0, "top1_agreement": 0.80, "ppl_delta_pct": 15.0},
    "4bit": {"kld_mean": 0.5, "kld_p99": 5.0, "top1_agreement": 0.65, "ppl_delta_pct": 50.0},
}
FAMILY = {None: "none", **{name: f.family for name, f in quantformats.FORMATS.items()}}
HIGHER_IS_BETTER = {"top1_agreement"}


def default_gates_of_family(family: str) -> dict[str, float]:
    """The default gates of a quantization family (`none`, `8bit`, `4bit`)."""
    return dict(DEFAULT_GATES[family])


def default_gates(quant: Optional[str], kv_cache: Optional[str]) -> dict[str, float]:
    family = FAMILY[quant]
    if family == "none" and kv_cache is not None:  # a quantized KV cache alone behaves like 8-bit
        family = quantformats.KV_FORMATS[kv_cache].family
    return dict(DEFAULT_GATES[family])


def judge(name: str, value: float, limit: float) -> GateResult:
    """The one place a gate is decided: `value` against `limit`, a minimum for the metrics where
    higher is better, else a maximum. The verdict is stored in the validation's report; every
    reader (the runner, the lock, `ls`, the report) shows it and none compares again."""
    passed = value >= limit if is_minimum(name) else value <= limit
    return GateResult(value=value, limit=limit, passed=bool(passed))


def failed_gates(summary: Optional[StageSummary]) -> list[str]:
    """`name value (limit L)` for each gate a validation report's summary failed; [] when none did
    (or the summary is not a validation's)."""
    gates = summary.gates if isinstance(summary, ValidationSummary) else {}
    return [f"{name} {g.value:.4g} (limit {g.limit:g})" for name, g in gates.items() if not g.passed]


PASSED, FAILED, NOT_VALIDATED = "passed", "failed", "none"


def verdict(gates: Optional[Mapping[str, GateResult]]) -> str:
    """PASSED, FAILED (a stored gate failed) or NOT_VALIDATED (no gates): from the verdicts stored
    per gate, never from the values."""
    if not gates:
        return NOT_VALIDATED
    return FAILED if any(not g.passed for g in gates.values()) else PASSED


def is_minimum(name: str) -> bool:
    """Whether the gate's limit is a minimum (higher is better), else a maximum: for how people read it."""
    return name in HIGHER_IS_BETTER
