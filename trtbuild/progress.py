"""Build progress with rich, on stderr: a line per finished node, and a bar for the node at work
(bytes while hashing or copying, counted steps such as calibration batches)."""

from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn

from trtbuild.estimate import format_bytes

STATUS_STYLE = {"built": "green", "cached": "cyan", "failed": "red", "impossible": "magenta", "skipped": "yellow"}


class ConsoleReporter:
    def __init__(self, console: Optional[Console] = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
            TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=self.console, transient=True,
        )
        self.task = None
        self.node_id = ""
        self.bytes = 0

    def __enter__(self) -> "ConsoleReporter":
        # Bars only on a terminal: on a file or pipe rich's Progress.stop() prints an empty line,
        # which came before every error message (and a bar redrawn into a log file helps nobody).
        if self.console.is_terminal:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress.live.is_started:
            self.progress.stop()

    def _drop(self) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None

    def started(self, node, what: str) -> "ConsoleReporter":
        self._drop()
        self.node_id, self.bytes = node.id, 0
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

    def finished(self, result) -> None:
        self._drop()
        style = STATUS_STYLE.get(result.status, "")
        digest = f" {result.digest[:12]}" if result.digest else ""
        reason = f"  {escape(result.reason)}" if result.reason else ""  # reasons hold [brackets]: not markup
        self.console.print(f"[{style}]{result.status:>10}[/] {result.id} [dim]({result.stage}, {result.seconds:.1f}s){digest}[/]{reason}",
                           highlight=False, soft_wrap=True)
