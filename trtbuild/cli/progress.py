"""Build progress with rich, on stderr: a line per finished node, and a bar for the node at work
(bytes while hashing or copying, counted steps such as calibration batches). On a file or pipe
there are no bars, and each line is written as rich would write it, without importing rich
(plainout) unless a line needs it."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Optional

from trtbuild import interrupt
from trtbuild.cli import plainout
from trtbuild.plan.estimate import format_bytes

if TYPE_CHECKING:
    from rich.console import Console

STATUS_STYLE = {"built": "green", "cached": "cyan", "failed": "red", "impossible": "magenta", "skipped": "yellow"}


def _bars(console: "Console"):
    """The live bars; rich.progress (and the table, spinner and live modules it pulls in) is
    imported only for a terminal, the only place bars are shown."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn

    return Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
        TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console, transient=True,
    )


class ConsoleReporter:
    def __init__(self, console: Optional["Console"] = None) -> None:
        self._console = console
        self._plain = console is None and plainout.plain_stream(sys.stderr)
        # Bars only on a terminal: on a file or pipe rich's Progress.stop() prints an empty line,
        # which came before every error message (and a bar redrawn into a log file helps nobody).
        self.progress = _bars(self.console) if not self._plain and self.console.is_terminal else None
        self.task = None
        self.node_id = ""
        self.bytes = 0

    @property
    def console(self) -> "Console":
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True)
        return self._console

    def __enter__(self) -> "ConsoleReporter":
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None and self.progress.live.is_started:
            self.progress.stop()

    def _drop(self) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None

    def started(self, node, what: str) -> "ConsoleReporter":
        interrupt.check()  # between nodes: a Ctrl-C whose exception Python dropped (trtbuild/interrupt.py)
        self._drop()
        self.node_id, self.bytes = node.id, 0
        if self.progress is not None:
            self.task = self.progress.add_task(f"{node.id}: {what}", total=None, detail="")
        return self

    def advance(self, nbytes: int) -> None:
        """Bytes hashed or copied (called from hashing threads; rich's updates are thread-safe)."""
        if self.task is not None:
            self.bytes += nbytes
            self.progress.update(self.task, detail=format_bytes(self.bytes))

    def step(self, done: int, total: int, label: str) -> None:
        """A counted step inside a stage: calibration batches, AWQ search."""
        if self.task is not None:
            self.progress.update(self.task, completed=done, total=total, detail=f"{done}/{total} {label}")

    def notice(self, line: str) -> None:
        """A line besides the results (a damaged artifact rebuilt, a wait for another build's lock,
        a new store), where the results go: stderr, above the bars."""
        if self._plain and plainout.line_as_is(line):
            sys.stderr.write(f"{line}\n")
            sys.stderr.flush()
            return
        from rich.markup import escape

        self.console.print(escape(line), highlight=False, soft_wrap=True)

    def finished(self, result) -> None:
        self._drop()
        style = STATUS_STYLE.get(result.status, "")
        digest = f" {result.digest[:12]}" if result.digest else ""
        head = f"{result.status:>10}"
        tail = f"({result.stage}, {result.seconds:.1f}s){digest}"
        line = f"{head} {result.id} {tail}" + (f"  {result.reason}" if result.reason else "")
        if self._plain and style and plainout.line_as_is(line):
            sys.stderr.write(f"{line}\n")
            sys.stderr.flush()
            return
        from rich.markup import escape

        reason = f"  {escape(result.reason)}" if result.reason else ""  # reasons hold [brackets]: not markup
        self.console.print(f"[{style}]{head}[/] {result.id} [dim]{tail}[/]{reason}", highlight=False, soft_wrap=True)
