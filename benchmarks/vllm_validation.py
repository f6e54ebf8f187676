"""Validation through a real vLLM beside trtbuild's torch runner: the same windows, the same
reference, the same metrics and gates (issue #22).

Two steps, because the build and the GPU are on different machines:

  pack   here, after `trtbuild build --json > build.json`: copies what the vLLM run needs out of the
         store (the reference's windows and logits, each hf-checkpoint, and the torch runner's
         validation report of that checkpoint) into one folder, small enough to carry.
  run    on the host with the GPU and vLLM: each checkpoint loaded by vLLM with its packaged
         serving/vllm_args.json (trtbuild.validate.vllm_runner, the code `validate-vllm` runs),
         scored on the windows, compared with the reference, gated with the torch report's limits;
         prints one row per (checkpoint, runner), and with --json the rows as JSON.

    python benchmarks/vllm_validation.py pack build.json OUT --targets base-hf,fp8-hf
    python benchmarks/vllm_validation.py run OUT [--json]

Smoke size (the test suite): `run` against tests/standin_vllm (which names itself in the runner
column) on a pack of a tiny model's build.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REFERENCE_FILES = ("windows.npy", "reference.npz", "report.json")
HEADLINE = ("kld_mean", "kld_p99", "top1_agreement", "ppl", "ppl_delta_pct")


def pack(build_json: Path, out: Path, targets: list[str]) -> None:
    """Copy the reference and each target's checkpoint and torch validation report into `out`."""
    rows = {row["name"]: row for row in json.loads(build_json.read_text())["targets"]}
    missing = [name for name in ["reference", *targets, *(f"{t}:validate" for t in targets)]
               if name not in rows or not rows[name].get("path")]
    if missing:
        sys.exit(f"{build_json}: no built or cached {', '.join(missing)} (run `trtbuild build --json` first)")
    out.mkdir(parents=True, exist_ok=False)
    (out / "reference").mkdir()
    for name in REFERENCE_FILES:
        shutil.copyfile(Path(rows["reference"]["path"]) / name, out / "reference" / name)
    for target in targets:
        shutil.copytree(rows[target]["path"], out / target)
        shutil.copyfile(Path(rows[f"{target}:validate"]["path"]) / "report.json", out / f"{target}.torch.json")
    (out / "targets.json").write_text(json.dumps(targets) + "\n")
    print(f"packed reference and {', '.join(targets)} into {out}")


def run(folder: Path) -> list[dict]:
    """One row per checkpoint for vLLM (run here) and for the torch runner (its packed report)."""
    import numpy as np

    from trtbuild.host import toolchain
    from trtbuild.validate import metrics, vllm_runner

    windows = np.load(folder / "reference" / "windows.npy")
    with np.load(folder / "reference" / "reference.npz") as data:
        ref = {k: data[k] for k in data.files}
    rows = []
    for target in json.loads((folder / "targets.json").read_text()):
        torch_report = json.loads((folder / f"{target}.torch.json").read_text())
        rows.append(_row(target, torch_report))
        checkpoint = folder / target
        options, origin = vllm_runner.load_options(checkpoint, {})
        candidate = vllm_runner.run(checkpoint, windows, ref["topk_ids"], options)
        result = metrics.summarize(vllm_runner.compare(candidate, ref))
        limits = {name: gate["limit"] for name, gate in torch_report["gates"].items()}
        gates, _, _ = metrics.evaluate_gates(result, limits)
        rows.append(_row(target, {"runner": f"vllm {toolchain.package_version('vllm')}", "device": candidate["device"],
                                  "gpus": candidate.get("gpus"), "metrics": result.as_json(),
                                  "gates": {name: gate.model_dump(mode="json") for name, gate in gates.items()},
                                  "load_options": options, "load_options_from": origin}))
    return rows


def _row(target: str, report: dict) -> dict:
    m = report["metrics"]
    return {"target": target, "runner": report["runner"], "device": report["device"], "gpus": report.get("gpus"),
            **{k: m[k] for k in HEADLINE}, "tokens": m["tokens"],
            "gates_passed": all(g["passed"] for g in report["gates"].values()),
            "failed": sorted(n for n, g in report["gates"].items() if not g["passed"]),
            **({"load_options": report["load_options"]} if "load_options" in report else {})}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="copy the reference, checkpoints and torch reports out of a build")
    p.add_argument("build_json", type=Path, help="the output of `trtbuild build --json`")
    p.add_argument("out", type=Path, help="a new folder")
    p.add_argument("--targets", default="base-hf,fp8-hf", help="comma-separated hf-checkpoint targets")
    r = sub.add_parser("run", help="validate each packed checkpoint through vLLM on this host")
    r.add_argument("folder", type=Path)
    r.add_argument("--json", action="store_true", help="the rows as JSON")
    args = parser.parse_args(argv)
    if args.command == "pack":
        pack(args.build_json, args.out, [t for t in args.targets.split(",") if t])
        return 0
    rows = run(args.folder)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'target':<10} {'runner':<22} {'device':<8} {'KL mean':>9} {'KL p99':>9} {'top-1':>7} {'ppl':>8} "
          f"{'ppl %':>7}  gates")
    for row in rows:
        print(f"{row['target']:<10} {row['runner']:<22} {row['device']:<8} {row['kld_mean']:>9.5f} "
              f"{row['kld_p99']:>9.5f} {row['top1_agreement']:>7.4f} {row['ppl']:>8.3f} {row['ppl_delta_pct']:>+7.2f}  "
              f"{'pass' if row['gates_passed'] else 'FAIL ' + ','.join(row['failed'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
