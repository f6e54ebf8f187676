"""Carry a NeMo checkpoint's tokenizer into the HF folder: copy its files, describe SentencePiece models."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trtbuild.errors import InvalidInput
from trtbuild.model.files import TOKENIZER_FILES
from trtbuild.nemo.config import NemoConfig

_UUID_PREFIX = re.compile(r"^[0-9a-f]{32}_")  # artifacts are stored as <uuid4 hex>_<basename> (nemo.md §1)
_HF_TOKENIZER_FILES = TOKENIZER_FILES + ("spiece.model",)  # NeMo's T5-style SentencePiece name too


@dataclass
class TokenizerResult:
    kind: str                              # "sentencepiece", "huggingface", "megatron", "tiktoken", "none"
    files: list[str] = field(default_factory=list)
    vocab_size: Optional[int] = None       # unpadded, when the tokenizer tells
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    notes: list[str] = field(default_factory=list)


# --- a minimal SentencePiece ModelProto reader (no sentencepiece/protobuf dependency) ----------

def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes):
    """(field number, wire type, value) for each field of one protobuf message."""
    i = 0
    while i < len(buf):
        tag, i = _varint(buf, i)
        num, wire = tag >> 3, tag & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if i > len(buf):
            raise ValueError("truncated message")
        yield num, wire, value


def _int32(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def read_sentencepiece(data: bytes) -> dict:
    """Piece count and unk/bos/eos/pad ids from a SentencePiece ModelProto.

    ModelProto: 1 = pieces (1 piece, 2 score, 3 type), 2 = trainer_spec (40 unk_id, 41 bos_id,
    42 eos_id, 43 pad_id; defaults 0, 1, 2, -1), from sentencepiece_model.proto.
    """
    pieces: list[str] = []
    ids = {"unk": 0, "bos": 1, "eos": 2, "pad": -1}
    for num, wire, value in _fields(data):
        if num == 1 and wire == 2:
            piece = ""
            for n2, w2, v2 in _fields(value):
                if n2 == 1 and w2 == 2:
                    piece = v2.decode("utf-8")
            pieces.append(piece)
        elif num == 2 and wire == 2:
            for n2, w2, v2 in _fields(value):
                if w2 == 0 and n2 in (40, 41, 42, 43):
                    ids[{40: "unk", 41: "bos", 42: "eos", 43: "pad"}[n2]] = _int32(v2)
    if not pieces:
        raise ValueError("no pieces")
    tokens = {k: (i, pieces[i]) for k, i in ids.items() if 0 <= i < len(pieces)}
    return {"size": len(pieces), "tokens": tokens}


def _added(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def llama_tokenizer_files(sp: dict) -> tuple[dict, dict]:
    """tokenizer_config.json and special_tokens_map.json as transformers' LlamaTokenizer saves them
    for this SentencePiece model (its defaults: add BOS, no EOS, legacy, no pad token)."""
    tokens = sp["tokens"]
    special = {k: tokens[k] for k in ("unk", "bos", "eos") if k in tokens}
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "add_prefix_space": True,
        "added_tokens_decoder": {str(i): {**_added(p), "special": True} for i, p in sorted(special.values())},
        "bos_token": tokens["bos"][1] if "bos" in tokens else None,
        "clean_up_tokenization_spaces": False,
        "eos_token": tokens["eos"][1] if "eos" in tokens else None,
        "extra_special_tokens": {},
        "legacy": True,
        "model_max_length": int(1e30),  # transformers' VERY_LARGE_INTEGER
        "pad_token": None,
        "sp_model_kwargs": {},
        "spaces_between_special_tokens": False,
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": tokens["unk"][1] if "unk" in tokens else None,
        "use_default_system_prompt": False,
    }
    special_map = {f"{k}_token": _added(p) for k, (_, p) in sorted(special.items())}
    return config, special_map


def _write_json(path: Path, data: Any) -> None:
    # transformers writes these with indent=2, sorted keys, a trailing newline.
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


# --- locating the files ------------------------------------------------------------------------

def _inside(root: Path, path: Path) -> bool:
    r, p = os.path.realpath(root), os.path.realpath(path)
    return p == r or p.startswith(r + os.sep)


def _resolve(root: Path, value: Any, base: Path, what: str) -> Optional[Path]:
    """A file referenced by the YAML, only if it is inside the checkpoint (never host paths)."""
    if not isinstance(value, str) or not value:
        return None
    if value.startswith("nemo:"):  # nemo:X is ./X inside the archive (nemo.md section 1)
        path = root / value[len("nemo:"):]
        if not _inside(root, path):
            raise InvalidInput(f"{root}: tokenizer {what} '{value}' points outside the checkpoint")
        return path if path.exists() else None
    path = base / value
    if not os.path.isabs(value) and _inside(root, path) and path.exists():
        return path
    return None


def _copy(src: Path, out: Path, name: str, result: TokenizerResult, root: Path) -> None:
    if not src.is_file():
        return
    if not _inside(root, src):  # a link out of the checkpoint: never copy host files
        result.notes.append(f"{src.name} points outside the checkpoint: not copied")
        return
    shutil.copyfile(src, out / name)
    result.files.append(name)


def _sentencepiece(model: Path, out: Path, result: TokenizerResult, root: Path, copy: bool = True) -> None:
    if copy:
        _copy(model, out, "tokenizer.model", result, root)
    try:
        sp = read_sentencepiece(model.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        result.notes.append(f"tokenizer.model is not a readable SentencePiece model ({e}); configs not written")
        return
    result.vocab_size = sp["size"]
    toks = sp["tokens"]
    result.bos_token_id = toks["bos"][0] if "bos" in toks else None
    result.eos_token_id = toks["eos"][0] if "eos" in toks else None
    if "tokenizer_config.json" not in result.files:
        config, special = llama_tokenizer_files(sp)
        _write_json(out / "tokenizer_config.json", config)
        _write_json(out / "special_tokens_map.json", special)
        result.files += ["tokenizer_config.json", "special_tokens_map.json"]
        result.notes.append("tokenizer_config.json/special_tokens_map.json written with LlamaTokenizer defaults "
                            "(add_bos_token true, add_eos_token false, no chat template)")


def _hf_folder(folder: Path, out: Path, result: TokenizerResult, root: Path) -> None:
    for name in _HF_TOKENIZER_FILES:
        _copy(folder / name, out, name, result, root)
    cfg_path = out / "tokenizer_config.json"
    tok_json = out / "tokenizer.json"
    ids: dict[str, int] = {}
    try:
        if tok_json.is_file():
            data = json.loads(tok_json.read_text(encoding="utf-8"))
            vocab = (data.get("model") or {}).get("vocab")
            if isinstance(vocab, dict):
                ids.update(vocab)
            elif isinstance(vocab, list):  # unigram: [[piece, score], ...]
                ids.update({p[0]: i for i, p in enumerate(vocab)})
            ids.update({t["content"]: t["id"] for t in data.get("added_tokens", [])})
        elif (out / "vocab.json").is_file():
            ids.update(json.loads((out / "vocab.json").read_text(encoding="utf-8")))
        if ids:
            result.vocab_size = max(ids.values()) + 1
        if cfg_path.is_file():
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
            for tid, tok in (cfg.get("added_tokens_decoder") or {}).items():
                ids.setdefault(tok.get("content"), int(tid))
            for key in ("bos", "eos"):
                tok = cfg.get(f"{key}_token")
                tok = tok.get("content") if isinstance(tok, dict) else tok
                if tok in ids:
                    setattr(result, f"{key}_token_id", ids[tok])
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, TypeError, ValueError) as e:
        result.notes.append(f"tokenizer files unreadable for ids ({e})")
    if "tokenizer.model" in result.files and "tokenizer_config.json" not in result.files:
        _sentencepiece(out / "tokenizer.model", out, result, out, copy=False)


def export_tokenizer(cfg: NemoConfig, root: Path, out: Path) -> TokenizerResult:
    """Copy what the checkpoint holds of its tokenizer into `out`; report what it could not."""
    tok = cfg.tokenizer
    if cfg.nemo_version == 2:
        context = root / "context"
        target = str(tok.get("_target_", ""))
        if target.endswith("SentencePieceTokenizer"):
            result = TokenizerResult("sentencepiece")
            model = _resolve(root, tok.get("model_path"), context, "model_path")
            if model is None:
                result.notes.append(f"SentencePiece model {tok.get('model_path')!r} is not in the checkpoint")
            else:
                _sentencepiece(model, out, result, root)
            return result
        if target.endswith("AutoTokenizer"):
            result = TokenizerResult("huggingface")
            name = tok.get("pretrained_model_name")
            folder = context / name if isinstance(name, str) and not os.path.isabs(name) else None
            if folder is not None and folder.is_dir() and _inside(root, folder):
                _hf_folder(folder, out, result, root)
            else:
                result.notes.append(f"tokenizer {name!r} is a hub id or a path outside the checkpoint: not copied")
            return result
        return TokenizerResult("none", notes=[f"tokenizer {target or 'missing'!r}: not exported"])

    library = str(tok.get("library", "")).lower()
    if library == "sentencepiece":
        result = TokenizerResult("sentencepiece")
        model = _resolve(root, tok.get("model") or tok.get("tokenizer_model"), root, "model")
        if model is None:
            result.notes.append(f"SentencePiece model {tok.get('model')!r} is not in the archive")
        else:
            _sentencepiece(model, out, result, root)
        return result
    if library in ("huggingface", "megatron", "tiktoken"):
        result = TokenizerResult(library)
        for key in ("model", "vocab_file", "merge_file"):
            path = _resolve(root, tok.get(key), root, key)
            if path is not None and path.is_file():
                _copy(path, out, _UUID_PREFIX.sub("", path.name), result, root)
        if library == "megatron" and (out / "vocab.json").is_file():
            try:
                result.vocab_size = len(json.loads((out / "vocab.json").read_text(encoding="utf-8")))
            except (json.JSONDecodeError, UnicodeDecodeError):
                pass
        if library == "huggingface":
            result.notes.append(f"Hugging Face tokenizer {tok.get('type')!r} is referenced by name; its files are "
                                "not in the .nemo (fetch them from the hub)")
        if library == "tiktoken":
            result.notes.append("tiktoken vocabulary copied as is; no Hugging Face tokenizer files can be made")
        return result
    return TokenizerResult("none", notes=[f"tokenizer library {library or 'missing'!r}: not exported"])
