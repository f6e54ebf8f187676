"""What a stage is (name, version, entry point, toolchain parts) and what it is handed when it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from trtbuild import toolchain
from trtbuild.stages.install import install_hint


@dataclass(frozen=True)
class Stage:
    name: str  # source | checkpoint | hf-checkpoint | engine | reference | validate
    version: int  # bump when the stage's output for the same key would change
    entry: str  # "module:function", called with a StageContext
    toolchain: tuple[str, ...] = ()  # parts of the toolchain fingerprint that shape the output
    needs: tuple[str, ...] = ()  # packages that must be installed to run it
    isolated: bool = True  # run in a subprocess: a crash or OOM fails the stage, not the runner
    requires: Optional[Callable[[dict], Optional[str]]] = None  # why it cannot run here (given platform)

    def unavailable(self, platform: dict) -> Optional[str]:
        absent = toolchain.missing(self.needs)
        if absent:
            return install_hint(absent)
        return self.requires(platform) if self.requires else None


@dataclass
class StageContext:
    out: Path  # fresh empty folder; everything written here becomes the artifact
    inputs: dict[str, Path]  # role -> materialized input artifact (read-only)
    params: dict[str, Any]  # exactly what the key holds
    runtime: dict[str, Any] = field(default_factory=dict)  # local paths etc.: never in the key
    state: Any = None  # the store's stat cache, for stages that run in the runner's process
    adopted: Optional[dict] = None  # what to ingest instead of `out` (see adopt)

    def adopt(self, folder: Path, include=None, links_within: Optional[Path] = None, link: bool = False) -> None:
        """Make `folder` (filtered by `include`) the artifact without copying it into `out` first.
        `links_within`: symlinks may point anywhere inside that folder (a Hugging Face snapshot
        links into its repository's blobs/). `link`: hard-link the files into the store instead of
        copying them, for files nobody edits in place (a download cache's blobs)."""
        self.adopted = {"folder": folder, "include": include, "links_within": links_within, "link": link}

    def report(self, summary: dict) -> None:
        """A short summary that goes into the action record (and `cache ls`)."""
        import json

        (self.out / "report.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
