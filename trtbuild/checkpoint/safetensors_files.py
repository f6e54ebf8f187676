"""safetensors files read without torch: a file's header, and which files hold a checkpoint's weights."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from trtbuild.errors import InvalidInput
from trtbuild.model.config import read_json_object

ST_CODE = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}
ST_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}


def read_safetensors_header(path: Path) -> dict[str, dict]:
    """name -> {"dtype", "shape", "data_offsets"}, read without mapping or loading the data."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise InvalidInput(f"{path.name}: not a safetensors file (shorter than 8 bytes)")
            (size,) = struct.unpack("<Q", head)
            if size > 100 << 20:
                raise InvalidInput(f"{path.name}: not a safetensors file (header length {size})")
            raw = f.read(size)
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such file") from None
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path.name}: unreadable safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise InvalidInput(f"{path.name}: unreadable safetensors header")
    header.pop("__metadata__", None)
    return header


def weight_files(folder: Path) -> list[str]:
    """The safetensors files that hold a HF checkpoint's weights: the index's shards, else
    model.safetensors, else every top-level *.safetensors (never a stray copy beside an index,
    such as Mistral's consolidated.safetensors)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise InvalidInput(f"{index}: no weight_map")
        files = sorted(set(weight_map.values()))
        missing = [name for name in files if not (folder / name).is_file()]
        if missing:
            raise InvalidInput(f"{index}: names {missing[0]}, which is missing")
        return files
    if (folder / "model.safetensors").is_file():
        return ["model.safetensors"]
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise InvalidInput(f"{folder}: no *.safetensors weights (PyTorch .bin checkpoints are not supported)")
    return files
