"""Validation on SmolLM2-135M at the demo recipe's evaluation size: time and peak memory of the
reference and validate stages, the stored reference against full logits, and the error of the
top-k KL estimate against the exact KL from full logits.

    python benchmarks/validate_speed.py [--store DIR] [--windows 2]

1. Builds the embedded demo recipe with `trtbuild build --until validate` into a store (a temp
   folder unless --store) and reads each reference/validate record: seconds and peak RSS.
2. Compares the reference artifact's size with what full float32 logits would take.
3. For the FP8 variant, recomputes exact KL(reference || candidate) from full logits on --windows
   windows and compares it with the stored top-k estimate at k = 64, 128, 256, 512.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path)
    parser.add_argument("--windows", type=int, default=2)
    args = parser.parse_args()
    store = args.store or Path(tempfile.mkdtemp(prefix="trtbuild-validate-bench-"))
    env = {**os.environ, "TRTBUILD_CACHE": str(store)}
    result = subprocess.run([sys.executable, "-m", "trtbuild", "build", "--until", "validate", "--json"],
                            capture_output=True, text=True, env=env)
    if result.returncode != 0:
        print(result.stderr[-3000:])
        return 1
    targets = {t["name"]: t for t in json.loads(result.stdout)["targets"]}
    records = {json.loads(p.read_text())["target"]: json.loads(p.read_text()) for p in (store / "ac").glob("*.json")
               if not p.name.endswith(".divergent.json")}
    print("stage timings (2 cores, CPU, float32):")
    for name in ("reference", "base-tp1:validate", "int8-wo-tp1:validate", "fp8-tp1:validate"):
        record = records.get(name)
        if record:
            summary = record["summary"]
            print(f"  {name:<22} {record['seconds']:7.1f} s   peak RSS {summary.get('peak_rss_mib', float('nan')):7.0f} MiB")

    ref_dir = Path(targets["reference"]["path"])
    windows = np.load(ref_dir / "windows.npy")
    config = json.loads((Path(targets["source"]["path"]) / "config.json").read_text())
    stored = sum(p.stat().st_size for p in ref_dir.rglob("*") if p.is_file())
    full = windows.shape[0] * (windows.shape[1] - 1) * config["vocab_size"] * 4
    print(f"reference artifact: {stored / 2**20:.2f} MiB; full float32 logits would be {full / 2**20:.0f} MiB "
          f"({full / stored:.0f}x)")

    from trtbuild.validate import metrics, torch_runner

    source = Path(targets["source"]["path"])
    quantized = Path(targets["fp8-quantized"]["path"])
    reference_model = torch_runner.load_source(source, "cpu", "bfloat16")
    candidate = torch_runner.load_quantized(source, quantized, "cpu", "bfloat16")
    print(f"top-k KL error on {args.windows} windows of {windows.shape[1]} tokens (FP8 + FP8 KV candidate):")
    exact_all, approx_all = [], {k: [] for k in (64, 128, 256, 512)}
    for window in windows[:args.windows]:
        p = torch_runner._log_probs(reference_model, window, "cpu").astype(np.float64)
        q = torch_runner._log_probs(candidate, window, "cpu").astype(np.float64)
        exact_all.append((np.exp(p) * (p - q)).sum(-1))
        for k in approx_all:
            ids, top = metrics.topk_reference(p.astype(np.float32), k)
            approx_all[k].append(metrics.kl_topk(ids, top, q.astype(np.float32)))
    exact = np.concatenate(exact_all)
    print(f"  exact mean KL {exact.mean():.5f}")
    for k, values in approx_all.items():
        approx = np.concatenate(values)
        print(f"  k={k:<4} mean {approx.mean():.5f}  mean error {(exact - approx).mean():.2e} "
              f"({(exact - approx).mean() / exact.mean():.2%} of the mean)  max error {(exact - approx).max():.2e}  "
              f"lower bound everywhere (to float32 rounding, 1e-6): {bool(np.all(approx <= exact + 1e-6))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
