"""What a stage is (name, version, entry point, toolchain parts) and what it is handed when it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from trtbuild import toolchain


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


# README's set-up installs this torch before trtbuild[quantize], so that pip takes its CPU build
# rather than a multi-GB CUDA one (tests/test_cli.py checks the README still says so).
CPU_TORCH = "torch==2.13.0"
EXTRA_OF = {"tensorrt_llm": "trtllm"}  # every other package a stage needs comes with trtbuild[quantize]


def extra_for(package: str) -> str:
    return EXTRA_OF.get(package, "quantize")


def install_hint(absent: list[str]) -> str:
    """`needs torch, transformers: install them with `...``: the exact command for what is missing."""
    commands = []
    for extra in sorted({extra_for(p) for p in absent}):
        if extra == "quantize":
            commands.append(f"`python3 -m pip install {CPU_TORCH} 'trtbuild[quantize]'` "
                            "(torch first, so that pip takes its CPU build)")
        else:
            commands.append(f"`python3 -m pip install 'trtbuild[{extra}]'` on a GPU host")
    pronoun = "it" if len(absent) == 1 else "them"
    return f"needs {', '.join(absent)}: install {pronoun} with {' and '.join(commands)}, or use the container image"


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
