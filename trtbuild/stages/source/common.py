"""What every source kind resolves to, and what it is given to resolve."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from trtbuild.store.state import StatCache


@dataclass(frozen=True)
class Resolved:
    """A source's identity without its bytes: the digest that enters the key (under `role`), what the
    lock file records (and `explain` shows), and local paths the stage run needs (never keyed)."""

    role: str
    digest: str
    lock: dict
    runtime: dict = field(default_factory=dict)
    origin: str = ""  # how it was resolved, for `explain` ("hub metadata", "lock file", ...)


@dataclass
class SourceContext:
    runtime: dict[str, Any]  # kind, location, base_dir, ... from the graph
    state: StatCache
    downloads: Path  # a folder of the store for downloaded source files
    locked: Optional[dict] = None  # the lock file's source entry, when there is one
    progress: Optional[Callable[[int], None]] = None


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
