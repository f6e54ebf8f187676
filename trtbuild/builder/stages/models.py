"""The model a shared worker keeps between stages, so a variant loads its model once.

A shared worker (runner.WorkerPool) runs one stage after another in one process: quantize, both
checkpoint exports and validation of a variant. Loading the model is the cost they share (on a
70B model each load reads 140 GB), so the worker keeps the last model it loaded or made, under a
key that names its content: the input artifact's digest (or, for a quantized model, the sha256
of the quantized.json that pins every parameter), the dtype. A stage that finds it there uses it
without reading a byte; a cache hit in the store starts no worker and loads nothing.

One model is kept at a time (memory holds it plus the one a stage works on). A stage that changes
the model it gets (quantization, a cast, an in-place export) takes it out of the cache or works on
a deep copy: what the cache holds is always exactly what its key names. Loads are counted: the
worker records each stage's `model_loads` (and `checkpoint_reads`) in the action record (benchmarks/pipeline_speed.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable, Hashable, Optional

_kept: Optional[tuple[Hashable, Any]] = None
loads = 0  # source or quantized models read from disk in this process (the worker reports each stage's share)
read_backs = 0  # checkpoints a stage wrote, read back to validate them: that read is the check, never shared


def quantized_key(folder: Path, dtype: str) -> tuple:
    """The key of the quantized model a quantize artifact (or the folder quantize just wrote)
    rebuilds: its quantized.json names the sha256 of every source and quantized parameter."""
    from trtbuild.checkpoint.quantstate import MANIFEST_FILE

    return ("quantized", hashlib.sha256((Path(folder) / MANIFEST_FILE).read_bytes()).hexdigest(), dtype)


def source_key(digest: str, dtype: str) -> tuple:
    """The key of a source artifact's model, loaded in the torch dtype `dtype`."""
    return ("source", digest, dtype)


def quantized(source: Path, folder: Path, dtype: str, device: str):
    """The quantized model a quantize artifact `folder` rebuilds from `source`, kept for the stages
    after this one (shared: the caller must not change it)."""
    from trtbuild.checkpoint.quantstate import restore_quantized

    return shared(quantized_key(folder, dtype), lambda: restore_quantized(source, folder, dtype, device), device)


def _load(load: Callable[[], Any]) -> Any:
    global loads
    model = load()
    loads += 1
    return model


def read_back(load: Callable[[], Any]) -> Any:
    """A written checkpoint loaded to be validated (counted apart from the loads a cache saves)."""
    global read_backs
    model = load()
    read_backs += 1
    return model


def on_device(model, device: str):
    """The model on `device`, moved in place (a move between devices is exact)."""
    import torch

    want, have = torch.device(device), next(model.parameters()).device
    if want.type != have.type or (want.index is not None and want.index != have.index):
        model.to(want)
    return model


def shared(key: Hashable, load: Callable[[], Any], device: str):
    """The model for `key` on `device`, loaded (and kept) on a miss. The caller must not change it:
    it stays in the cache for the next stage."""
    global _kept
    if _kept is None or _kept[0] != key:
        release()
        _kept = (key, _load(load))
    return on_device(_kept[1], device)


def borrow(key: Hashable, load: Callable[[], Any], device: str):
    """The model for `key` on `device`: the kept one if it is that, else loaded for this stage alone,
    leaving the kept model kept (a stage that needs the model once, like the reference, between
    the quantize and the validation of a variant). The caller must not change it."""
    if _kept is not None and _kept[0] == key:
        return on_device(_kept[1], device)
    return _load(load)


def take(key: Hashable, load: Callable[[], Any]):
    """The model for `key`, out of the cache (no copy) or freshly loaded: the caller changes it and
    may `keep` what it becomes."""
    global _kept
    if _kept is not None and _kept[0] == key:
        model, _kept = _kept[1], None
        return model
    release()  # before the load: memory holds one model, not two
    return _load(load)


def keep(key: Hashable, model) -> None:
    """Keep `model` for the stages after this one (it must be exactly what `key` names)."""
    global _kept
    release()
    _kept = (key, model)


def release() -> None:
    """Drop the kept model (and the GPU memory torch's allocator holds for it)."""
    global _kept
    _kept = None
    import gc
    import sys

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
