"""The demo recipe built cold and warm: wall time, stage processes and model loads (issue #15).

    python benchmarks/pipeline_speed.py [--until validate] [--fresh-processes] [--keep]

Builds the embedded demo recipe (SmolLM2-135M: base, int4-wo and fp8, their TensorRT-LLM and
Hugging Face checkpoints and validations) with `trtbuild build --until UNTIL --json` into a new
temporary store, then again into the same store (warm: everything cached). Reads every action
record the cold build wrote and reports, per stage: seconds, the process that ran it
(`worker_pid`), and `model_loads` (a source or quantized model read from disk; a shared worker's
kept model counts 0) and `checkpoint_reads` (a written checkpoint read back to validate it: the
check itself). The source stage (dequantizing the GGUF) is built first, apart, and not counted:
it is the same in both modes.

--fresh-processes runs every stage in a process of its own, as trtbuild did before the shared
worker (each stage restores the model from the store): the baseline of the comparison.

Goals: one model load per variant on a cold build, none on a warm one. Exits 1 when missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FRESH = """
import dataclasses, sys
from trtbuild.stages import registry
for kind, stage in list(registry.STAGES.items()):
    if stage is not None:
        registry.STAGES[kind] = dataclasses.replace(stage, shares_worker=False)
from trtbuild.cli import main
sys.argv = ["trtbuild", *sys.argv[1:]]
main()
"""


def build(store: Path, until: str, fresh: bool) -> tuple[float, dict]:
    command = [sys.executable, "-c", FRESH] if fresh else [sys.executable, "-m", "trtbuild"]
    started = time.monotonic()
    result = subprocess.run([*command, "build", "--until", until, "--json"], capture_output=True, text=True,
                            env={**os.environ, "TRTBUILD_CACHE": str(store)}, cwd=REPO)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"build failed: {result.stderr[-2000:]}")
    return seconds, {t["name"]: t for t in json.loads(result.stdout)["targets"]}


def variant(name: str) -> str:
    return "(source)" if name in ("source", "reference", "calibration") else name.split("-tp")[0].split("-hf")[0].split("-quantized")[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--until", default="validate")
    parser.add_argument("--fresh-processes", action="store_true", help="every stage in a process of its own (the baseline)")
    parser.add_argument("--keep", action="store_true", help="keep the store")
    args = parser.parse_args()
    store = Path(tempfile.mkdtemp(prefix="trtbuild-pipeline-bench-")) / "store"
    try:
        build(store, "source", False)
        cold_s, cold = build(store, args.until, args.fresh_processes)
        warm_s, warm = build(store, args.until, args.fresh_processes)
        sys.path.insert(0, str(REPO))
        from trtbuild.store.local import LocalStore

        local = LocalStore(store)
        rows = []
        for name, target in cold.items():
            if target["status"] != "built":
                continue
            execution = local.get_record(target["key"]).execution
            rows.append((name, execution.seconds, execution.figures.get("worker_pid"),
                         execution.figures.get("model_loads"), execution.figures.get("checkpoint_reads")))
        print(f"mode: {'a fresh process per stage' if args.fresh_processes else 'shared worker'}; --until {args.until}")
        print(f"{'stage':<24} {'seconds':>8} {'process':>8} {'loads':>6} {'reads':>6}")
        for row in rows:
            print(f"{row[0]:<24} {row[1]:8.1f} {str(row[2]):>8} {str(row[3]):>6} {str(row[4]):>6}")
        loads = defaultdict(int)
        for name, _, _, n, _ in rows:
            loads[variant(name)] += n or 0
        processes = len({row[2] for row in rows if row[2] is not None})
        cached = sum(t["status"] == "cached" for t in warm.values())
        built_warm = sum(t["status"] == "built" for t in warm.values())
        print(f"cold build: {cold_s:.1f} s wall, {len(rows)} stages built in {processes} stage processes; "
              f"model loads by variant: {dict(loads)}")
        print(f"warm build: {warm_s:.2f} s wall, {cached} cached, {built_warm} built (0 model loads: nothing ran)")
        quantized = [v for v in loads if v not in ("(source)", "base")]
        met = all(loads[v] == 1 for v in quantized) and built_warm == 0
        print(f"goal (one model load per quantized variant cold, none warm): {'met' if met else 'MISSED'}")
        return 0 if met or args.fresh_processes else 1
    finally:
        if not args.keep:
            shutil.rmtree(store.parent, ignore_errors=True)
        else:
            print(f"store kept: {store}")


if __name__ == "__main__":
    sys.exit(main())
