"""Which files of a model folder a build takes: config, tokenizer and weights, nothing else."""

from __future__ import annotations

import fnmatch
from typing import Iterable

# Files a model contributes: config, tokenizer and weights, top level only (`original/` and the
# like hold other formats). Weights are safetensors (+ index) when there are any, else PyTorch .bin
# files: never both, never other formats.
MODEL_FILES = (
    "config.json", "generation_config.json",
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja", "chat_template.json",
)
SAFETENSORS = ("*.safetensors", "model.safetensors.index.json")
TORCH_BINS = ("pytorch_model*.bin", "pytorch_model.bin.index.json")


def select_model_files(names: Iterable[str]) -> set[str]:
    top = [n for n in names if "/" not in n]
    weights = SAFETENSORS if any(fnmatch.fnmatch(n, "*.safetensors") for n in top) else TORCH_BINS
    return {n for n in top if n in MODEL_FILES or any(fnmatch.fnmatch(n, p) for p in weights)}
