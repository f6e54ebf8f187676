"""The names of the runtime table's runtimes (trtbuild/data/runtime-support.json), read without
checking the whole table: the command line builds its choices when it is imported, before any
command needs the facts themselves (trtbuild.facts.serving reads the same file, checked, and its
RUNTIMES are these). Standard library only, so `trtbuild --help` stays quick."""

from __future__ import annotations

import json
from importlib import resources
from typing import Sequence

TABLE_FILE = "runtime-support.json"
# What `pull` also chooses among besides the table's runtimes: a TensorRT engine, served by the
# TensorRT-LLM it was built with (the engine's own facts decide, deploy/engine_check.py).
ENGINE_RUNTIME = "trtllm-engine"
# ... and a GGUF file, served by llama.cpp through llama-cpp-python's OpenAI-compatible server (the
# command its artifact packages, serving/llamacpp_server.json); it needs no GPU.
LLAMACPP_RUNTIME = "llamacpp"
LLAMACPP_PACKAGE = "llama_cpp"  # its package's import name, as toolchain.package_version takes it
# the table's runtime that is TensorRT-LLM: trtllm-serve serves an engine and, on 1.3+, an hf-checkpoint
TRTLLM_RUNTIME = "trtllm"

RUNTIMES: tuple[str, ...] = tuple(json.loads(resources.files("trtbuild").joinpath("data", TABLE_FILE).read_text())
                                  ["runtimes"])
# what `pull --runtime` chooses among, in preference order: llama.cpp last, so a GPU host takes an
# engine or an hf-checkpoint before a GGUF
PULL_RUNTIMES = (ENGINE_RUNTIME, *RUNTIMES, LLAMACPP_RUNTIME)
# what `bench --runtime` starts: the table's runtimes' servers and llama.cpp's
BENCH_RUNTIMES = (*RUNTIMES, LLAMACPP_RUNTIME)


def names_text(names: Sequence[str] = RUNTIMES) -> str:
    """`trtllm, vllm or sglang`: the runtimes as help and messages list them."""
    return " or ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else "".join(names)
