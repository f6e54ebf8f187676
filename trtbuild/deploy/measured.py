"""`pull --prefer latency|throughput` by measurement: among the targets that fit this host, the one
whose serving measurements (bench records, trtbuild/store/measurements.py) on this host's GPU product (a
CPU-only host's: its CPU model, for gguf targets) are best, when at least two of them were measured
under one workload at one concurrency level; otherwise none, and the rule of select.py decides.

Only end-to-end figures under a common load compare: throughput takes the highest output tokens/s
at the highest concurrency level measured for two or more candidates, latency the lowest end-to-end
p50 (then TTFT p50) at the lowest. A record counts for a candidate only when it measured the
runtime the candidate would be served with, on the same product."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from trtbuild.facts import serving as serving_table
from trtbuild.facts.runtime_names import LLAMACPP_RUNTIME, TRTLLM_RUNTIME

# A candidate's runtime as select.py names it -> the runtime a bench record names (an engine is served by trtllm)
BENCH_RUNTIME = {serving_table.ENGINE_RUNTIME: TRTLLM_RUNTIME}


@dataclass(frozen=True)
class Measured:
    """The figures one choice was made from: the load, the product, and each compared target's numbers."""

    workload: str  # the workload's name, as the records name it
    concurrency: int
    product: str
    figures: dict[str, dict[str, float]]  # target -> {output_tok_s, ttft_p50_ms, e2el_p50_ms}, best first

    def as_json(self) -> dict:
        return {"workload": self.workload, "concurrency": self.concurrency, "product": self.product,
                "figures": [{"target": t, **f} for t, f in self.figures.items()]}


def host_product(gpus, cpu: Optional[str], gguf: bool) -> Optional[tuple[str, str]]:
    """(device, product) whose measurements count for a choice here: this host's CPU model for gguf
    targets (llama.cpp's packaged server runs on the CPU), else its first GPU's product; None when
    there is none to match."""
    if gguf:
        return ("cpu", cpu) if cpu else None
    return ("gpu", gpus[0].name) if gpus else None


def _figures(record) -> dict[str, float]:
    f = record.figures
    return {"output_tok_s": f.output_token_throughput, "ttft_p50_ms": f.ttft_ms.p50, "e2el_p50_ms": f.e2el_ms.p50}


def rank(candidates: list, digests: dict[str, str], records_of: Callable[[str], list], prefer: str,
         device: str, product: str) -> Optional[tuple[object, Measured]]:
    """(the best candidate, the figures) by measurement, or None when fewer than two candidates were
    measured under a common workload and concurrency on `product`. `records_of(digest)` is asked once
    per candidate; `digests`: target -> its artifact's digest."""
    by_load: dict[str, dict[str, object]] = {}  # workload digest -> target -> its newest record there
    for cand in candidates:
        runtime = BENCH_RUNTIME.get(cand.runtime, cand.runtime)
        for record in records_of(digests[cand.target]):  # oldest first: a newer run of the same load wins
            p = record.platform
            if p.device == device and p.product == product and record.runtime == runtime and not record.standin:
                by_load.setdefault(record.workload_digest, {})[cand.target] = record
    shared = {load: measured for load, measured in by_load.items() if len(measured) >= 2}
    if not shared:
        return None

    def concurrency(load: str) -> int:
        return next(iter(shared[load].values())).workload_spec["concurrency"]

    def load_order(load: str) -> tuple:
        level = concurrency(load)
        name = next(iter(shared[load].values())).workload
        return (-level if prefer == "throughput" else level, -len(shared[load]), name, load)

    load = min(shared, key=load_order)
    measured = shared[load]
    if prefer == "throughput":
        ordered = sorted(measured.items(), key=lambda kv: -kv[1].figures.output_token_throughput)
    else:
        ordered = sorted(measured.items(), key=lambda kv: (kv[1].figures.e2el_ms.p50, kv[1].figures.ttft_ms.p50))
    best = next(c for c in candidates if c.target == ordered[0][0])
    first = ordered[0][1]
    return best, Measured(first.workload, concurrency(load), product, {t: _figures(r) for t, r in ordered})


def describe(target: str, measured: Measured, prefer: str) -> str:
    """The stderr line: `chose X by measured figures: X 910 output tok/s, Y 640 output tok/s (chat-short,
    concurrency 8, NVIDIA H200)`."""
    if prefer == "throughput":
        words = [f"{t} {_num(f['output_tok_s'])} output tok/s" for t, f in measured.figures.items()]
    else:
        words = [f"{t} E2EL p50 {_num(f['e2el_p50_ms'])} ms, TTFT p50 {_num(f['ttft_p50_ms'])} ms"
                 for t, f in measured.figures.items()]
    return (f"chose {target} by measured figures: {'; '.join(words)} ({measured.workload}, concurrency "
            f"{measured.concurrency}, {measured.product})")


def rule_words(prefer: str, gguf: bool) -> str:
    """How select.py's rule ranks, in a few words."""
    if gguf:
        return "the rule (the recipe's variant order)"
    return f"the rule ({'fewest' if prefer == 'throughput' else 'most'} GPUs, then the recipe's variant order)"


def describe_rule(target: str, product: Optional[str], prefer: str, gguf: bool) -> str:
    """The stderr line when no figures decide: `no measured figures for NVIDIA H200; chose by the rule
    (fewest GPUs, then the recipe's variant order): X`."""
    where = product or ("this host's CPU" if gguf else "this host's GPU")
    return f"no measured figures for {where}; chose by {rule_words(prefer, gguf)}: {target}"


def _num(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"


def is_gguf(candidate) -> bool:
    return candidate.runtime == LLAMACPP_RUNTIME
