"""Stage processes for the runner: a fresh one per stage, or one shared by the stages that ask.

Stages that share a worker (Stage.shares_worker: the torch stages) run one after another in one
long-lived process (`python -m trtbuild.builder.stages.worker --serve`), which pays the imports once
(ModelOpt's alone take 5-20 s) and keeps the last model it loaded (stages/models.py), so a
variant's quantize, exports and validation load the model once. The pool starts that process only
when a stage must run (a build served from the store starts none), and starts a new one if a stage
crashed it. Every stage still has its own spec, output folder, log and action record.

Before a stage that runs in a process of its own (an engine build, TensorRT-LLM or vLLM
validation, which need the GPU's memory), the shared worker lets go of its model.

A run that ends while a stage works (Ctrl-C, any error of the runner's own) kills the stage's
process and waits for it before the error goes on: the runner then removes the stage's folder, and
no process is left to write into it, or anywhere, afterwards.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

from trtbuild import interrupt
from trtbuild.builder.stages.worker import PROGRESS_PREFIX

POLL_S = 0.5  # how often a running stage's log is read for progress lines


class WorkerPool:
    def __init__(self) -> None:
        self._shared: Optional[subprocess.Popen] = None

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, spec: Path, log: Path, shared: bool, on_progress: Callable[[int, int, str], None]) -> int:
        """Run the stage `spec` names with its output in `log`; its exit status (negative: the
        signal that killed its process)."""
        if not shared:
            self.release()
            proc = None
            try:
                with open(log, "wb") as handle:
                    with interrupt.held():  # one landing inside Popen left the process running, unknown to anyone
                        proc = subprocess.Popen([sys.executable, "-m", "trtbuild.builder.stages.worker", str(spec)],
                                                stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                preexec_fn=_die_with_parent)
                    return _follow(proc, log, on_progress, lambda: proc.wait(timeout=POLL_S))
            except BaseException:
                if proc is not None:
                    _kill(proc)
                raise
        try:
            proc = self._worker(log)
            try:
                proc.stdin.write(json.dumps({"spec": str(spec), "log": str(log)}) + "\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                # It exited before reading (a broken install is quick): its status is the stage's.
                return self._gone(proc)
            return _follow(proc, log, on_progress, lambda: self._answer(proc))
        except BaseException:  # the stage is abandoned: so is the worker that runs it
            self._abandon()
            raise

    def release(self) -> None:
        """Ask the shared worker, if there is one, to let go of its model and GPU memory."""
        if self._shared is None:
            return
        try:
            self._shared.stdin.write(json.dumps({"release": True}) + "\n")
            self._shared.stdin.flush()
            ready, _, _ = select.select([self._shared.stdout], [], [], 60)
            if ready and self._shared.stdout.readline():
                return
        except (BrokenPipeError, OSError):
            pass
        self.close()  # it did not answer: a new one starts when needed

    def close(self) -> None:
        proc, self._shared = self._shared, None
        if proc is None:
            return
        try:
            proc.stdin.close()  # the worker ends when its input does
            proc.wait(timeout=30)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            proc.stdout.close()

    def _abandon(self) -> None:
        """Kill the shared worker (its stage is given up) and forget it."""
        proc, self._shared = self._shared, None
        if proc is None:
            return
        _kill(proc)
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except (BrokenPipeError, OSError):
                pass

    def _worker(self, log: Path) -> subprocess.Popen:
        """The shared worker, started if there is none. Until it serves, its stderr is the first
        stage's log: a worker that cannot start (a broken install) says why there, as a stage
        process of its own would; serving, it points descriptors 1 and 2 at each stage's log."""
        if self._shared is None or self._shared.poll() is not None:
            with open(log, "wb") as first_log, interrupt.held():
                self._shared = subprocess.Popen([sys.executable, "-m", "trtbuild.builder.stages.worker", "--serve"],
                                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=first_log,
                                                text=True, bufsize=1, preexec_fn=_die_with_parent)
        return self._shared

    def _answer(self, proc: subprocess.Popen) -> Optional[int]:
        """The stage's exit status once the worker answers (or dies); None while it runs."""
        ready, _, _ = select.select([proc.stdout], [], [], POLL_S)
        if not ready:
            return None
        line = proc.stdout.readline()
        if line:
            return int(json.loads(line)["returncode"])
        return self._gone(proc)  # the process died with the stage

    def _gone(self, proc: subprocess.Popen) -> int:
        """A shared worker that died: its exit status is the stage's (never 0), and the next
        shared stage starts a new one."""
        returncode = proc.wait()
        self._shared = None
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except (BrokenPipeError, OSError):
                pass
        return returncode if returncode != 0 else 1


def _follow(proc: subprocess.Popen, log: Path, on_progress, poll: Callable[[], Optional[int]]) -> int:
    """Wait for a stage, turning its progress lines into on_progress calls."""
    offset = 0
    while True:
        interrupt.check()  # a Ctrl-C whose exception Python dropped (trtbuild/interrupt.py)
        try:
            returncode = poll()
        except subprocess.TimeoutExpired:
            returncode = None
        try:
            with open(log, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        except FileNotFoundError:  # a shared worker opens the log itself
            chunk = b""
        complete = chunk.rfind(b"\n") + 1
        offset += complete
        for line in chunk[:complete].decode(errors="replace").splitlines():
            if line.startswith(PROGRESS_PREFIX):
                counts, _, label = line[len(PROGRESS_PREFIX):].partition(" ")
                done, _, total = counts.partition("/")
                if done.isdigit() and total.isdigit():
                    on_progress(int(done), int(total), label)
        if returncode is not None:
            return returncode


def _kill(proc: subprocess.Popen) -> None:
    """End a stage's process now and reap it (a second Ctrl-C meanwhile does not leave it running)."""
    try:
        proc.kill()
    except OSError:
        pass
    while True:
        try:
            proc.wait()
            return
        except KeyboardInterrupt:
            continue


def _die_with_parent() -> None:
    """In the stage process: get SIGKILL if the runner dies, so no orphan keeps writing; and Ctrl-C
    as the runner had it before interrupt.held (a signal mask outlives exec)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
