"""`trtbuild bench`: serving measurements of a recipe's artifacts on their runtime (trtbuild/bench/)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtbuild.facts.runtime_names import BENCH_RUNTIMES, RUNTIMES

JSON_SCHEMA_VERSION = 1  # docs/schemas/bench.schema.json


def _mib(value) -> str:
    return "-" if value is None else f"{value:,.0f} MiB"


def _table(records) -> None:
    from rich.table import Table

    from trtbuild.cli.common import console

    table = Table(show_lines=False)
    for column in ("target", "runtime", "workload", "conc.", "TTFT p50", "TTFT p99", "TPOT p50", "ITL p50",
                   "E2EL p99", "req/s", "tok/s", "ready", "peak mem"):
        table.add_column(column, justify="left" if column in ("target", "runtime", "workload") else "right")
    for r in records:
        f = r.figures
        memory = _mib(r.peak_gpu_memory_mib) + " GPU" if r.peak_gpu_memory_mib is not None \
            else _mib(r.peak_rss_mib) + " RSS"
        table.add_row(r.target, f"{r.runtime} {r.runtime_version}", r.workload, str(r.workload_spec["concurrency"]),
                      f"{f.ttft_ms.p50:.1f} ms", f"{f.ttft_ms.p99:.1f} ms", f"{f.tpot_ms.p50:.1f} ms",
                      f"{f.itl_ms.p50:.1f} ms", f"{f.e2el_ms.p99:.1f} ms", f"{f.request_throughput:.2f}",
                      f"{f.output_token_throughput:.1f}", f"{r.time_to_ready_s:.1f} s", memory)
    console().print(table)


@click.command("bench")
@click.argument("recipe_or_lock", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--target", "targets", multiple=True, required=True, metavar="NAME",
              help="A target to measure (repeat for several): its artifact in the local store, built or pulled.")
@click.option("--runtime", type=click.Choice(["auto", *BENCH_RUNTIMES]), default="auto",
              show_default=True, help="What serves it. auto: llamacpp for a gguf target, trtllm for an engine, for an "
              f"hf-checkpoint the first installed of {', '.join(RUNTIMES)}.")
@click.option("--workload", "workloads", multiple=True, metavar="NAME",
              help="A workload of the recipe's bench: section (or of --workloads) to run (repeat for several; "
                   "default: all).")
@click.option("--workloads", "workloads_file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="A YAML file with the fields of a bench: section (workloads, ready_timeout_s), used instead of "
                   "the recipe's: another load without editing the recipe, whose digest its lock records.")
@click.option("--loadgen", type=click.Choice(["auto", "aiperf", "vllm-bench"]), default="auto", show_default=True,
              help="The load generator. auto: vLLM's `vllm bench serve` for a vLLM server when vLLM is installed "
                   "here, else NVIDIA aiperf (any OpenAI-compatible server; the bench extra installs it).")
@click.option("--capture-warm-start", is_flag=True,
              help="vllm, trtllm: start the runtime on an empty cache folder, and after the runs start it again on "
                   "what it compiled and tuned there; store that folder as the artifact's warm-start cache, keyed "
                   "by this host (`pull --warm-start` installs it where every part of the key matches), with both "
                   "times to ready.")
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON ({\"schema\": 1, \"records\": [...]}).")
def bench(recipe_or_lock: Path | None, targets, runtime, workloads, workloads_file, loadgen, capture_warm_start,
          as_json) -> None:
    """Measure TARGET's artifact of RECIPE_OR_LOCK (default: the embedded demo recipe; a `.lock`
    file on a deploy host that pulled by it, with the default workloads unless --workloads names
    others) on the runtime that serves it: start the runtime from the options the artifact packages on a loopback port, wait
    until GET /v1/models answers (recipe bench.ready_timeout_s), drive each workload at each of its
    concurrency levels with the load generator, and record TTFT, TPOT, ITL and end-to-end latency
    (mean, P50, P90, P95, P99), request and token throughput, time to ready and peak memory (GPU
    memory through NVML on a GPU, the server's resident memory always), with the generator's raw
    per-request results. Records are written into the local store ($TRTBUILD_CACHE, else ./cache)
    under bench/<artifact digest>/, one per workload and concurrency, as each run ends; `trtbuild
    push` carries them to the shared store. The server is stopped, its whole process group, however
    the command ends. Exit 0; 1 when the artifact is not in the local store, its server does not
    start, or a request fails; 2 on invalid input; 130 on Ctrl-C.
    """
    from trtbuild.bench.run import bench as run_bench

    say = (lambda line: None) if as_json else (lambda line: click.echo(line, err=True))
    records = run_bench(recipe_or_lock, list(targets), runtime, list(workloads) or None, loadgen, workloads_file, say=say,
                        capture_warm_start=capture_warm_start)
    if as_json:
        click.echo(json.dumps({"schema": JSON_SCHEMA_VERSION,
                               "records": [r.model_dump(mode="json", by_alias=True) for r in records]}, indent=2))
    else:
        _table(records)
