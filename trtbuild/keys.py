"""Canonical JSON and action keys: the one place that decides what a key contains (design.md s.1).

A key is sha256(canonical_json({stage, stage_version, inputs, params, toolchain, platform})).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any


def _normalize(value: Any, where: str = "value") -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"{where}: {value} cannot be part of a key")
        return int(value) if value.is_integer() else value  # integers as integers
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: key {k!r} is not a string")
            out[k] = _normalize(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [_normalize(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(f"{where}: {type(value).__name__} cannot be part of a key")


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no insignificant whitespace, UTF-8, integers as integers, no NaN."""
    return json.dumps(_normalize(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


KEY_FIELDS = ("stage", "stage_version", "inputs", "params", "toolchain", "platform")


def action_key(fields: dict[str, Any]) -> str:
    if set(fields) != set(KEY_FIELDS):
        raise ValueError(f"a key has exactly the fields {', '.join(KEY_FIELDS)}")
    return hashlib.sha256(canonical_json(fields)).hexdigest()
