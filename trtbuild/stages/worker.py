"""Runs one stage in a subprocess: `python -m trtbuild.stages.worker SPEC.json`.

The runner sends stdout and stderr to a log beside the output folder (stored as a blob and named in
the action record, never inside the artifact); the last line of a failure is
`TRTBUILD-ERROR: <one line>`, which the runner shows as the reason. On success the worker writes
its peak memory and the stage's measurements to the spec's `execution` file.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from pathlib import Path

from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.stages.base import StageContext

ERROR_PREFIX = "TRTBUILD-ERROR: "
INPUT_ERROR_PREFIX = "TRTBUILD-INPUT-ERROR: "  # the stage's input is wrong: trtbuild exits 2, like any input error
PROGRESS_PREFIX = "TRTBUILD-PROGRESS: "  # `done/total label`: the runner shows it as a progress bar


def report_progress(done: int, total: int, label: str) -> None:
    """From a stage in a worker: one line the runner turns into its progress bar."""
    print(f"{PROGRESS_PREFIX}{done}/{total} {label}", flush=True)


def peak_rss_mib() -> float:
    """This worker's peak resident memory so far (Linux reports ru_maxrss in KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def load_entry(entry: str):
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    ctx = StageContext(
        out=Path(spec["out"]),
        inputs={k: Path(v) for k, v in spec["inputs"].items()},
        params=spec["params"],
        runtime=spec["runtime"],
    )
    try:
        load_entry(spec["entry"])(ctx)
    except InvalidInput as exc:
        print(f"{INPUT_ERROR_PREFIX}{' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        return 1
    except BaseException as exc:  # the parent needs one line, the log keeps the traceback
        if not isinstance(exc, TrtbuildError):  # trtbuild's own errors say all there is: the log ends with the tool's output
            traceback.print_exc()
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        print(f"{ERROR_PREFIX}{message}", file=sys.stderr, flush=True)
        return 1
    if ctx.adopted is not None:
        print(f"{ERROR_PREFIX}an isolated stage cannot adopt a folder", file=sys.stderr, flush=True)
        return 1
    if spec.get("execution"):
        Path(spec["execution"]).write_text(json.dumps({"peak_rss_mib": peak_rss_mib(), "figures": ctx.figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
