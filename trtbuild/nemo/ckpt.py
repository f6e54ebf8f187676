"""Read non-dist NeMo weights (model_weights.ckpt, mp_rank_XX/, tp_rank_XX_pp_rank_YYY/) and merge shards."""

from __future__ import annotations

import io
import pickle
import re
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from trtbuild.errors import InvalidInput
from trtbuild.nemo.tensors import TensorSource, skipped

CKPT = "model_weights.ckpt"
_MP = re.compile(r"^mp_rank_(\d{2})$")
_TP_PP = re.compile(r"^tp_rank_(\d{2})_pp_rank_(\d{3})$")
_LAYER = re.compile(r"^(?P<head>.*?(?:decoder|encoder)\.layers)\.(?P<idx>\d+)\.(?P<tail>.+)$")

# TP merge rules, nemo.md section 2 (megatron_change_num_partitions compute_tp_merge). Checked in order.
_REPLICATED = re.compile(
    r"(layer_norm_(weight|bias)|layernorm\.(weight|bias)|final_layernorm|pre_mlp_layernorm|"
    r"position_embeddings|(linear_proj|linear_fc2|self_attention\.dense|dense_4h_to_h)\.bias|inv_freq)$")
_ROW = re.compile(r"(linear_proj|linear_fc2|self_attention\.dense|dense_4h_to_h)\.weight$")
_GLU_PAIR = re.compile(r"(linear_fc1|dense_h_to_4h)\.(weight|bias)$")
_COLUMN = re.compile(
    r"(linear_qkv|query_key_value|linear_fc1|dense_h_to_4h|dense_h_to_4h_2|word_embeddings|output_layer)"
    r"\.(weight|bias)$")


def find_shards(root: Path) -> dict[tuple[int, int], Path] | None:
    """{(tp, pp): file} for the non-dist layouts of nemo.md section 1, or None if there are none."""
    if (root / CKPT).is_file():
        return {(0, 0): root / CKPT}
    shards: dict[tuple[int, int], Path] = {}
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        if "_fsdp_shard_" in sub.name:
            raise InvalidInput(f"{sub}: FSDP-sharded NeMo checkpoints are not supported")
        m = _MP.match(sub.name)
        key = (int(m[1]), 0) if m else None
        m2 = _TP_PP.match(sub.name)
        if m2:
            key = (int(m2[1]), int(m2[2]))
        if key is not None and (sub / CKPT).is_file():
            shards[key] = sub / CKPT
    if not shards:
        return None
    tps = sorted({t for t, _ in shards})
    pps = sorted({p for _, p in shards})
    if tps != list(range(len(tps))) or pps != list(range(len(pps))) or len(shards) != len(tps) * len(pps):
        raise InvalidInput(f"{root}: incomplete shard set {sorted(shards)} (expected every tp x pp rank)")
    return shards


def load_weights_only(path: Path) -> dict[str, Any]:
    """torch.load with weights_only=True only: a pickle that names anything but tensors is refused."""
    # TE's older _extra_state is an io.BytesIO: inert bytes, so it is the one class we allow besides tensors.
    with torch.serialization.safe_globals([io.BytesIO]), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note about pickle protocols is noise here
        try:
            try:
                obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                obj = torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) format
        except pickle.UnpicklingError as e:
            found = re.search(r"GLOBAL (\S+)", str(e))
            other = re.search(r"Unsupported [^.\n]*", str(e))
            why = f"{found[1]} is not allowed" if found else other[0] if other else "not a tensors-only pickle"
            raise InvalidInput(f"{path}: refused: it pickles Python objects, not just tensors "
                               f"(weights_only=True load: {why})") from None
        except (RuntimeError, EOFError, OSError) as e:
            raise InvalidInput(f"{path}: not a readable PyTorch checkpoint ({str(e).splitlines()[0]})") from None
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]  # a Lightning checkpoint wraps the model's state dict
    if not isinstance(obj, dict):
        raise InvalidInput(f"{path}: expected a state dict, found {type(obj).__name__}")
    out = {}
    for k, v in obj.items():
        if not isinstance(k, str) or skipped(k):
            continue
        if not isinstance(v, torch.Tensor):
            raise InvalidInput(f"{path}: entry '{k}' is a {type(v).__name__}, not a tensor")
        # megatron_amp_O2 wraps the module: keys read model.module.* (nemo.md section 1).
        out["model." + k[len("model.module."):] if k.startswith("model.module.") else k] = v
    return out


def _merge_rule(name: str, glu_pair: Callable[[str], bool]) -> str:
    if _REPLICATED.search(name):
        return "replicated"
    if _ROW.search(name):
        return "row"
    if _GLU_PAIR.search(name) and glu_pair(name):
        return "glu"
    if _COLUMN.search(name):
        return "column"
    return "unknown"


# The axis the TP shards of a tensor are concatenated along, by merge rule (None: every rank holds it all).
# column: QKV, each rank holding whole query groups, so the interleave survives the cat.
_MERGE_AXIS = {"replicated": None, "row": -1, "column": 0, "glu": 0}


def _known_rule(name: str, glu_pair: Callable[[str], bool]) -> str:
    rule = _merge_rule(name, glu_pair)
    if rule not in _MERGE_AXIS:
        raise InvalidInput(f"'{name}': no tensor-parallel merge rule for this key (unknown layout)")
    return rule


def merge_tp(name: str, shards: list[torch.Tensor], glu_pair: Callable[[str], bool]) -> torch.Tensor:
    """One tensor from its TP shards (nemo.md section 2)."""
    if len(shards) == 1:
        return shards[0]
    rule = _known_rule(name, glu_pair)
    if rule == "replicated":
        return shards[0]
    if rule == "glu":  # each rank holds [gate_r; up_r]: all gates first, then all ups
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(shards, dim=_MERGE_AXIS[rule])


def _merged_shape(name: str, shapes: list[tuple[int, ...]], glu_pair: Callable[[str], bool]) -> tuple[int, ...]:
    """merge_tp's shape, from the shards' shapes alone."""
    if len(shapes) == 1:
        return shapes[0]
    axis = _MERGE_AXIS[_known_rule(name, glu_pair)]
    if axis is None:
        return shapes[0]
    merged = list(shapes[0])
    merged[axis] = sum(s[axis] for s in shapes)
    return tuple(merged)


class CkptSource(TensorSource):
    """Non-dist weights: every shard loaded lazily (mmap), merged per name on request."""

    kind = "ckpt"

    def __init__(self, root: Path, shards: dict[tuple[int, int], Path], glu_pair: Callable[[str], bool]) -> None:
        self.origin = str(next(iter(shards.values())) if len(shards) == 1 else root)
        self._glu_pair = glu_pair
        tp = 1 + max(t for t, _ in shards)
        pp = 1 + max(p for _, p in shards)
        # name -> list of (state dict, stored key) over TP ranks
        self._parts: dict[str, list[tuple[dict, str]]] = {}
        offset = 0
        for stage in range(pp):
            dicts = [load_weights_only(shards[(t, stage)]) for t in range(tp)]
            keys = set(dicts[0])
            for t, d in enumerate(dicts[1:], 1):
                if set(d) != keys:
                    diff = sorted(keys.symmetric_difference(d))[0]
                    raise InvalidInput(f"{shards[(t, stage)]}: key set differs from tp rank 0 (e.g. '{diff}')")
            # PP stages number their layers from 0: shift by the layers of earlier stages.
            layers = {int(m["idx"]) for k in keys if (m := _LAYER.match(k))}
            for key in sorted(keys):
                m = _LAYER.match(key)
                name = f"{m['head']}.{int(m['idx']) + offset}.{m['tail']}" if m else key
                if name in self._parts:  # e.g. a tied output_layer copy on the last stage: keep the first
                    continue
                self._parts[name] = [(d, key) for d in dicts]
            offset += (max(layers) + 1) if layers else 0
        self.tp, self.pp = tp, pp
        self.details = {"backend": "ckpt", "tp": tp, "pp": pp, "files": len(shards)}

    def names(self) -> list[str]:
        return list(self._parts)

    def shape(self, name: str) -> tuple[int, ...]:
        shapes = [tuple(d[k].shape) for d, k in self._parts[name]]
        return _merged_shape(name, shapes, self._glu_pair)

    def dtype(self, name: str) -> torch.dtype:
        d, k = self._parts[name][0]
        return d[k].dtype

    def get(self, name: str) -> torch.Tensor:
        return merge_tp(name, [d[k] for d, k in self._parts[name]], self._glu_pair)
