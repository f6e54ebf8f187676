"""The load generators `trtbuild bench` drives a server with: established tools run as subprocesses,
whose own summary files are parsed into Figures (never recomputed here).

- `aiperf` (NVIDIA aiperf, `python3 -m aiperf profile`): any OpenAI-compatible server, llama.cpp's
  included. Summary: profile_export_aiperf.json; raw per-request records: profile_export.jsonl.
- `vllm-bench` (vLLM's `vllm bench serve`, module vllm.benchmarks.serve): summary and, with
  --save-detailed, the per-request lists in one result JSON, which is the raw blob. It cannot drive
  llama-cpp-python's server (it sends `x-request-id: bench-...`, which that server refuses with 400
  unless it is a UUID).

How each is told the workload's `spread` (Workload: each length drawn uniformly within +-spread of
its mean): both are given `--random-range-ratio spread`, which samples every length uniformly from
[floor(mean*(1-r)), ceil(mean*(1+r))] (vLLM's random dataset; aiperf's vllm corpus style, its
default, mirrors it). aiperf's --isl-stddev/--osl-stddev would draw from a normal distribution
instead: not the workload the record names, so they stay 0. With spread 0 neither gets the option
(aiperf refuses a range ratio without explicit means; vLLM's 0 is its default).

Exact output lengths: vLLM, TensorRT-LLM and SGLang take `ignore_eos: true`; llama-cpp-python ignores
it, so the caller passes `logit_bias` of -100 on every end-of-generation token instead (`extra`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trtbuild.store.measurements import Figures, Percentiles
from trtbuild.recipe.bench import Workload
from trtbuild import interrupt
from trtbuild.errors import TrtbuildError

LOADGENS = ("aiperf", "vllm-bench")
AIPERF_SUMMARY = "profile_export_aiperf.json"
AIPERF_RECORDS = "profile_export.jsonl"
VLLM_RESULT = "vllm-bench-result.json"
PERCENTILES = ("50", "90", "95", "99")
_TAIL = 5


@dataclass
class LoadRun:
    """What one run of a load generator produced."""

    figures: Figures
    raw: Path  # its per-request results, as it wrote them
    command: list[str]
    version: str


@dataclass(frozen=True)
class Target:
    """The server a load is driven against."""

    url: str
    model: str  # the `model` field of each request
    tokenizer: Path  # an HF tokenizer folder with the served model's vocabulary
    extra: dict[str, Any] = field(default_factory=dict)  # fields added to every request's body


def _last_lines(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-_TAIL:])


def _run(name: str, command: list[str], cwd: Path, log: Optional[Path] = None, env: Optional[dict] = None) -> None:
    """Run the load generator; one line when it fails: the errors of its log file (`log`) when it
    names some, else its last output. Its own process group is not needed: it ends with its
    requests, and Ctrl-C reaches it through the terminal's group."""
    result = subprocess.run(command, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        errors = []
        if log is not None and log.is_file():
            errors = [line for line in log.read_text(errors="replace").splitlines() if " ERROR " in line]
        said = " | ".join(e.strip() for e in errors[:_TAIL]) if errors else _last_lines(result.stderr + result.stdout)
        raise TrtbuildError(f"{name} failed (exit {result.returncode}): {said}")


def _read_json(path: Path, name: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise TrtbuildError(f"{name} wrote no {path.name} in {path.parent}") from None
    except ValueError as exc:
        raise TrtbuildError(f"{path}: {name}'s summary is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TrtbuildError(f"{path}: {name}'s summary is not a JSON object")
    return data


# ---- aiperf ---------------------------------------------------------------------------------------------

def aiperf_command(target: Target, workload: Workload, concurrency: int, out: Path) -> list[str]:
    command = [sys.executable, "-m", "aiperf", "profile", "--model", target.model, "--url", target.url,
               "--endpoint-type", "completions", "--streaming", "--tokenizer", str(target.tokenizer),
               "--synthetic-input-tokens-mean", str(workload.input_len), "--synthetic-input-tokens-stddev", "0",
               "--output-tokens-mean", str(workload.output_len), "--output-tokens-stddev", "0",
               "--concurrency", str(concurrency), "--request-count", str(workload.requests),
               "--random-seed", str(workload.seed), "--artifact-dir", str(out), "--ui-type", "none"]
    if workload.spread:
        command += ["--random-range-ratio", repr(workload.spread)]
    if target.extra:
        command += ["--extra-inputs", json.dumps(target.extra, sort_keys=True)]
    return command


def _aiperf_percentiles(summary: dict, metric: str, where: Path) -> Percentiles:
    entry = summary.get(metric)
    if not isinstance(entry, dict) or "avg" not in entry:
        raise TrtbuildError(f"{where}: aiperf reported no {metric} (an output of one token has no inter-token "
                            "latency: give the workload output_len 2 or more)")
    return Percentiles(mean=entry["avg"], **{f"p{p}": entry[f"p{p}"] for p in PERCENTILES})


def _aiperf_value(summary: dict, metric: str, where: Path) -> float:
    entry = summary.get(metric)
    if not isinstance(entry, dict) or "avg" not in entry:
        raise TrtbuildError(f"{where}: aiperf reported no {metric}")
    return entry["avg"]


def aiperf_failures(summary: dict) -> tuple[int, Optional[str]]:
    """(failed requests, the first error's text) from aiperf's error_summary."""
    errors = summary.get("error_summary") or []
    failed = sum(int(e.get("count", 0)) for e in errors)
    first = None
    if errors:
        details = errors[0].get("error_details") or {}
        first = details.get("message") or details.get("type") or json.dumps(details)
    return failed, first


def parse_aiperf(summary_path: Path) -> Figures:
    """Figures from aiperf's profile_export_aiperf.json. aiperf's `inter_token_latency` is per
    request (end-to-end - TTFT) / (tokens - 1): vLLM's TPOT; its `inter_chunk_latency` is every gap
    between streamed chunks: vLLM's ITL."""
    summary = _read_json(summary_path, "aiperf")
    failed, _ = aiperf_failures(summary)
    return Figures(
        ttft_ms=_aiperf_percentiles(summary, "time_to_first_token", summary_path),
        tpot_ms=_aiperf_percentiles(summary, "inter_token_latency", summary_path),
        itl_ms=_aiperf_percentiles(summary, "inter_chunk_latency", summary_path),
        e2el_ms=_aiperf_percentiles(summary, "request_latency", summary_path),
        request_throughput=_aiperf_value(summary, "request_throughput", summary_path),
        output_token_throughput=_aiperf_value(summary, "output_token_throughput", summary_path),
        total_token_throughput=_aiperf_value(summary, "total_token_throughput", summary_path),
        completed=int(_aiperf_value(summary, "request_count", summary_path)),
        failed=failed,
        input_tokens=int(_aiperf_value(summary, "total_isl", summary_path)),
        output_tokens=int(_aiperf_value(summary, "total_osl", summary_path)),
        duration_s=_aiperf_value(summary, "benchmark_duration", summary_path))


def run_aiperf(target: Target, workload: Workload, concurrency: int, out: Path) -> LoadRun:
    from trtbuild.host.toolchain import package_version

    version = package_version("aiperf")
    if version is None:
        raise TrtbuildError("aiperf is not installed; install trtbuild's bench extra (pip install 'trtbuild[bench]')")
    command = aiperf_command(target, workload, concurrency, out)
    # aiperf 0.13.0 under HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE takes every --tokenizer for a hub
    # repo id (common/tokenizer.py: _load_from_hub -> snapshot_download), and a local folder, which
    # is all bench gives it, fails with HFValidationError; a folder never needs the hub anyway
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    # aiperf leaves its dataset's memory-mapped files (aiperf_mmap_<id>/) and other scratch in the
    # temporary folder, and keeps a dataset cache in ~/.cache/aiperf: a folder of its own for the run,
    # removed after it, and no cache. A short path, as its IPC sockets under it must be (107 bytes).
    scratch = None
    try:
        with interrupt.held():  # made and guarded with no Ctrl-C between
            scratch = tempfile.mkdtemp(prefix="trtbuild-aiperf-")
        env.update(TMPDIR=scratch, AIPERF_DATASET_MMAP_BASE_PATH=scratch, AIPERF_DATASET_MMAP_CACHE_ENABLED="false")
        _run("aiperf", command, out.parent, out / "logs" / "aiperf.log", env)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    summary = _read_json(out / AIPERF_SUMMARY, "aiperf")
    failed, first = aiperf_failures(summary)
    if failed:
        raise TrtbuildError(f"aiperf: {failed} of {workload.requests} requests failed at concurrency {concurrency}: "
                            f"{first}")
    return LoadRun(parse_aiperf(out / AIPERF_SUMMARY), out / AIPERF_RECORDS, command, version)


# ---- vllm bench serve -----------------------------------------------------------------------------------

def vllm_bench_command(target: Target, workload: Workload, concurrency: int, out: Path) -> list[str]:
    command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "openai",
               "--base-url", target.url, "--endpoint", "/v1/completions", "--model", target.model,
               "--tokenizer", str(target.tokenizer), "--dataset-name", "random",
               "--random-input-len", str(workload.input_len), "--random-output-len", str(workload.output_len),
               "--num-prompts", str(workload.requests), "--max-concurrency", str(concurrency),
               "--seed", str(workload.seed), "--percentile-metrics", "ttft,tpot,itl,e2el",
               "--metric-percentiles", ",".join(PERCENTILES), "--save-result", "--save-detailed",
               "--result-dir", str(out), "--result-filename", VLLM_RESULT, "--disable-tqdm"]
    if workload.spread:
        command += ["--random-range-ratio", repr(workload.spread)]
    if target.extra.get("ignore_eos"):
        command.append("--ignore-eos")
    rest = {k: v for k, v in target.extra.items() if k != "ignore_eos"}
    if rest:
        command += ["--extra-body", json.dumps(rest, sort_keys=True)]
    return command


def _vllm_percentiles(result: dict, metric: str, where: Path) -> Percentiles:
    try:
        return Percentiles(mean=result[f"mean_{metric}_ms"], **{f"p{p}": result[f"p{p}_{metric}_ms"]
                                                                  for p in PERCENTILES})
    except KeyError as exc:
        raise TrtbuildError(f"{where}: vllm bench serve's result has no {exc.args[0]}") from None


def parse_vllm_bench(result_path: Path) -> Figures:
    """Figures from `vllm bench serve --save-result`'s JSON (its own names: mean_ttft_ms, p99_ttft_ms, ...)."""
    result = _read_json(result_path, "vllm bench serve")
    try:
        return Figures(
            ttft_ms=_vllm_percentiles(result, "ttft", result_path),
            tpot_ms=_vllm_percentiles(result, "tpot", result_path),
            itl_ms=_vllm_percentiles(result, "itl", result_path),
            e2el_ms=_vllm_percentiles(result, "e2el", result_path),
            request_throughput=result["request_throughput"], output_token_throughput=result["output_throughput"],
            total_token_throughput=result["total_token_throughput"], completed=result["completed"],
            failed=result.get("failed", 0), input_tokens=result["total_input_tokens"],
            output_tokens=result["total_output_tokens"], duration_s=result["duration"])
    except KeyError as exc:
        raise TrtbuildError(f"{result_path}: vllm bench serve's result has no {exc.args[0]}") from None


def run_vllm_bench(target: Target, workload: Workload, concurrency: int, out: Path) -> LoadRun:
    from trtbuild.host.toolchain import package_version

    version = package_version("vllm")
    if version is None:
        raise TrtbuildError("--loadgen vllm-bench: vllm is not installed in this Python")
    command = vllm_bench_command(target, workload, concurrency, out)
    _run("vllm bench serve", command, out.parent)
    result_path = out / VLLM_RESULT
    figures = parse_vllm_bench(result_path)
    if figures.failed:
        errors = [e for e in _read_json(result_path, "vllm bench serve").get("errors") or [] if e]
        raise TrtbuildError(f"vllm bench serve: {figures.failed} of {workload.requests} requests failed at "
                            f"concurrency {concurrency}: {errors[0].strip().splitlines()[-1] if errors else '?'}")
    return LoadRun(figures, result_path, command, version)


RUNNERS = {"aiperf": run_aiperf, "vllm-bench": run_vllm_bench}


def choose(loadgen: str, runtime: str) -> str:
    """`auto`: vLLM's own bench client on a vLLM server when vLLM is importable here, else aiperf
    (any OpenAI-compatible server). vllm-bench is refused on llama.cpp (see the module's doc)."""
    import importlib.util

    if loadgen == "auto":
        return "vllm-bench" if runtime == "vllm" and importlib.util.find_spec("vllm") is not None else "aiperf"
    if loadgen == "vllm-bench" and runtime == "llamacpp":
        raise TrtbuildError("--loadgen vllm-bench cannot drive llama-cpp-python's server (its x-request-id header "
                            "is refused); use aiperf")
    return loadgen
