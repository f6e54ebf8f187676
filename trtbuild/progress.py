"""Build progress with rich, on stderr: a line per finished node, a byte bar while hashing or copying."""

from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn, TransferSpeedColumn

STATUS_STYLE = {"built": "green", "cached": "cyan", "failed": "red", "impossible": "magenta", "skipped": "yellow"}


class ConsoleReporter:
    def __init__(self, console: Optional[Console] = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
            console=self.console, transient=True,
        )
        self.task = None

    def __enter__(self) -> "ConsoleReporter":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def started(self, node, what: str) -> "ConsoleReporter":
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"{node.id}: {what}", total=None)
        return self

    def advance(self, nbytes: int) -> None:
        if self.task is not None:
            self.progress.advance(self.task, nbytes)

    def finished(self, result) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None
        style = STATUS_STYLE.get(result.status, "")
        digest = f" {result.digest[:12]}" if result.digest else ""
        reason = f"  {result.reason}" if result.reason else ""
        self.console.print(f"[{style}]{result.status:>10}[/] {result.id} [dim]({result.stage}, {result.seconds:.1f}s){digest}[/]{reason}",
                           highlight=False, soft_wrap=True)
