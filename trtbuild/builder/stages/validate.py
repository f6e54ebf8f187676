"""Validation stages: the reference logits of the source (once per source and evaluation set) and
each candidate's metrics against them, with the recipe's gates. Both run in a worker process.

The validate artifact (report.json, report.md, metrics per window) is stored even when a gate
fails, so it can be inspected; the runner fails the target from the gates in the report.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Optional

import numpy as np

from trtbuild.builder.stages.base import StageContext
from trtbuild.builder.stages.worker import report_progress
from trtbuild.store.summaries import ReferenceSummary, ValidationSummary

REFERENCE_NPZ = "reference.npz"
WINDOWS = "windows.npy"


def _device(ctx: StageContext) -> str:
    from trtbuild.host import hardware

    return hardware.resolve_device(ctx.runtime.device or "auto")


def make_reference(ctx: StageContext) -> None:
    from trtbuild.checkpoint.calibration import make_windows
    from trtbuild.validate import torch_runner
    from trtbuild.validate.evaltext import read_eval_text

    started = time.monotonic()
    source, device = ctx.inputs["source"], _device(ctx)
    text = read_eval_text(ctx.runtime.text, Path(ctx.runtime.base_dir))
    windows, meta = make_windows(source, text, ctx.params["samples"], ctx.params["seq_len"], ctx.params["seed"])
    model = _source_model(ctx, source, device)
    ref = torch_runner.reference(model, windows, device, ctx.params["top_k"],
                                 progress=lambda d, t: report_progress(d, t, "reference windows"))
    np.save(ctx.out / WINDOWS, windows)
    np.savez(ctx.out / REFERENCE_NPZ, **ref)
    nll = -ref["target_logp"].astype(np.float64)
    ctx.report(ReferenceSummary(text_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
                                windows=int(windows.shape[0]), seq_len=int(windows.shape[1]), top_k=ctx.params["top_k"],
                                ppl=float(np.exp(nll.mean())), text_tokens=meta["tokens"],
                                overlapping=meta["overlapping"], device=device))
    ctx.measure(reference_seconds=round(time.monotonic() - started, 2))


def _source_model(ctx: StageContext, source: Path, device: str):
    """The source model as the torch runner computes with it: borrowed, so a variant's quantized
    model, kept by the shared worker between its quantize and its validation, stays kept."""
    from trtbuild.builder.stages import models
    from trtbuild.validate import torch_runner

    dtype = ctx.params["dtype"]
    computed_in = torch_runner.compute_dtype_name(device, dtype)
    return models.borrow(models.source_key(ctx.runtime.input_digests["source"], computed_in),
                         lambda: torch_runner.load_source(source, device, dtype), device)


def _candidate(ctx: StageContext, device: str):
    from trtbuild.builder.stages import models
    from trtbuild.validate import torch_runner

    source, dtype = ctx.inputs["source"], ctx.params["dtype"]
    if "quantized" in ctx.inputs:  # the shared worker's model, if quantize or an export just used it
        return torch_runner.in_compute_dtype(models.quantized(source, ctx.inputs["quantized"], dtype, device), device, dtype)
    if "checkpoint" in ctx.inputs:
        return models.read_back(lambda: torch_runner.load_trtllm_checkpoint(ctx.inputs["checkpoint"], source, device, dtype))
    return models.read_back(lambda: torch_runner.load_source(ctx.inputs["hf_checkpoint"], device, dtype))


def _load_reference(ctx: StageContext) -> tuple[np.ndarray, dict]:
    reference = ctx.inputs["reference"]
    windows = np.load(reference / WINDOWS)
    with np.load(reference / REFERENCE_NPZ) as data:
        return windows, {k: data[k] for k in data.files}


def validate(ctx: StageContext) -> None:
    """A checkpoint through the torch runner (transformers, ModelOpt fake quantization)."""
    from trtbuild.validate import torch_runner

    started = time.monotonic()
    device = _device(ctx)
    windows, ref = _load_reference(ctx)
    model = _candidate(ctx, device)
    comparison = torch_runner.compare(model, windows, ref, device,
                                      progress=lambda d, t: report_progress(d, t, "validation windows"))
    _write_report(ctx, windows, comparison, started, {"runner": "torch", "device": device})


def validate_trtllm(ctx: StageContext) -> None:
    """An engine or a Hugging Face checkpoint through TensorRT-LLM's LLM API on this host's GPU."""
    from trtbuild.host import toolchain
    from trtbuild.validate import trtllm_runner

    started = time.monotonic()
    windows, ref = _load_reference(ctx)
    backend = ctx.params["backend"]
    folder = ctx.inputs["engine" if backend == "engine" else "hf_checkpoint"]
    candidate = trtllm_runner.run(folder, windows, ref["topk_ids"], backend)
    comparison = trtllm_runner.compare(candidate, ref)
    lumped = float(np.isnan(candidate["logp_at_reference"]).mean())
    ctx.measure(gpus=candidate["gpus"])  # the products are this host's: the record's, not the artifact's
    extra = {"runner": f"tensorrt_llm {toolchain.package_version('tensorrt_llm')}", "device": candidate["device"],
             "backend": backend, "logits_path": candidate["path"], "reference_topk_lumped": lumped}
    warnings = []
    if lumped > 0:
        warnings.append(f"{lumped:.1%} of the reference's top-{ref['topk_ids'].shape[-1]} tokens were outside the "
                        "candidate's returned top-k and were lumped into the tail (KL divergence a looser lower bound)")
    _write_report(ctx, windows, comparison, started, extra, warnings)


def validate_vllm(ctx: StageContext) -> None:
    """A packaged Hugging Face checkpoint loaded by vLLM with its serve options, on this host's GPU."""
    from trtbuild.host import toolchain
    from trtbuild.validate import vllm_runner

    started = time.monotonic()
    windows, ref = _load_reference(ctx)
    folder = ctx.inputs["hf_checkpoint"]
    options, origin = vllm_runner.load_options(folder, ctx.params)
    candidate = vllm_runner.run(folder, windows, ref["topk_ids"], options)
    comparison = vllm_runner.compare(candidate, ref)
    lumped = float(np.isnan(candidate["logp_at_reference"]).mean())
    if candidate["gpus"] is not None:  # this host's products: the record's, not the artifact's
        ctx.measure(gpus=candidate["gpus"])
    scoring = {k: v for k, v in candidate["llm_arguments"].items() if k not in options}
    extra = {"runner": f"vllm {toolchain.package_version('vllm')}", "device": candidate["device"],
             "load_options": options, "load_options_from": origin, "scoring_options": scoring,
             "logits_path": "prompt_logprobs", "reference_topk_lumped": lumped}
    warnings = []
    if lumped > 0:
        warnings.append(f"{lumped:.1%} of the reference's top-{ref['topk_ids'].shape[-1]} tokens were outside vLLM's "
                        "returned top-k and were lumped into the tail (KL divergence a lower bound)")
    _write_report(ctx, windows, comparison, started, extra, warnings)


def validate_llamacpp(ctx: StageContext) -> None:
    """A GGUF as llama.cpp computes it (llama-cpp-python, every position's logits), on the CPU."""
    from trtbuild.builder.stages.gguf import MODEL_FILE
    from trtbuild.host import llamacpp
    from trtbuild.validate import llamacpp_runner

    started = time.monotonic()
    windows, ref = _load_reference(ctx)
    comparison = llamacpp_runner.compare(ctx.inputs["gguf"] / MODEL_FILE, windows, ref,
                                         progress=lambda d, t: report_progress(d, t, "validation windows"))
    _write_report(ctx, windows, comparison, started, {"runner": f"llama.cpp (llama-cpp-python {llamacpp.version()})",
                                                      "device": "cpu", "logits_path": "logits_all"})


def _write_report(ctx: StageContext, windows: np.ndarray, comparison, started: float, runner: dict,
                  warnings: Optional[list] = None) -> None:
    from trtbuild.validate import metrics

    result = metrics.summarize(comparison)
    gates, gate_warnings, tests = metrics.evaluate_gates(result, ctx.params["gates"])
    warnings = gate_warnings + list(warnings or [])
    overlap = None
    if "calibration" in ctx.inputs:
        from trtbuild.checkpoint.calibration import load_windows

        reference = ctx.inputs["reference"]
        overlap = metrics.window_overlap(windows, load_windows(ctx.inputs["calibration"]))
        evaluated_on = _text_sha(reference)
        same_text = evaluated_on is not None and evaluated_on == _text_sha(ctx.inputs["calibration"])
        if same_text:
            warnings.append("the evaluation text is the calibration text: the gates are unreliable (they flatter "
                            "the model); point validate.text at other text")
            overlap = max(overlap, 1.0)
        elif overlap > 0:
            warnings.append(f"{overlap:.0%} of the evaluation windows share text with the calibration set: "
                            "the gates are unreliable (they flatter the model)")
    np.savez(ctx.out / "per_window.npz", kl=comparison.kl.mean(axis=1), top1=comparison.top1.mean(axis=1),
             ref_nll=comparison.ref_nll.mean(axis=1), cand_nll=comparison.cand_nll.mean(axis=1))
    summary = ValidationSummary(metrics=result.as_json(), stderr=result.stderr, gates=gates, tests=tests,
                                warnings=warnings, gates_reliable=not overlap, calibration_overlap=overlap, **runner,
                                windows=result.windows)
    ctx.measure(validation_seconds=round(time.monotonic() - started, 2))
    (ctx.out / "report.md").write_text(_markdown(ctx.runtime.target or "", summary))
    ctx.report(summary)



def _text_sha(artifact: Path):
    report = artifact / "report.json"
    return json.loads(report.read_text()).get("text_sha256") if report.exists() else None


def _markdown(target: str, summary: ValidationSummary) -> str:
    m, se = summary.metrics, summary.stderr
    lines = [f"# Validation of {target}", "",
             f"{m.tokens} tokens in {summary.windows} windows, {summary.runner} runner on {summary.device}.", "",
             "| metric | value | ± (std. error) |", "|---|---|---|",
             f"| KL divergence, mean | {m.kld_mean:.4g} | {se['kld_mean']:.2g} |",
             f"| KL divergence, p99 | {m.kld_p99:.4g} | |",
             f"| top-1 agreement | {m.top1_agreement:.4f} | {se['top1_agreement']:.2g} |",
             f"| perplexity (reference → candidate) | {m.ppl_reference:.3f} → {m.ppl:.3f} | |",
             f"| perplexity change | {m.ppl_delta_pct:+.2f}% | {se['ppl_delta_pct']:.2g} |", "",
             "| gate | value | limit | |", "|---|---|---|---|"]
    for name, gate in summary.gates.items():
        lines.append(f"| {name} | {gate.value:.4g} | {gate.limit:g} | {'pass' if gate.passed else '**FAIL**'} |")
    test = summary.tests.get("top1_agreement")
    if test:
        lines += ["", f"Top-1 agreement, one-tailed two-sample test (reference/trtllm.md section 7): "
                      f"{test['n']:.0f} effective tokens detect a drop of {test['theta']:.3g} or more "
                      f"(alpha {test['alpha']:g}, power {1 - test['beta']:g}); the gate's margin is {test['margin']:.3g}."]
    lines += [""] + [f"- {w}" for w in summary.warnings]
    return "\n".join(lines) + "\n"
