"""Stream tensors into one .safetensors file: the header is planned first, then each tensor is made and written."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterable

import torch

from trtbuild.nemo.mapping import Output

_ST_DTYPES = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}


def write_safetensors(path: Path, outputs: Iterable[Output]) -> int:
    """Write the file (via a temp name, renamed at the end); returns the bytes of tensor data.

    Shapes are known up front, so the header goes first and only one tensor (plus the source
    tensor it came from) is in memory at a time, instead of a whole second copy of the model.
    """
    outputs = list(outputs)
    header: dict = {"__metadata__": {"format": "pt"}}  # what transformers' save_pretrained writes
    offset = 0
    for o in outputs:
        if o.dtype not in _ST_DTYPES:
            raise ValueError(f"{o.name}: dtype {o.dtype} has no safetensors code")
        nbytes = math.prod(o.shape) * o.dtype.itemsize
        header[o.name] = {"dtype": _ST_DTYPES[o.dtype], "shape": list(o.shape),
                          "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header with spaces to an 8-byte boundary
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            f.write(len(raw).to_bytes(8, "little"))
            f.write(raw)
            for o in outputs:
                t = o.make()
                if tuple(t.shape) != tuple(o.shape) or t.dtype != o.dtype:
                    raise AssertionError(f"{o.name}: made {tuple(t.shape)} {t.dtype}, planned {o.shape} {o.dtype}")
                # Little-endian hosts only (as safetensors itself); view as bytes without another copy.
                f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)
                del t
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # never leave a half-written file behind
    return offset
