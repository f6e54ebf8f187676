"""What a stage is (name, version, entry point, toolchain parts) and what it is handed when it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

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


class ObjectToFetch(BaseModel):
    """One object of a bucket that a source fetches (its resolution hashed it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str = Field(description="The object's key in its bucket.")
    size: int = Field(ge=0, description="Its size in bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of its bytes.")


class BuildNeeds(BaseModel):
    """What one engine build worker needs of this host (plan.estimate.build_memory_needs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    host_ram_bytes_per_worker: int = Field(ge=0, description="Host memory one worker takes, bytes.")
    gpu_bytes_per_worker: int = Field(ge=0, description="GPU memory one worker takes, bytes.")


class StageRuntime(BaseModel):
    """What a stage run is handed besides its key: local paths and this host's choices. Never keyed
    (so never able to change an artifact's bytes); one field per thing a stage or a source
    resolution reads, None where its node has none."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    # a source node's, from the recipe (graph), and what resolving it found (source stages)
    kind: Optional[str] = Field(None, description="Source kind: path, hf, gguf, nemo or s3.")
    location: Optional[str] = Field(None, description="The source as the recipe names it (a path, repo id or URL).")
    base_dir: Optional[str] = Field(None, description="The recipe's folder: relative paths are read from there.")
    trust_remote_code: Optional[bool] = Field(None, description="Whether the recipe allows a hub model's own code.")
    revision: Optional[str] = Field(None, description="A hub source's revision as the recipe asks for it.")
    where: Optional[str] = Field(None, description="The recipe's YAML path of the source, for messages.")
    folder: Optional[str] = Field(None, description="A path source's folder.")
    file: Optional[str] = Field(None, description="A GGUF source's file.")
    repo: Optional[str] = Field(None, description="A hub source's repository id.")
    commit: Optional[str] = Field(None, description="The hub commit it resolved to.")
    files: Optional[dict[str, str]] = Field(None, description="A hub source's files -> their sha256.")
    checkpoint: Optional[str] = Field(None, description="A NeMo source's checkpoint (local, or where it is fetched to).")
    bucket: Optional[str] = Field(None, description="An S3 source's bucket.")
    prefix: Optional[str] = Field(None, description="An S3 source's key prefix.")
    objects: Optional[dict[str, ObjectToFetch]] = Field(None, description="An S3 source's files -> their objects.")
    downloads: Optional[str] = Field(None, description="The store's folder for downloaded source files.")
    state_db: Optional[str] = Field(None, description="The store's stat cache (for a stage in a worker process).")
    # the texts and this host's choices (graph)
    text: Optional[str] = Field(None, description="The calibration or evaluation text: `builtin`, a file or a folder.")
    device: Optional[str] = Field(None, description="Where torch computes: `auto`, `cpu`, `cuda:N`.")
    target: Optional[str] = Field(None, description="The target a validation validates (its report names it).")
    image: Optional[str] = Field(None, description="An engine's build container image.")
    build_needs: Optional[BuildNeeds] = Field(None, description="An engine build's memory needs per worker.")
    # what the runner adds: what the key names (read, never changed) and the timing cache
    platform: dict[str, Any] = Field(default_factory=dict, description="The key's platform (an engine's `sm`).")
    toolchain: dict[str, Optional[str]] = Field(default_factory=dict, description="The key's toolchain versions.")
    input_digests: dict[str, str] = Field(default_factory=dict, description="The key's input digests by role.")
    timing_cache_in: Optional[str] = Field(None, description="The newest stored timing cache for this build's key.")
    timing_cache_out: Optional[str] = Field(None, description="Where the build leaves the timing cache it wrote.")
    timing_cache_key: Optional[str] = Field(None, description="The timing cache's key.")
    node: Optional[str] = Field(None, description="The graph node the stage runs for.")
    runs: Optional[str] = Field(None, description="A file each run of the stage appends its node and pid to (outside "
                                                  "the artifact): how the tests count the builds of a key.")

    @classmethod
    def of(cls, runtime: Union["StageRuntime", dict[str, Any], None]) -> "StageRuntime":
        """`runtime` as a StageRuntime (a node's dict, a spec's JSON): a key no field names is refused."""
        if isinstance(runtime, StageRuntime):
            return runtime
        return cls.model_validate({k: v for k, v in (runtime or {}).items() if v is not None})

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


@dataclass
class StageContext:
    out: Path  # fresh empty folder; everything written here becomes the artifact
    inputs: dict[str, Path]  # role -> materialized input artifact (read-only)
    params: dict[str, Any]  # exactly what the key holds
    runtime: StageRuntime = field(default_factory=StageRuntime)  # local paths etc.: never in the key
    state: Any = None  # the store's stat cache, for stages that run in the runner's process
    adopted: Optional[dict] = None  # what to ingest instead of `out` (see adopt)
    figures: dict[str, Any] = field(default_factory=dict)  # measurements for the action record (see measure)

    def __post_init__(self) -> None:
        self.runtime = StageRuntime.of(self.runtime)

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
