"""`gguf:` sources (llama.cpp's format): keyed by the file's sha256, dequantized by transformers into
a Hugging Face folder in the recipe's dtype."""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

from trtbuild.errors import InvalidInput
from trtbuild.builder.stages.base import StageContext
from trtbuild.store.summaries import SourceSummary
from trtbuild.builder.stages.source.common import Resolved, SourceContext
from trtbuild.model.files import locate_gguf  # noqa: F401 (also gguf.locate_gguf for its callers)


def resolve(ctx: SourceContext) -> Resolved:
    path = locate_gguf(ctx.runtime.location, Path(ctx.runtime.base_dir))
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise InvalidInput(f"source.gguf: {path}: not a GGUF file (no GGUF magic)")
    digest = ctx.state.sha256(path, ctx.progress)
    return Resolved("gguf", digest, {"files": {path.name: digest}}, runtime={"file": str(path)}, origin=f"sha256 of {path}")


def convert_gguf(ctx: StageContext) -> None:
    """`gguf:` sources: dequantize with transformers' GGUF loader into a Hugging Face folder in the
    recipe's dtype. transformers refuses save_pretrained on a GGUF-loaded model, so the weights are
    moved into a model built from the same config (reference/test-assets.md)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    gguf = Path(ctx.runtime.file)
    dtype = getattr(torch, ctx.params["dtype"])
    print(f"loading {gguf} (dequantizing to float32)", flush=True)
    with _gguf_parsed_once():
        _convert(ctx, gguf, dtype)


def _convert(ctx: StageContext, gguf: Path, dtype) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    result = model.load_state_dict(loaded.state_dict(), strict=True)
    print(f"weights moved: missing={list(result.missing_keys)} unexpected={list(result.unexpected_keys)}", flush=True)
    model.save_pretrained(ctx.out, safe_serialization=True)
    # transformers builds a fast tokenizer from the GGUF's tokenizer metadata; its slow-tokenizer
    # "vocab file" is the GGUF itself, which a default save copies as tokenizer.model (a file
    # sentencepiece cannot parse, the size of the whole model). legacy_format=False writes the fast
    # files only: tokenizer.json, tokenizer_config.json, special tokens, chat template.
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _special_tokens_as_the_gguf_says(tokenizer, gguf)
    tokenizer.save_pretrained(ctx.out, legacy_format=False)
    _byte_level_as_the_gguf_says(ctx.out, gguf)
    params = sum(p.numel() for p in model.parameters())
    ctx.report(SourceSummary(architecture=config.architectures[0] if config.architectures else None,
                             parameters=params, dtype=ctx.params["dtype"]))


@contextlib.contextmanager
def _gguf_parsed_once():
    """transformers parses the GGUF file three times (for the config, the weights and the
    tokenizer: a 49k-token vocabulary each time) and builds gguf-py's tensor-name map again for
    every module of the model; both are pure functions of their arguments, so within the stage
    each is computed once. gguf-py's names are looked up when transformers uses them."""
    import gguf

    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}

    def reader(path, *args, **kwargs):
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = reader_class(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


# GGUF metadata key -> the tokenizer attribute it sets
SPECIAL_TOKEN_IDS = {"tokenizer.ggml.bos_token_id": "bos_token", "tokenizer.ggml.eos_token_id": "eos_token",
                     "tokenizer.ggml.unknown_token_id": "unk_token", "tokenizer.ggml.padding_token_id": "pad_token"}
ADD_FLAGS = {"tokenizer.ggml.add_bos_token": "add_bos_token", "tokenizer.ggml.add_eos_token": "add_eos_token"}


def _special_tokens_as_the_gguf_says(tokenizer, gguf: Path) -> None:
    """transformers 4.57 builds a GGUF's BPE tokenizer with its BOS as EOS too, no padding token,
    and a BOS added to every text, whatever the GGUF says (SmolLM2's: BOS 1, EOS 2, padding 2, no
    BOS added). A model that stops on the wrong token is a wrong model: set them from the header."""
    from trtbuild.model.gguf_header import read_header

    metadata = read_header(gguf).metadata
    for key, attribute in SPECIAL_TOKEN_IDS.items():
        if key in metadata and 0 <= int(metadata[key]) < len(tokenizer):
            setattr(tokenizer, attribute, tokenizer.convert_ids_to_tokens(int(metadata[key])))
    for key, attribute in ADD_FLAGS.items():
        if key in metadata and hasattr(tokenizer, attribute):
            setattr(tokenizer, attribute, bool(metadata[key]))  # fast llama tokenizers rebuild their post-processor


def _byte_level_as_the_gguf_says(folder: Path, gguf: Path) -> None:
    """A GGUF whose tokenizer is GPT-2's byte-level BPE (tokenizer.ggml.model `gpt2`: SmolLM2's, with
    pre-tokenizer `smollm`) is loaded by transformers 4.57 as a LlamaTokenizer with byte fallback and
    a SentencePiece decoder in front of the byte-level one. It encodes the same ids, but the folder
    then claims a SentencePiece-style tokenizer: llama.cpp's converter takes it for one
    (gguf-py vocab.py LlamaHfVocab accepts a BPE model with byte_fallback) and writes a GGUF whose
    tokenizer llama.cpp cannot run on text. Written as the byte-level BPE it is, the folder encodes
    and decodes exactly as before and converts to `gpt2` with its pre-tokenizer."""
    import json

    from trtbuild.model.gguf_header import read_header

    if read_header(gguf).metadata.get("tokenizer.ggml.model") != "gpt2":
        return
    tokenizer_file, config_file = folder / "tokenizer.json", folder / "tokenizer_config.json"
    tokenizer = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    tokenizer["model"]["byte_fallback"] = False
    tokenizer["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    tokenizer_file.write_text(json.dumps(tokenizer, ensure_ascii=False, indent=2), encoding="utf-8")
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "GPT2Tokenizer"
    # transformers 4.57 writes add_prefix_space null; transformers 5 (vLLM's tokenizer loader) hands it
    # to tokenizers' ByteLevel, which refuses null. The pre-tokenizer's own value is the one it encodes with.
    config["add_prefix_space"] = _byte_level_prefix_space(tokenizer["pre_tokenizer"])
    config_file.write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def _byte_level_prefix_space(pre_tokenizer: dict) -> bool:
    """add_prefix_space of the ByteLevel pre-tokenizer (alone or in a Sequence); False without one."""
    if pre_tokenizer.get("type") == "ByteLevel":
        return bool(pre_tokenizer.get("add_prefix_space", False))
    for part in pre_tokenizer.get("pretokenizers", []) if pre_tokenizer.get("type") == "Sequence" else []:
        if part.get("type") == "ByteLevel":
            return bool(part.get("add_prefix_space", False))
    return False
