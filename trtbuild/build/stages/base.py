"""What a stage is (name, version, entry point, toolchain parts) and what it is handed when it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from trtbuild.host import toolchain
from trtbuild.store.summaries import StageSummary, dump_summary


@dataclass(frozen=True)
class Stage:
    name: str  # source | checkpoint | hf-export | hf-checkpoint | engine | reference | validate
    version: int  # bump when the stage's output for the same key would change
    entry: str  # "module:function", called with a StageContext
    toolchain: tuple[str, ...] = ()  # parts of the toolchain fingerprint that shape the output
    needs: tuple[str, ...] = ()  # packages that must be installed to run it
    isolated: bool = True  # run in a subprocess: a crash or OOM fails the stage, not the runner
    # run in the build's shared worker process (worker_pool.py), after the stages before it: the
    # torch stages of a variant share its imports and its model (stages/models.py)
    shares_worker: bool = False
    id: str = ""  # the registry's name for it (`checkpoint:export`); the lock file's toolchain is per id
    timing_cache: bool = False  # fed the newest TensorRT timing cache for its key, and stores the one it writes
    # the input role whose artifact this stage's artifact extends: the runner stores that input's
    # manifest plus the files the stage writes (no byte copied or re-hashed; a path in both is refused)
    overlay: Optional[str] = None

    @property
    def ident(self) -> str:
        return self.id or self.name

    def missing_packages(self) -> list[str]:
        """The packages it needs that this install lacks (graph.Node.host_problem says what to do)."""
        return toolchain.missing(self.needs)


# Report fields that differ between runs or hosts for the same key: never part of an artifact.
RUN_FIGURES = frozenset({"seconds", "peak_rss_bytes", "rss_start_bytes", "cuda_peak_bytes", "peak_rss_mib",
                         "batches", "batch_size", "batch_sizes_tried"})

# Where a stage's report is in its artifact: the runner copies the first one found into the record.
# An engine's is trtbuild.json, beside the files TensorRT-LLM wrote (`trtbuild check` reads it).
SUMMARY_FILES = ("report.json", "trtbuild.json")
# An overlay stage's own report: its input already holds report.json. The record's summary is the
# input's report updated with this one (the one overlay stage, hf-checkpoint:package, writes serving/).
OVERLAY_SUMMARY = "serving/report.json"


@dataclass
class StageContext:
    out: Path  # fresh empty folder; everything written here becomes the artifact
    inputs: dict[str, Path]  # role -> materialized input artifact (read-only)
    params: dict[str, Any]  # exactly what the key holds
    runtime: dict[str, Any] = field(default_factory=dict)  # local paths etc.: never in the key
    state: Any = None  # the store's stat cache, for stages that run in the runner's process
    adopted: Optional[dict] = None  # what to ingest instead of `out` (see adopt)
    figures: dict[str, Any] = field(default_factory=dict)  # measurements for the action record (see measure)

    def adopt(self, folder: Path, include=None, links_within: Optional[Path] = None, link: bool = False) -> None:
        """Make `folder` (filtered by `include`) the artifact without copying it into `out` first.
        `links_within`: symlinks may point anywhere inside that folder (a Hugging Face snapshot
        links into its repository's blobs/). `link`: hard-link the files into the store instead of
        copying them, for files nobody edits in place (a download cache's blobs)."""
        self.adopted = {"folder": folder, "include": include, "links_within": links_within, "link": link}

    def report(self, summary: Union[StageSummary, dict], name: str = "report.json") -> None:
        """The artifact's report (report.json, or `name`: one of SUMMARY_FILES), also copied into
        the action record (and `cache ls`): the stage kind's summary model (store.summaries), or
        a dict the record types by the stage's kind. It is part of the artifact, so it holds only
        what the inputs determine: the figures of this run (RUN_FIGURES: timings, memory, the batch
        size this host's memory allowed) go to `measure` (see tool_report)."""
        import json

        assert name in SUMMARY_FILES + (OVERLAY_SUMMARY,), name
        if isinstance(summary, StageSummary):
            written = dump_summary(summary)
        else:
            self.measure(**{k: v for k, v in summary.items() if k in RUN_FIGURES})
            written = {k: v for k, v in summary.items() if k not in RUN_FIGURES}
        (self.out / name).parent.mkdir(parents=True, exist_ok=True)
        (self.out / name).write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")

    def tool_report(self, model: type[StageSummary], report: dict[str, Any], **fields: Any) -> None:
        """report() of a wrapped tool's own report (a conversion's, ModelOpt's) as `model` with
        `fields` added: its run figures (RUN_FIGURES) go to `measure`, never into the artifact."""
        self.measure(**{k: v for k, v in report.items() if k in RUN_FIGURES})
        kept = {k: v for k, v in report.items() if k not in RUN_FIGURES}
        self.report(model.model_validate({**kept, **fields, "kind": model.model_fields["kind"].default}))

    def measure(self, **figures: Any) -> None:
        """Measurements of this run (seconds of a step, tokens per second): kept in the action
        record's `execution`, never in the artifact, since they differ between runs and hosts."""
        self.figures.update(figures)
