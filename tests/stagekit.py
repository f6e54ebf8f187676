"""Simple real stages for runner tests: they read their inputs, write files, and log each run.

Every run appends one line to the file named by runtime.runs (outside the artifact, so it does
not change what is built), which lets tests count how often a key was really built.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from dataclasses import dataclass

from typing import Literal

from pydantic import Field

from trtbuild.builder.graph import Graph, Node, Param
from trtbuild.builder.stages.needs import HostNeed
from trtbuild.builder.stages.base import Stage, StageContext
from trtbuild.store.summaries import StageSummary, register_summary

from summarykit import validation_summary


class UpperSummary(StageSummary):
    """The report of the test kit's `upper` stage (a kind trtbuild does not have)."""

    kind: Literal["upper"] = Field("upper", exclude=True, description="Always `upper`.")
    chars: int = Field(ge=0, description="Characters of its input's text.")


class OverlaySummary(StageSummary):
    """The test kit's overlay stage's summary: its input's report (an `upper` one) and nothing of its own."""

    kind: Literal["overlay"] = Field("overlay", exclude=True, description="Always `overlay`.")
    chars: int = Field(ge=0, description="The input's `chars`.")


register_summary(UpperSummary)
register_summary(OverlaySummary)


@dataclass(frozen=True)
class Lacking(HostNeed):
    """A host need this host never meets (a GPU the test machine has not)."""

    reason: str

    def problem(self) -> str:
        return self.reason


def _count(ctx: StageContext) -> None:
    runs = ctx.runtime.runs
    if runs:
        with open(runs, "a") as f:  # O_APPEND: concurrent writers do not interleave lines
            f.write(f"{ctx.runtime.node} {os.getpid()}\n")


def write_text(ctx: StageContext) -> None:
    _count(ctx)
    (ctx.out / "text.txt").write_text(ctx.params["text"])
    if ctx.params.get("delay"):
        time.sleep(ctx.params["delay"])


def upper(ctx: StageContext) -> None:
    _count(ctx)
    text = (ctx.inputs["src"] / "text.txt").read_text()
    (ctx.out / "text.txt").write_text(text.upper() + ctx.params.get("suffix", ""))
    ctx.report(UpperSummary(chars=len(text)))


def concat(ctx: StageContext) -> None:
    _count(ctx)
    parts = [(ctx.inputs[role] / "text.txt").read_text() for role in sorted(ctx.inputs)]
    (ctx.out / "text.txt").write_text(ctx.params.get("sep", "+").join(parts))
    tool = ctx.out / "bin" / "tool.sh"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o755)


def big(ctx: StageContext) -> None:
    """Several files of `mib` MiB each: slow enough to kill a runner while it stores them."""
    _count(ctx)
    block = os.urandom(1024 * 1024)
    for i in range(ctx.params.get("files", 4)):
        with open(ctx.out / f"part{i}.bin", "wb") as f:
            for _ in range(ctx.params["mib"]):
                f.write(block)


def fail(ctx: StageContext) -> None:
    _count(ctx)
    (ctx.out / "partial.txt").write_text("half")
    raise ValueError("the input is not what this stage expects\nsecond line")


def die(ctx: StageContext) -> None:
    _count(ctx)
    os.kill(os.getpid(), signal.SIGKILL)


def add_file(ctx: StageContext) -> None:
    """An overlay stage (Stage.overlay): writes params["name"] beside its input's files."""
    _count(ctx)
    target = ctx.out / ctx.params["name"]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(ctx.params["text"])


def hold_memory(ctx: StageContext) -> None:
    """Touches params["mib"] MiB, says so in its log, and reports its pid (for the shared worker's tests)."""
    _count(ctx)
    block = bytearray(ctx.params["mib"] << 20)
    block[::4096] = b"x" * len(block[::4096])  # every page resident
    if ctx.params.get("cycle"):  # left as garbage only the cycle collector frees (as a quantized model's copy is)
        import gc

        holder = {"block": block}
        holder["self"] = holder
        gc.collect()  # while it is alive: it moves to the oldest generation, which collections seldom visit
    print(f"hold_memory {ctx.runtime.node}", flush=True)
    ctx.measure(pid=os.getpid())
    (ctx.out / "done.txt").write_text(str(ctx.params["mib"]))


def read_stdin(ctx: StageContext) -> None:
    """Reads what its standard input holds, itself and through a child process."""
    import subprocess
    import sys

    own = sys.stdin.read()
    child = subprocess.run(["cat"], capture_output=True, text=True).stdout
    (ctx.out / "stdin.txt").write_text(f"own={own!r} child={child!r}")


def gated(ctx: StageContext) -> None:
    """A validation of its `src` input: a report with one KL gate, passed unless `kl` exceeds 0.1, and
    the runner and device the `runner` and `device` params name (as the real validate stages write)."""
    _count(ctx)
    (ctx.out / "seen.txt").write_text((ctx.inputs["src"] / "text.txt").read_text())
    kl = ctx.params["kl"]
    ctx.report(validation_summary(kl, gates={"kld_mean": {"value": kl, "limit": 0.1, "passed": kl <= 0.1}},
                                  runner=ctx.params["runner"], device=ctx.params.get("device", "cpu")))


def half_report(ctx: StageContext) -> None:
    """A validation whose report lacks all but one metric (what its kind's summary model refuses)."""
    (ctx.out / "seen.txt").write_text("x")
    ctx.report({"metrics": {"kld_mean": 0.5}})


WRITE = Stage("write", 1, "stagekit:write_text")
UPPER = Stage("upper", 1, "stagekit:upper")
CONCAT = Stage("concat", 1, "stagekit:concat")
BIG = Stage("big", 1, "stagekit:big")
FAIL = Stage("fail", 1, "stagekit:fail")
DIE = Stage("die", 1, "stagekit:die")
UPPER_INPROCESS = Stage("upper", 1, "stagekit:upper", isolated=False)
GATED = Stage("validate", 1, "stagekit:gated", isolated=False)
HALF_REPORT = Stage("validate", 1, "stagekit:half_report", isolated=False)
OVERLAY = Stage("overlay", 1, "stagekit:add_file", isolated=False, overlay="base")
OVERLAY_ISOLATED = Stage("overlay", 1, "stagekit:add_file", overlay="base")
# the same stages in the build's shared worker process (worker_pool.py)
SHARED_WRITE = Stage("write", 1, "stagekit:write_text", shares_worker=True)
SHARED_UPPER = Stage("upper", 1, "stagekit:upper", shares_worker=True)
SHARED_FAIL = Stage("fail", 1, "stagekit:fail", shares_worker=True)
SHARED_DIE = Stage("die", 1, "stagekit:die", shares_worker=True)
SHARED_HOLD = Stage("hold", 1, "stagekit:hold_memory", shares_worker=True)
HOLD = Stage("hold", 1, "stagekit:hold_memory")
SHARED_STDIN = Stage("stdin", 1, "stagekit:read_stdin", shares_worker=True)


def node(node_id: str, stage: Stage, runs: Path | None = None, inputs: dict | None = None, **params) -> Node:
    return Node(node_id, stage.name, stage, inputs=inputs or {},
                params={k: Param(v, "test") for k, v in params.items()},
                runtime={"runs": str(runs) if runs else None, "node": node_id})


def diamond(runs: Path, a_text: str = "alpha", b_text: str = "beta", suffix: str = "!") -> Graph:
    """a, b -> upper(a), upper(b) -> concat: changing b rebuilds b, B and ab only."""
    return Graph("diamond", [
        node("a", WRITE, runs, text=a_text),
        node("b", WRITE, runs, text=b_text),
        node("A", UPPER, runs, inputs={"src": "a"}, suffix=suffix),
        node("B", UPPER, runs, inputs={"src": "b"}, suffix=suffix),
        node("ab", CONCAT, runs, inputs={"1": "A", "2": "B"}),
    ])


def counts(runs: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    if runs.exists():
        for line in runs.read_text().splitlines():
            name = line.split()[0]
            found[name] = found.get(name, 0) + 1
    return found


def record_params(ctx: StageContext) -> None:
    """A stand-in for a checkpoint or engine stage: its output is its parameters and its inputs'
    files with their contents' digests, so it changes exactly when something its key names changes."""
    import hashlib
    import json

    _count(ctx)
    seen = {role: sorted((p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in path.iterdir() if p.is_file())
            for role, path in ctx.inputs.items()}
    (ctx.out / "made.json").write_text(json.dumps({"params": ctx.params, "inputs": seen}, sort_keys=True))


TINY_HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8,
                  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 16,
                  "vocab_size": 32, "tie_word_embeddings": True, "torch_dtype": "float16"}


def record_hf_export(ctx: StageContext) -> None:
    """A stand-in hf export: record_params, plus a one-layer unquantized Llama checkpoint of zeros
    (config.json, model.safetensors) that the package stage's loader check accepts."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    record_params(ctx)
    c = TINY_HF_CONFIG
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    layer = "model.layers.0."
    shapes.update({layer + "input_layernorm.weight": (h,), layer + "post_attention_layernorm.weight": (h,)})
    shapes.update({f"{layer}self_attn.{p}_proj.weight": (h, h) for p in "qkvo"})
    shapes.update({f"{layer}mlp.{p}_proj.weight": (i, h) for p in ("gate", "up")})
    shapes[f"{layer}mlp.down_proj.weight"] = (h, i)
    (ctx.out / "config.json").write_text(json.dumps(c))
    save_file({name: np.zeros(shape, np.float16) for name, shape in shapes.items()}, str(ctx.out / "model.safetensors"))


RECORD_CALIBRATION = Stage("calibration", 1, "stagekit:record_params")
RECORD_QUANTIZE = Stage("quantize", 1, "stagekit:record_params")
RECORD_CHECKPOINT = Stage("checkpoint", 1, "stagekit:record_params")
RECORD_REFERENCE = Stage("reference", 1, "stagekit:record_params")
RECORD_VALIDATE = Stage("validate", 1, "stagekit:record_params")
RECORD_HF = Stage("hf-export", 1, "stagekit:record_hf_export")
RECORD_ENGINE = Stage("engine", 1, "stagekit:record_params")


def counting(ctx: StageContext) -> None:
    """Reports counted progress the way long stages do (calibration batches)."""
    from trtbuild.builder.stages.worker import report_progress

    print(f"counting in process {os.getpid()}", flush=True)  # a log line that differs every run
    for done in range(1, ctx.params["steps"] + 1):
        report_progress(done, ctx.params["steps"], "batches")
        time.sleep(0.3)
    (ctx.out / "done.txt").write_text("ok")


COUNTING = Stage("counting", 1, "stagekit:counting")


def damaged_checkpoint(ctx: StageContext) -> None:
    """The real unquantized conversion, then one layer's MLP rows permuted: a broken checkpoint
    whose shapes and names are all correct."""
    import torch
    from safetensors.torch import load_file, save_file

    from trtbuild.builder.stages.checkpoint import convert_checkpoint

    convert_checkpoint(ctx)
    path = ctx.out / "rank0.safetensors"
    tensors = load_file(path)
    name = "transformer.layers.0.mlp.fc.weight"
    tensors[name] = tensors[name][torch.randperm(tensors[name].shape[0], generator=torch.Generator().manual_seed(0))]
    save_file(tensors, path)
