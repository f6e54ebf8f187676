"""The source stage for local folders (`path:`) and GGUF files (`gguf:`).

A source is keyed by content: a folder by the tree digest of the files a model needs, a GGUF file
by its sha256 (both through the stat cache, so an unchanged multi-GB source is read once).
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from trtbuild.errors import InvalidInput
from trtbuild.stages.base import StageContext
from trtbuild.store.state import StatCache
from trtbuild.store.tree import build_manifest

# Files a model folder contributes (top level only: `original/` and the like are other formats).
MODEL_FILES = (
    "config.json", "generation_config.json",
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja", "chat_template.json",
)
SAFETENSORS = ("*.safetensors", "model.safetensors.index.json")
TORCH_BINS = ("pytorch_model*.bin", "pytorch_model.bin.index.json")


def model_file_filter(folder: Path) -> Callable[[str], bool]:
    """Config, tokenizer and weights; safetensors when there are any, else PyTorch .bin files."""
    top = {p.name for p in folder.iterdir() if p.is_file()}
    weights = SAFETENSORS if any(fnmatch.fnmatch(n, "*.safetensors") for n in top) else TORCH_BINS

    def include(rel: str) -> bool:
        return "/" not in rel and (rel in MODEL_FILES or any(fnmatch.fnmatch(rel, p) for p in weights))

    return include


@dataclass(frozen=True)
class Resolved:
    """What a source resolves to: the digest that enters the key, and what the lock file records."""

    digest: str
    lock: dict


def resolve_path(folder: Path, state: StatCache, progress=None) -> Resolved:
    if not folder.is_dir():
        raise InvalidInput(f"source.path: {folder}: no such folder")
    if not (folder / "config.json").is_file():
        raise InvalidInput(f"source.path: {folder} has no config.json (is it a Hugging Face model folder?)")
    manifest, _ = build_manifest(folder, state, include=model_file_filter(folder), progress=progress)
    files = {e.path: e.sha256 for e in manifest.entries}
    return Resolved(manifest.digest, {"kind": "path", "location": str(folder), "digest": manifest.digest, "files": files})


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


def resolve_gguf(path: Path, state: StatCache, progress=None) -> Resolved:
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise InvalidInput(f"source.gguf: {path}: not a GGUF file (no GGUF magic)")
    digest = state.sha256(path, progress)
    return Resolved(digest, {"kind": "gguf", "location": str(path), "digest": digest,
                             "files": {path.name: digest}})


# ---- stage entry points --------------------------------------------------------------------------

def adopt_folder(ctx: StageContext) -> None:
    """`path:` sources: the selected files of the folder are the artifact, ingested in place."""
    folder = Path(ctx.runtime["folder"])
    ctx.adopt(folder, model_file_filter(folder))


def convert_gguf(ctx: StageContext) -> None:
    """`gguf:` sources: dequantize with transformers' GGUF loader into a Hugging Face folder in the
    recipe's dtype. transformers refuses save_pretrained on a GGUF-loaded model, so the weights are
    moved into a model built from the same config (reference/test-assets.md)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(ctx.runtime["file"])
    dtype = getattr(torch, ctx.params["dtype"])
    print(f"loading {gguf} (dequantizing to float32)", flush=True)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    result = model.load_state_dict(loaded.state_dict(), strict=True)
    print(f"weights moved: missing={list(result.missing_keys)} unexpected={list(result.unexpected_keys)}", flush=True)
    model.save_pretrained(ctx.out, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.save_pretrained(ctx.out)
    params = sum(p.numel() for p in model.parameters())
    ctx.report({"architecture": config.architectures[0] if config.architectures else None,
                "parameters": params, "dtype": ctx.params["dtype"]})
