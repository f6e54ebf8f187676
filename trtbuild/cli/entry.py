"""The console script's process: the group run once, Ctrl-C as one line and exit 130, and an
exit without the interpreter's module teardown."""

from __future__ import annotations

import sys

from trtbuild.cli import cli

# The garbage collector's first threshold for the command line. A command allocates tens of
# thousands of objects that live until it exits (modules, classes, pydantic's validators, the
# plan and graph); at the default of 700 the collector walked them some 115 times in a no-op
# build and found nothing to free: a tenth of its time. Collections still run, 1/140th as often.
GC_THRESHOLD = 100_000


def main() -> None:
    """The console script (and `python -m trtbuild`). Once the command is done, the process ends
    without the interpreter's module teardown: freeing botocore's service models, pydantic's
    schemas and the rest took 0.15-0.2 s of a 1 s re-push on a 2-core host (benchmarks/RESULTS.md),
    memory the OS takes back anyway. atexit handlers still run and output is flushed first; while
    another thread still works, the ordinary exit (which waits for it) is taken instead."""
    import gc

    from trtbuild import interrupt

    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    interrupt.install()  # Ctrl-C: exit 130 with one line (not click's "Aborted!", exit 1)
    try:
        cli(prog_name="trtbuild")
        code = 0
    except SystemExit as exc:
        code = exc.code
    except interrupt.Interrupted:
        code = None
    if interrupt.requested():  # also when its exception was dropped and the command still ended
        print(interrupt.LINE, file=sys.stderr)
        code = interrupt.EXIT
    _exit_without_teardown(code)


def _exit_without_teardown(code) -> None:
    import atexit
    import os
    import threading

    if code is None:
        code = 0
    elif not isinstance(code, int):  # SystemExit("message"): printed, status 1
        print(code, file=sys.stderr)
        code = 1
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()  # logging's flush, tempfile's finalizers, ...
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (| head): what was written is all it takes
            code = code or 120  # what the interpreter's own exit reports then
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
