"""The recipe's `bench:` section: workloads (the input and output length distributions, the number
of requests, the concurrency levels) a `trtbuild bench` run drives against an artifact's server.

A workload is identified by what it sends, not by its name: `Workload.identity(concurrency)` is the
canonical JSON of the lengths, the spread, the count, the seed and the concurrency; its sha256 is
part of a measurement's id, so two recipes that call the same load by different names share figures,
and a changed workload never reads old ones."""

from __future__ import annotations

import hashlib
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtbuild.keys import canonical_json

INT32_MAX = 2**31 - 1
Count = Annotated[int, Field(gt=0, le=INT32_MAX)]
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Workload(_Strict):
    """One load: synthetic prompts of `input_len` tokens answered with `output_len` tokens, each drawn
    uniformly within +-`spread` of its mean (0: every request the same), `requests` of them, run once
    at each concurrency level."""

    name: str = Field(pattern=NAME_PATTERN, description="the workload's name in tables and on the command line")
    input_len: Count = Field(description="mean prompt length, in tokens of the artifact's tokenizer")
    output_len: Count = Field(description="mean answer length, in tokens (the runtime is asked not to stop early)")
    spread: float = Field(0.0, ge=0, lt=1, allow_inf_nan=False,
                          description="relative half-width of the uniform length distribution around each mean "
                                      "(0.25: 75% to 125%; 0: fixed lengths)")
    requests: Count = Field(description="requests sent at each concurrency level")
    concurrency: list[Count] = Field(min_length=1, description="concurrency levels (requests in flight at once), "
                                                                "each a run of its own")
    seed: int = Field(0, ge=0, le=INT32_MAX, description="seed of the synthetic prompts and lengths")

    def identity(self, concurrency: int) -> dict:
        """What the load generator is told at one concurrency level: the measurement's workload."""
        return {"dataset": "synthetic", "input_len": self.input_len, "output_len": self.output_len,
                "spread": self.spread, "requests": self.requests, "concurrency": concurrency, "seed": self.seed}

    def digest(self, concurrency: int) -> str:
        return hashlib.sha256(canonical_json(self.identity(concurrency))).hexdigest()


def default_workloads() -> list[Workload]:
    """Short chat-like requests at one and at eight in flight: minutes on a CPU for the demo's
    135M-parameter model in llama.cpp, seconds on a GPU."""
    return [Workload(name="chat-short", input_len=128, output_len=32, requests=32, concurrency=[1, 8])]


class Bench(_Strict):
    """What `trtbuild bench` measures for each artifact of the recipe."""

    workloads: list[Workload] = Field(default_factory=default_workloads, min_length=1,
                                      description="the loads to drive (default: `chat-short`, 128 tokens in, 32 "
                                                  "out, 32 requests at concurrency 1 and 8)")
    ready_timeout_s: Count = Field(900, description="seconds to wait for the server to answer before giving up "
                                                   "(a first vLLM start compiles and autotunes: minutes)")

    @model_validator(mode="after")
    def _names_unique(self) -> "Bench":
        names = [w.name for w in self.workloads]
        doubled = sorted({n for n in names if names.count(n) > 1})
        if doubled:
            raise ValueError(f"workload names must differ: {', '.join(doubled)} is used twice")
        return self

    def workload(self, name: str) -> Workload:
        for workload in self.workloads:
            if workload.name == name:
                return workload
        raise KeyError(name)
