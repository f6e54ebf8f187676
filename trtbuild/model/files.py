"""Which files of a model folder a build takes: config, tokenizer and weights, nothing else."""

from __future__ import annotations

import fnmatch
import importlib.util
import shutil
from pathlib import Path
from typing import Iterable

from trtbuild.errors import InvalidInput

# Files a model contributes: config, tokenizer and weights, top level only (`original/` and the
# like hold other formats). Weights are safetensors (+ index) when there are any, else PyTorch .bin
# files: never both, never other formats.
MODEL_FILES = (
    "config.json", "generation_config.json",
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja", "chat_template.json",
)
TOKENIZER_FILES = tuple(n for n in MODEL_FILES if n not in ("config.json", "generation_config.json"))
SAFETENSORS = ("*.safetensors", "model.safetensors.index.json")
TORCH_BINS = ("pytorch_model*.bin", "pytorch_model.bin.index.json")


def copy_companion_files(source: Path, out: Path) -> list[str]:
    """Copy the tokenizer files and generation_config.json the source has (everything of
    MODEL_FILES but config.json and the weights, which a stage writes itself); returns their names."""
    copied = []
    for name in MODEL_FILES:
        if name != "config.json" and (source / name).is_file():
            shutil.copyfile(source / name, out / name)
            copied.append(name)
    return copied


def select_model_files(names: Iterable[str]) -> set[str]:
    top = [n for n in names if "/" not in n]
    weights = SAFETENSORS if any(fnmatch.fnmatch(n, "*.safetensors") for n in top) else TORCH_BINS
    return {n for n in top if n in MODEL_FILES or any(fnmatch.fnmatch(n, p) for p in weights)}


def locate_gguf(location: str, base_dir: Path) -> Path:
    """A GGUF path, relative to the recipe, or `pkg:MODULE/FILE` inside an installed package."""
    if location.startswith("pkg:"):
        module, _, name = location[len("pkg:"):].partition("/")
        spec = importlib.util.find_spec(module)  # locates without importing the package
        if spec is None or not spec.submodule_search_locations:
            raise InvalidInput(f"source.gguf: {location}: Python package {module!r} is not installed")
        path = Path(list(spec.submodule_search_locations)[0]) / name
    else:
        path = Path(location).expanduser()
        path = path if path.is_absolute() else base_dir / path
    if not path.is_file():
        raise InvalidInput(f"source.gguf: {path}: no such file")
    return path
