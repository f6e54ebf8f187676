"""The interface every NeMo weights reader offers: per-layer tensor names, shapes, lazy loads."""

from __future__ import annotations

import re
from typing import Iterable

import torch

# mcore dist checkpoints stack homogeneous layers on dim 0 and drop the index from the key
# (nemo.md section 0): "…decoder.layers.self_attention…" with no number after "layers.".
_STACKED = re.compile(r"^(?P<head>(?:.*\.)?decoder\.layers)\.(?P<tail>(?!\d+\.).+)$")


def skipped(key: str) -> bool:
    """Entries that are not model weights: TE/FP8 metadata and training-only state (nemo.md section 0)."""
    return "_extra_state" in key or key.startswith(("optimizer.", "optimizer_states")) or ".optimizer." in key


def unstack(entries: Iterable[tuple[str, tuple[int, ...]]]) -> dict[str, tuple[str, int | None]]:
    """Per-layer names for stacked keys: name -> (stored key, layer index on dim 0 or None)."""
    out: dict[str, tuple[str, int | None]] = {}
    for key, shape in entries:
        m = _STACKED.match(key)
        if m and shape:
            for i in range(shape[0]):
                out[f"{m['head']}.{i}.{m['tail']}"] = (key, i)
        else:
            out[key] = (key, None)
    return out


class TensorSource:
    """Read-only, lazily loaded weights. Names are per layer ("…layers.3.…"), prefixes kept as stored."""

    origin: str = ""   # the file or folder, for messages
    kind: str = ""     # "torch_dist", "zarr", "ckpt"
    details: dict = {}

    def names(self) -> list[str]:
        raise NotImplementedError

    def shape(self, name: str) -> tuple[int, ...]:
        raise NotImplementedError

    def dtype(self, name: str) -> torch.dtype:
        raise NotImplementedError

    def get(self, name: str) -> torch.Tensor:
        """One tensor, loaded now; callers drop it when done so memory stays at about one tensor."""
        raise NotImplementedError

    def close(self) -> None:
        pass
