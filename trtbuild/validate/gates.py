"""What the graph and the runner need to know about validation without numpy: how many
log-probabilities the reference keeps, the default gates per quantization family, and which gates
a validation report failed."""

from __future__ import annotations

from typing import Optional

from trtbuild.facts import quantformats

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


def default_gates(quant: Optional[str], kv_cache: Optional[str]) -> dict[str, float]:
    family = FAMILY[quant]
    if family == "none" and kv_cache is not None:  # a quantized KV cache alone behaves like 8-bit
        family = quantformats.KV_FORMATS[kv_cache].family
    return dict(DEFAULT_GATES[family])


def failed_gates(summary: dict) -> list[str]:
    """`name value (limit L)` for each gate a validation report's summary failed; [] when none did
    (or the summary has no gates)."""
    gates = summary.get("gates") if isinstance(summary, dict) else None
    return [f"{name} {g['value']:.4g} (limit {g['limit']:g})"
            for name, g in (gates or {}).items() if not g["passed"]]
