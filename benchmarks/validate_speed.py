"""Validation on SmolLM2-135M at the demo recipe's evaluation size: time and peak memory of the
reference and validate stages, the stored reference against full logits, and the error of the
top-k KL estimate against the exact KL from full logits.

    python benchmarks/validate_speed.py [--recipe FILE] [--variant fp8] [--windows 2] [--store DIR] [--json]

1. Builds the recipe (the embedded demo recipe unless --recipe) with `trtbuild build --until
   validate --json` into a store (a temporary folder unless --store) and reads the action record
   of each reference and validate target: its `execution` (seconds, peak RSS of the stage
   process). A target found cached shows the figures of the run that built it.
2. Compares the reference artifact's size with what full float32 logits of its windows would take.
3. For --variant (a quantized variant of the recipe, default fp8: the demo's FP8 + FP8 KV),
   recomputes exact KL(reference || candidate) from full logits on the first --windows windows and
   compares it with the top-k estimate trtbuild stores, at k = 64, 128, 256, 512 (those below the
   vocabulary size). The two models
   are what the validate stage computes with on a CPU: the source loaded by the torch runner, and
   the quantized model restored bit for bit from the variant's quantize artifact, both in float32.

--json prints the figures as one JSON object instead of the text. The machine's load averages
(1, 5, 15 min) are printed at the start and the end: on a shared 2-core machine other work can
double every time. tests/test_benchmarks.py runs this on a tiny model (--recipe) at a smoke size.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
KS = (64, 128, 256, 512)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def build(store: Path, recipe: Path | None) -> dict[str, dict]:
    """`trtbuild build [RECIPE] --until validate --json` into `store`: its targets by name."""
    command = [sys.executable, "-m", "trtbuild", "build", *([str(recipe)] if recipe else []), "--until", "validate",
               "--json"]
    # the trtbuild of this checkout, whatever the current folder (the recipe's, for its relative paths)
    env = {**os.environ, "TRTBUILD_CACHE": str(store),
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=recipe.parent if recipe else REPO)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command[1:])} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    targets = {t["name"]: t for t in json.loads(result.stdout)["targets"]}
    if targets.get("reference", {}).get("status") not in ("built", "cached"):
        statuses = ", ".join(f"{name} {target['status']}" for name, target in targets.items())
        sys.exit(f"{recipe or 'the demo recipe'}: no reference was built (nothing to validate: {statuses})")
    return targets


def stage_rows(store: Path, targets: dict[str, dict]) -> list[dict]:
    """Seconds and peak RSS of every reference and validate target the build has, from its record."""
    from trtbuild.store.local import LocalStore

    local = LocalStore(store)
    rows = []
    for name, target in targets.items():
        if target["stage"] not in ("reference", "validate") or target["status"] not in ("built", "cached"):
            continue
        execution = local.get_record(target["key"]).execution
        rows.append({"target": name, "status": target["status"], "seconds": execution.seconds,
                     "peak_rss_mib": execution.peak_rss_mib})
    return rows


def topk_error(targets: dict[str, dict], variant: str, windows_used: int) -> dict:
    """Exact KL from full logits against the top-k estimate, on the first `windows_used` windows."""
    import numpy as np

    from trtbuild.checkpoint.quantstate import MANIFEST_FILE, restore_quantized
    from trtbuild.builder.stages.validate import WINDOWS
    from trtbuild.validate import metrics, torch_runner

    if f"{variant}-quantized" not in targets:
        sys.exit(f"--variant {variant}: the recipe has no quantized variant of that name "
                 f"(quantized: {', '.join(sorted(n[:-len('-quantized')] for n in targets if n.endswith('-quantized')))})")
    source = Path(targets["source"]["path"])
    quantized = Path(targets[f"{variant}-quantized"]["path"])
    dtype = json.loads((quantized / MANIFEST_FILE).read_text())["dtype"]  # what quantize ran in
    windows = np.load(Path(targets["reference"]["path"]) / WINDOWS)[:windows_used]
    reference_model = torch_runner.load_source(source, "cpu", dtype)
    candidate = torch_runner.in_compute_dtype(restore_quantized(source, quantized, dtype, "cpu"), "cpu", dtype)
    # k at least the vocabulary would be the exact KL (a tiny model's vocabulary is 512)
    exact_all, approx_all = [], {k: [] for k in KS if k < reference_model.config.vocab_size}
    for window in windows:
        p = torch_runner._log_probs(reference_model, window, "cpu")
        q = torch_runner._log_probs(candidate, window, "cpu")
        exact_all.append((np.exp(p.astype(np.float64)) * (p.astype(np.float64) - q.astype(np.float64))).sum(-1))
        for k in approx_all:
            ids, top = metrics.topk_reference(p, k)
            approx_all[k].append(metrics.kl_topk(ids, top, q))
    exact = np.concatenate(exact_all)
    rows = []
    for k, values in approx_all.items():
        approx = np.concatenate(values)
        error = exact - approx
        rows.append({"k": k, "mean_kl": float(approx.mean()), "mean_error": float(error.mean()),
                     "mean_error_fraction": float(error.mean() / exact.mean()), "max_error": float(error.max()),
                     # the estimate is a lower bound; float32 rounding may put it up to 1e-6 above
                     "lower_bound": bool(np.all(approx <= exact + 1e-6))})
    return {"variant": variant, "dtype": dtype, "compute_dtype": "float32", "windows": int(windows.shape[0]),
            "seq_len": int(windows.shape[1]), "exact_mean_kl": float(exact.mean()), "topk": rows}


def reference_size(targets: dict[str, dict]) -> dict:
    import numpy as np

    from trtbuild.builder.stages.validate import WINDOWS

    folder = Path(targets["reference"]["path"])
    windows = np.load(folder / WINDOWS)
    vocab = json.loads((Path(targets["source"]["path"]) / "config.json").read_text())["vocab_size"]
    stored = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    full = windows.shape[0] * (windows.shape[1] - 1) * vocab * 4
    return {"windows": int(windows.shape[0]), "seq_len": int(windows.shape[1]), "vocab_size": vocab,
            "stored_mib": stored / 2**20, "full_logits_mib": full / 2**20, "ratio": full / stored}


def print_report(report: dict) -> None:
    print(f"{report['cpus']} CPUs; load average (1, 5, 15 min) at start {report['load_average']['start']}")
    print("stage timings (from the action records; cached: the run that built it):")
    for row in report["stages"]:
        rss = "-" if row["peak_rss_mib"] is None else f"{row['peak_rss_mib']:.0f}"
        print(f"  {row['target']:<24} {row['status']:<7} {row['seconds']:8.1f} s   peak RSS {rss:>6} MiB")
    r = report["reference"]
    print(f"reference artifact ({r['windows']} windows x {r['seq_len']} tokens, vocab {r['vocab_size']}): "
          f"{r['stored_mib']:.2f} MiB; full float32 logits would be {r['full_logits_mib']:.1f} MiB ({r['ratio']:.0f}x)")
    e = report["topk_error"]
    print(f"top-k KL error on {e['windows']} windows of {e['seq_len']} tokens ({e['variant']} candidate, "
          f"quantized in {e['dtype']}, computed in {e['compute_dtype']}):")
    print(f"  exact mean KL {e['exact_mean_kl']:.5f}")
    for row in e["topk"]:
        print(f"  k={row['k']:<4} mean {row['mean_kl']:.5f}  mean error {row['mean_error']:.2e} "
              f"({row['mean_error_fraction']:.2%} of the mean)  max error {row['max_error']:.2e}  "
              f"lower bound everywhere (to float32 rounding, 1e-6): {row['lower_bound']}")
    print(f"load average at end {report['load_average']['end']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, help="a recipe file (default: the embedded demo recipe)")
    parser.add_argument("--variant", default="fp8", help="the quantized variant whose top-k KL error is measured")
    parser.add_argument("--store", type=Path, help="the store to build into (default: a temporary folder)")
    parser.add_argument("--windows", type=int, default=2, help="windows of the top-k KL comparison (default 2)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.windows < 1:
        parser.error("--windows must be at least 1")
    store = args.store or Path(tempfile.mkdtemp(prefix="trtbuild-validate-bench-"))
    report: dict = {"cpus": os.cpu_count(), "load_average": {"start": load_average()}}
    try:
        targets = build(store, args.recipe.resolve() if args.recipe else None)
        report["stages"] = stage_rows(store, targets)
        report["reference"] = reference_size(targets)
        with contextlib.redirect_stdout(sys.stderr):  # ModelOpt prints as it restores: keep stdout the report's
            report["topk_error"] = topk_error(targets, args.variant, args.windows)
    finally:
        if not args.store:
            shutil.rmtree(store, ignore_errors=True)
    report["load_average"]["end"] = load_average()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
