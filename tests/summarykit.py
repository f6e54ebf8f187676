"""Stage summaries for tests that make records or run results by hand: complete, as the stages
write them (store.summaries refuses one with a field missing), with only what a test varies given."""

from __future__ import annotations

from typing import Optional


def validation_summary(kld_mean: float = 0.01, top1_agreement: float = 0.98, ppl_delta_pct: float = 0.5, *,
                       gates: Optional[dict] = None, runner: str = "torch", device: str = "cpu",
                       kld_p99: float = 0.1, **more) -> dict:
    """A validation's report.json: the headline metrics, `gates` as stored (default: one KL gate at
    0.05, passed when kld_mean is within it), the runner and device that computed them."""
    if gates is None:
        gates = {"kld_mean": {"value": kld_mean, "limit": 0.05, "passed": kld_mean <= 0.05}}
    return {"metrics": {"kld_mean": kld_mean, "kld_p99": kld_p99, "top1_agreement": top1_agreement,
                        "ppl_reference": 10.0, "ppl": 10.0 * (1 + ppl_delta_pct / 100), "ppl_delta_pct": ppl_delta_pct,
                        "tokens": 64},
            "stderr": {"kld_mean": 0.001, "top1_agreement": 0.01, "ppl_delta_pct": 0.1}, "gates": gates, "tests": {},
            "warnings": [], "gates_reliable": True, "calibration_overlap": None, "runner": runner, "device": device,
            "windows": 2, **more}
