"""What a run of a graph says of each node (NodeResult, its Status) and of the whole (RunResult):
what the runner returns, the lock and the outputs read."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

from trtbuild.builder.graph import Blocker
from trtbuild.builder.stages.source import Resolved
from trtbuild.store.platform import EnginePlatform
from trtbuild.store.summaries import StageSummary, ValidationSummary


class Status(str, enum.Enum):
    """What happened to a node in one run."""

    BUILT = "built"  # the stage ran and its artifact was stored
    CACHED = "cached"  # the store had the key, with every byte of its artifact intact
    FAILED = "failed"  # the stage failed, a gate failed, or an input failed
    IMPOSSIBLE = "impossible"  # the plan rules it out (the reason says which rule)
    SKIPPED = "skipped"  # not this run: --until, a host that cannot run it, an input not built

    def __str__(self) -> str:
        return self.value


BUILT, CACHED, FAILED, IMPOSSIBLE, SKIPPED = Status.BUILT, Status.CACHED, Status.FAILED, Status.IMPOSSIBLE, Status.SKIPPED


@dataclass
class NodeResult:
    id: str
    kind: str
    stage: Optional[str]
    status: Status
    key: Optional[str] = None
    digest: Optional[str] = None
    size: Optional[int] = None  # the artifact's bytes
    seconds: float = 0.0
    reason: Optional[str] = None
    path: Optional[str] = None
    summary: Optional[StageSummary] = None  # the record's typed summary (store.summaries)
    ref: Optional[str] = None  # a done target held back from publishing: why (publication.held_back)
    decided_by: list[dict] = field(default_factory=list)  # the validations whose figures moved its ref, deciding first
    blocker: Optional[Blocker] = None  # a node this host could not run: why (Blocker.HOST: no GPU or runtime here)
    log_tail: list[str] = field(default_factory=list)  # a failed stage's last log lines
    standin: list[str] = field(default_factory=list)  # toolchain parts that are test stand-ins (never real)
    platform: Optional[EnginePlatform] = None  # an engine's: what it is for (SM, parallelism, toolchain)
    origin: Optional[str] = None  # a done node's artifact: "built" here, "local" store, or "remote" (pulled, verified)
    pulled: Optional[dict] = None  # origin "remote": the store pulled from and what moved
    note: Optional[str] = None  # e.g. why the remote's artifact was not used

    @property
    def done(self) -> bool:
        return self.status in (BUILT, CACHED)

    def as_json(self) -> dict:
        out = {"name": self.id, "stage": self.stage or self.kind, "status": self.status.value, "key": self.key,
               "digest": self.digest, "size": self.size, "seconds": round(self.seconds, 3), "reason": self.reason, "path": self.path,
               "ref": self.ref, "decided_by": self.decided_by, "standin": self.standin, "origin": self.origin, "pulled": self.pulled, "note": self.note}
        if self.log_tail:
            out["log_tail"] = self.log_tail
        if isinstance(self.summary, ValidationSummary):  # validation entries
            out.update(metrics=self.summary.metrics.model_dump(mode="json"),
                       gates={name: gate.model_dump(mode="json") for name, gate in self.summary.gates.items()},
                       warnings=self.summary.warnings)
        return out


@dataclass
class RunResult:
    """One run of a graph: a result per node (in graph order) and the source's resolution."""

    results: list[NodeResult]
    resolutions: dict[str, Resolved]

    def by_id(self) -> dict[str, NodeResult]:
        return {r.id: r for r in self.results}
