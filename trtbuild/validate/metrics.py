"""Accuracy metrics of a candidate against the reference model's logits, with their uncertainty,
and the gates that decide whether a candidate may be published.

The reference stores, per position, its top-k log-probabilities (normalized: log-softmax, so the
log-sum-exp is folded in) and the log-probability of the actual next token. KL(reference ||
candidate) is then the exact sum over those k tokens plus the remaining probability mass of both
models lumped into one "tail" bin. By the log-sum inequality the lumped tail term never exceeds the
true one: the estimate is a lower bound whose error is at most the tail's own contribution,
which the report measures (benchmarks/RESULTS.md: validate_speed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from trtbuild.store.summaries import GateResult
from trtbuild.validate.gates import TOP_K, judge  # numpy-free tables the graph reads too

Z_95 = 1.6448536269514722  # one-sided 95% (reference/trtllm.md section 7 uses alpha = 0.05)
# The one-tailed two-sample test of TensorRT-LLM's accuracy CI (reference/trtllm.md section 7):
# defaults alpha = 0.05 (false failures), beta = 0.2 (missed drops, i.e. power 0.8).
ALPHA, BETA = 0.05, 0.2


def topk_reference(logp_rows: "np.ndarray", k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """(ids [n, k] int32, log-probs [n, k] float32) of the k most probable tokens per row."""
    ids = np.argpartition(-logp_rows, k - 1, axis=-1)[:, :k]
    values = np.take_along_axis(logp_rows, ids, axis=-1)
    order = np.argsort(-values, axis=-1)
    return np.take_along_axis(ids, order, axis=-1).astype(np.int32), np.take_along_axis(values, order, axis=-1).astype(np.float32)


def kl_topk(ref_ids: np.ndarray, ref_logp: np.ndarray, cand_logp_rows: np.ndarray) -> np.ndarray:
    """Per-row KL(reference || candidate) from the reference's top-k and the candidate's full
    log-probabilities: exact over the k tokens, plus both tails lumped into one bin."""
    return kl_lumped(ref_logp, np.take_along_axis(cand_logp_rows, ref_ids, axis=-1))


def kl_lumped(ref_logp: np.ndarray, cand_at: np.ndarray) -> np.ndarray:
    """Per-row KL(reference || candidate) from the reference's top-k log-probs and the candidate's
    log-probs at those same tokens (NaN where the candidate's is unknown, e.g. outside the top-k a
    TensorRT-LLM runner returned): exact over the known tokens, and the rest of both models lumped
    into one tail bin, so the result stays a lower bound (log-sum inequality)."""
    ref_logp = ref_logp.astype(np.float64)
    cand_at = cand_at.astype(np.float64)
    known = ~np.isnan(cand_at)
    p = np.where(known, np.exp(ref_logp), 0.0)
    head = np.sum(np.where(known, p * (ref_logp - np.where(known, cand_at, 0.0)), 0.0), axis=-1)
    p_tail = np.clip(1.0 - p.sum(axis=-1), 0.0, 1.0)
    q_tail = np.clip(1.0 - np.where(known, np.exp(np.where(known, cand_at, 0.0)), 0.0).sum(axis=-1), 1e-12, 1.0)
    tail = np.where(p_tail > 1e-12, p_tail * (np.log(np.maximum(p_tail, 1e-300)) - np.log(q_tail)), 0.0)
    return np.maximum(head + tail, 0.0)


@dataclass
class Comparison:
    """Per-token numbers for all windows: [windows, positions]."""

    kl: np.ndarray
    top1: np.ndarray  # 1.0 where the candidate's most likely token is the reference's
    ref_nll: np.ndarray
    cand_nll: np.ndarray


@dataclass
class Metrics:
    kld_mean: float
    kld_p99: float
    top1_agreement: float
    ppl_reference: float
    ppl: float
    ppl_delta_pct: float
    tokens: int
    windows: int
    stderr: dict = field(default_factory=dict)  # standard error over windows, per metric

    def as_json(self) -> dict:
        return {"kld_mean": self.kld_mean, "kld_p99": self.kld_p99, "top1_agreement": self.top1_agreement,
                "ppl_reference": self.ppl_reference, "ppl": self.ppl, "ppl_delta_pct": self.ppl_delta_pct,
                "tokens": self.tokens}


def _se(per_window: np.ndarray) -> float:
    n = len(per_window)
    return float(np.std(per_window, ddof=1) / math.sqrt(n)) if n > 1 else float("inf")


def summarize(c: Comparison) -> Metrics:
    ref_ppl = float(np.exp(c.ref_nll.mean()))
    ppl = float(np.exp(c.cand_nll.mean()))
    per_window_delta = (np.exp(c.cand_nll.mean(axis=1)) / np.exp(c.ref_nll.mean(axis=1)) - 1) * 100
    return Metrics(
        kld_mean=float(c.kl.mean()),
        kld_p99=float(np.percentile(c.kl, 99)),
        top1_agreement=float(c.top1.mean()),
        ppl_reference=ref_ppl,
        ppl=ppl,
        ppl_delta_pct=(ppl / ref_ppl - 1) * 100,
        tokens=int(c.kl.size),
        windows=int(c.kl.shape[0]),
        stderr={"kld_mean": _se(c.kl.mean(axis=1)), "top1_agreement": _se(c.top1.mean(axis=1)),
                "ppl_delta_pct": _se(per_window_delta)},
    )


def two_sample_test(n: float, sigma: float, alpha: float = ALPHA, beta: float = BETA) -> dict[str, float]:
    """The one-tailed two-sample test of reference/trtllm.md section 7 for n samples per side with
    per-sample standard deviation sigma: `scale` = sqrt(2 sigma^2 / n); a candidate fails when it is
    more than -z(alpha)*scale below the reference (`threshold_offset`, negative); `theta` =
    -(z(alpha) + z(beta))*scale is the smallest true drop detected with power 1 - beta."""
    z = NormalDist().inv_cdf
    scale = math.sqrt(2.0 * sigma * sigma / n) if n > 0 else math.inf
    return {"n": n, "sigma": sigma, "alpha": alpha, "beta": beta, "scale": scale,
            "threshold_offset": z(alpha) * scale, "theta": -(z(alpha) + z(beta)) * scale}


def agreement_test(metrics: Metrics, limit: float) -> dict[str, float]:
    """The two-sample test applied to top-1 agreement (an accuracy: a Bernoulli per token, whose
    reference value is 1, the reference agreeing with itself). sigma is the Bernoulli deviation at
    the limit, where the gate decides; n is the effective number of tokens, from the spread of the
    per-window means (neighbouring tokens are not independent), never more than the tokens."""
    p = metrics.top1_agreement
    se = metrics.stderr.get("top1_agreement")
    n = float(metrics.tokens)
    if se is not None and math.isfinite(se) and se > 0 and 0 < p < 1:
        n = min(n, p * (1 - p) / (se * se))
    sigma = math.sqrt(limit * (1 - limit)) if 0 < limit < 1 else 0.5
    return {**two_sample_test(n, sigma), "margin": 1.0 - limit}


def evaluate_gates(metrics: Metrics, limits: dict[str, float]) -> tuple[dict[str, GateResult], list[str], dict[str, dict]]:
    """{gate: its GateResult (gates.judge)}, warnings where the sample cannot decide a gate, and the
    statistical tests behind them. Top-1 agreement, an accuracy, uses the two-sample test of
    reference/trtllm.md section 7: the gate is meaningless when the smallest drop the sample can
    detect (theta) exceeds the gate's margin (1 - limit). Every metric with a standard error also
    warns when the one-sided 95% interval of its value (value -/+ z*stderr over windows) straddles
    the limit: a value that close to the limit is not decided by this sample."""
    gates, warnings, tests = {}, [], {}
    values = metrics.as_json()
    for name, limit in limits.items():
        value = values[name]
        gates[name] = judge(name, value, limit)
        se = metrics.stderr.get(name)
        if name == "top1_agreement":
            test = tests[name] = agreement_test(metrics, limit)
            if test["theta"] > test["margin"]:
                warnings.append(f"top1_agreement: {test['n']:.0f} effective tokens detect a drop of {test['theta']:.3g} "
                                f"or more (one-tailed two-sample test, alpha {ALPHA}, power {1 - BETA:g}), more than "
                                f"the gate's margin {test['margin']:.3g}: use more validate.samples")
        if se is not None and math.isfinite(se) and abs(value - limit) < Z_95 * se:
            warnings.append(f"{name} {value:.4g} is within the 95% uncertainty of the sample (±{Z_95 * se:.2g}) "
                            f"of its limit {limit:g}: use more validate.samples to decide it")
        elif se is not None and not math.isfinite(se):
            warnings.append(f"{name}: one window gives no uncertainty estimate; use validate.samples >= 2")
    return gates, warnings, tests


def window_overlap(eval_ids: np.ndarray, calib_ids: np.ndarray, span: int = 16) -> float:
    """Share of evaluation windows that contain a span of `span` tokens also found in a calibration
    window: a calibration set that covers the evaluation text flatters the model."""
    seen = set()
    for row in calib_ids:
        for start in range(0, max(0, len(row) - span) + 1):
            seen.add(row[start:start + span].tobytes())
    hits = 0
    for row in eval_ids:
        if any(row[s:s + span].tobytes() in seen for s in range(0, max(0, len(row) - span) + 1)):
            hits += 1
    return hits / len(eval_ids) if len(eval_ids) else 0.0
