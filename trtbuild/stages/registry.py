"""The stages trtbuild has, by node kind. A kind without a stage yet is reported `skipped`."""

from __future__ import annotations

from typing import Optional

from trtbuild.stages.base import Stage

STAGES: dict[str, Optional[Stage]] = {
    "source:path": Stage("source", 1, "trtbuild.stages.source:adopt_folder", isolated=False),
    "source:gguf": Stage("source", 1, "trtbuild.stages.source:convert_gguf",
                         toolchain=("torch", "transformers", "gguf"), needs=("torch", "transformers", "gguf", "accelerate")),
    # Later stages land with their issues; until then their nodes are skipped with this reason.
    "source:hf": None,
    "source:nemo": None,
    "source:s3": None,
    "checkpoint": None,
    "hf-checkpoint": None,
    "engine": None,
}

NOT_YET = "this version of trtbuild has no {kind} stage yet"
