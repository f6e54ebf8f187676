"""A bar of bytes on stderr for `trtbuild pull` and `push` (rich.progress), only when stderr is a
terminal and the output is not --json: on a pipe, a file or CI's log nothing is drawn, so what
the command prints stays byte-for-byte what it printed without a bar.

The transfer code (store/transfer.py) sees only the two calls of `ByteProgress`: `expect` (bytes
about to move, known once the blobs the other store lacks are known) and `advance` (bytes just
moved)."""

from __future__ import annotations

import contextlib
import sys
from typing import IO, Iterator, Optional, Protocol


class ByteProgress(Protocol):
    def expect(self, nbytes: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...


class _RichBytes:
    def __init__(self, progress, task) -> None:
        self.progress, self.task = progress, task

    def expect(self, nbytes: int) -> None:
        total = self.progress.tasks[0].total or 0
        self.progress.update(self.task, total=total + nbytes)

    def advance(self, nbytes: int) -> None:
        self.progress.advance(self.task, nbytes)


@contextlib.contextmanager
def bar(label: str, enabled: bool = True, stream: Optional[IO[str]] = None) -> Iterator[Optional[ByteProgress]]:
    """A transient bar of bytes labelled `label`, or None (no bar: `enabled` false, or the stream
    is not a terminal). Asks the stream itself, not rich's FORCE_COLOR and friends: a log stays clean."""
    stream = stream if stream is not None else sys.stderr
    if not enabled or not stream.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    console = Console(file=stream, force_terminal=True)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        yield _RichBytes(progress, progress.add_task(label, total=0))
