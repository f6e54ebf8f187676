"""Runs stages in a subprocess: `python -m trtbuild.builder.stages.worker SPEC.json` runs one;
`python -m trtbuild.builder.stages.worker --serve` runs one after another (worker_pool.WorkerPool: the stages of
a variant share one process, its imports and its model: stages/models.py), each reading a line
`{"spec": PATH, "log": PATH}` on stdin and answering `{"returncode": N}` on stdout.

The runner sends stdout and stderr to a log beside the output folder (stored as a blob and named in
the action record, never inside the artifact); the last line of a failure is
`TRTBUILD-ERROR: <one line>`, which the runner shows as the reason. On success the worker writes
its peak memory and the stage's measurements to the spec's `execution` file.
"""

from __future__ import annotations

import gc
import importlib
import json
import sys
import traceback
from pathlib import Path

from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.builder.stages.base import StageContext

ERROR_PREFIX = "TRTBUILD-ERROR: "
INPUT_ERROR_PREFIX = "TRTBUILD-INPUT-ERROR: "  # the stage's input is wrong: trtbuild exits 2, like any input error
PROGRESS_PREFIX = "TRTBUILD-PROGRESS: "  # `done/total label`: the runner shows it as a progress bar


def report_progress(done: int, total: int, label: str) -> None:
    """From a stage in a worker: one line the runner turns into its progress bar."""
    print(f"{PROGRESS_PREFIX}{done}/{total} {label}", flush=True)


def peak_rss_mib() -> float:
    """This process's peak resident memory since the last reset_peak_rss (Linux's VmHWM; where
    /proc has none, ru_maxrss: the peak of the whole process)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def reset_peak_rss() -> None:
    """Start the peak over at the current resident memory (writing 5 to clear_refs resets VmHWM),
    so a stage in a shared worker reports its own peak, the kept model included."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def load_entry(entry: str):
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)


# torch's default generator starts from this seed in every new process: a stage in a shared
# worker starts from it too, so no stage's output depends on the stages that ran before it.
TORCH_DEFAULT_SEED = 67280421310721


def _fresh_start() -> None:
    reset_peak_rss()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(TORCH_DEFAULT_SEED)


def run(spec_path: str) -> int:
    """Run the stage that SPEC.json names; 0 when it succeeded."""
    from trtbuild.builder.stages import models

    spec = json.loads(Path(spec_path).read_text())
    ctx = StageContext(
        out=Path(spec["out"]),
        inputs={k: Path(v) for k, v in spec["inputs"].items()},
        params=spec["params"],
        runtime=spec["runtime"],
    )
    _fresh_start()
    loads_before, reads_before = models.loads, models.read_backs
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
        import os

        # which process ran it (stages of a shared worker share one): the record's, like the host
        figures = {**ctx.figures, "model_loads": models.loads - loads_before,
                   "checkpoint_reads": models.read_backs - reads_before, "worker_pid": os.getpid()}
        Path(spec["execution"]).write_text(json.dumps({"peak_rss_mib": peak_rss_mib(), "figures": figures}))
    return 0


def serve() -> int:
    """Run stages from stdin until it closes. Each stage's stdout and stderr (file descriptors 1
    and 2, so the tools' own output too) go to its log; the answers go out on the stdout this
    process started with. A stage that fails leaves the process serving (its model is released);
    one that crashes it is reported by the runner from the exit status."""
    import os

    from trtbuild.builder.stages import models

    # The requests and answers move to descriptors of their own: a stage (or a tool it starts) sees
    # /dev/null on 0 and its log on 1 and 2, as in a process of its own, and can read no request.
    requests = os.fdopen(os.dup(0), "r")
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(os.devnull)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    for line in requests:
        request = json.loads(line)
        if request.get("release"):
            models.release()
            answers.write(json.dumps({"released": True}) + "\n")
            continue
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        try:
            returncode = run(request["spec"])
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
        if returncode != 0:
            models.release()  # a failed stage may have left the kept model half-changed
        answers.write(json.dumps({"returncode": returncode}) + "\n")
        # What the stage left in reference cycles goes now, while the runner stores the stage's output,
        # instead of whenever the collector next visits it, stages later: the copies of a quantized
        # model that the exports and validation make end as such garbage (ModelOpt's quantizers), 3.4,
        # 6.8 and 1.7 GB of a 4 GB model's, which weighed on the stages after them. About 0.4 s.
        gc.collect()
    return 0


def main(argv: list[str]) -> int:
    return serve() if argv == ["--serve"] else run(argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
