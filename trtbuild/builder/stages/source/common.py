"""What every source kind resolves to, and what it is given to resolve."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from trtbuild.builder.stages.base import StageRuntime
from trtbuild.store.state import StatCache


@dataclass(frozen=True)
class Resolved:
    """A source's identity without its bytes: the digest that enters the key (under `role`), what the
    lock file records (and `explain` shows), and local paths the stage run needs (never keyed)."""

    role: str
    digest: str
    lock: dict
    runtime: dict = field(default_factory=dict)
    origin: str = ""  # how it was resolved, for `explain` ("hub metadata", "lock file", ...)


@dataclass
class SourceContext:
    runtime: StageRuntime  # kind, location, base_dir, ... from the graph
    state: StatCache
    downloads: Path  # a folder of the store for downloaded source files
    locked: Optional[dict] = None  # the lock file's source entry, when there is one
    progress: Optional[Callable[[int], None]] = None

    def __post_init__(self) -> None:
        self.runtime = StageRuntime.of(self.runtime)
