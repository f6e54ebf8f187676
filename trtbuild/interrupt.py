"""Ctrl-C at the command line: exit 130 (128 + SIGINT, what a shell reports) with one line, after the
command's own clean-up, instead of click's "Aborted!" and exit 1 (the code of a failed target).

Every store write is a temp file renamed into place, blobs before the manifest, record and ref that
name them (store/local.py, store/s3.py), a stage works in a folder of tmp/ that the runner removes
(and the worker pool kills the stage's process first), and `pull --dest` is assembled beside its
folder and renamed (store/transfer.py): an interrupted build, push or pull keeps what it finished
and leaves nothing half-written.

The first Ctrl-C raises Interrupted, a BaseException (so no `except Exception` stops it, and click,
which turns KeyboardInterrupt into "Aborted!", lets it through), and unwinds the command through its
`finally` blocks and context managers. Python prints and drops an exception raised where it cannot
propagate (an at-fork hook, a __del__, a weakref callback); the flag stays set, and check(), called
where the command waits (the worker pool's poll, the progress reporter), raises it again. A second
Ctrl-C while the clean-up runs ends the process at once, which the write order above makes safe too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator, Optional

EXIT = 130
LINE = "interrupted; nothing half-written: what was finished is kept, the rest was discarded (run the command again to go on)"

_pid: Optional[int] = None  # the process that installed the handler
_requested = False


class Interrupted(BaseException):
    """Ctrl-C, in place of KeyboardInterrupt."""


def install() -> None:
    """Take over SIGINT for this process, unless it was started with SIGINT ignored (`cmd &` in a
    script: the shell meant it not to be interrupted)."""
    global _pid
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        _pid = os.getpid()
        signal.signal(signal.SIGINT, _handler)
        sys.unraisablehook = _unraisable(sys.unraisablehook)


def _unraisable(previous):
    """A dropped Interrupted is not printed ("Exception ignored in ..."): check() raises it again."""
    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, Interrupted):
            previous(unraisable)
    return hook


def requested() -> bool:
    return _requested


def check() -> None:
    """Raise Interrupted if Ctrl-C was pressed (its first raise may have been dropped)."""
    if _requested:
        raise Interrupted()


def _handler(signum, frame) -> None:
    global _requested
    if os.getpid() != _pid:
        # A child between fork and exec (subprocess runs at-fork hooks and preexec_fn there) shares
        # the terminal's Ctrl-C: there an exception is only printed. The stage process answers for itself.
        return
    if _requested:
        print(LINE, file=sys.stderr, flush=True)
        os._exit(EXIT)
    _requested = True
    raise Interrupted()


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A Ctrl-C during the block waits, and is raised as the block ends, as the handler in place would
    raise it. For a step that makes something its caller must clean up (a folder, a process): an
    interrupt then never falls between the making and the cleanup's guard. Two parts, since either
    alone leaks: the handler is swapped for one that only records (the kernel may hand the signal to
    any thread that does not block it, and Python then runs the handler in the main thread whatever
    its mask), and SIGINT is blocked, so that a child forked meanwhile starts with it blocked and no
    handler of ours runs in it before exec (the child unblocks it itself). Main thread only: Python
    runs handlers, and lets them be set, nowhere else."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # one the kernel held back arrives now: recorded
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, None)
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)
