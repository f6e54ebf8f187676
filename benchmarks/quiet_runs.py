"""Benchmark children run on a quiet machine (for checkpoint_speed.py): each run in a fresh
interpreter, started once other processes keep fewer than QUIET_CORES cores busy, with the cores
they kept busy meanwhile measured and a disturbed run done again (RETRIES): on a shared 2-core
machine someone's test suite can double every time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all cores, all processes), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


QUIET_CORES = 0.25  # what counts as an idle machine
QUIET_WAIT_S = 300   # how long to wait for one before each run (--smoke: 0, no wait)


def wait_quiet() -> float:
    """Wait (up to QUIET_WAIT_S) until other processes keep fewer than QUIET_CORES cores busy over a
    2 s window, so that runs do not share the 2 cores with someone's test suite. Returns the seconds
    waited."""
    start = time.perf_counter()
    while QUIET_WAIT_S > 0:
        before = busy_cpu_seconds()
        time.sleep(2)
        if (busy_cpu_seconds() - before) / 2 < QUIET_CORES or time.perf_counter() - start > QUIET_WAIT_S:
            break
    return time.perf_counter() - start


RETRIES = 2  # --retries: reruns of a run that others disturbed


def run_child(code: str, args: list[str], log: Path) -> dict:
    """`run_once`, rerun up to RETRIES times while other processes kept more than QUIET_CORES cores
    busy during the run; the least disturbed run is returned (with `attempts`)."""
    best = None
    for attempt in range(1 + RETRIES):
        report = run_once(code, args, log)
        report["attempts"] = attempt + 1
        if best is None or report["others_cores"] < best["others_cores"]:
            best = report
        if report["others_cores"] <= QUIET_CORES:
            break
        print(f"  (disturbed: other processes kept {report['others_cores']:.2f} cores busy; "
              f"{'running it again' if attempt < RETRIES else 'keeping the least disturbed run'})", flush=True)
    return best


def run_once(code: str, args: list[str], log: Path) -> dict:
    """Run `code` in a fresh interpreter; its last stdout line is a JSON report. stderr goes to `log`.
    Adds process_s (wall) and others_cores: the cores other processes kept busy meanwhile (machine
    busy time minus the child's own CPU time, over the wall time): other work on these 2 cores
    slows every figure, so it is printed with each run (kernel write-back of the files the child
    wrote counts there too). Each run starts once the machine is idle (`wait_quiet`)."""
    waited = wait_quiet()
    if waited > 5:
        print(f"  (waited {waited:.0f} s for an idle machine)", flush=True)
    busy = busy_cpu_seconds()
    start = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.run([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=err, text=True,
                              cwd=REPO, env=child_env())
    wall = time.perf_counter() - start
    busy = busy_cpu_seconds() - busy
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"child failed ({proc.returncode}), log {log}:\n{tail}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    report["process_s"] = wall
    report["others_cores"] = max(0.0, busy - report["cpu_s"]) / wall
    report["waited_s"] = waited
    return report
