"""Stream an unquantized Hugging Face LLaMA-family checkpoint into a TensorRT-LLM checkpoint.

The model is never loaded. Every output tensor of every rank is planned first (name, shape, dtype
and the source slices it is made of), so the safetensors header of `rank{N}.safetensors` can be
written before any data; the data then follows piece by piece, each piece read with
`safetensors.safe_open(...).get_slice(...)` in row blocks of at most `chunk_bytes`. One rank is
written at a time and only the slices that rank needs are read, so peak memory is about one row
block (2-3 x `chunk_bytes`, 64 MiB by default), not one tensor and never one rank, whatever the model
size (measured: +22 MiB peak RSS for a 240 MiB model at TP2; a 70B model was not tried).

Why row blocks and a handle per read: safetensors >= 0.8 returns *views* of a memory map, and every
page a slice touches stays resident (and counts in RSS/VmHWM) until the map is dropped. A
column slice `[:, a:b]` of a row-major matrix touches every row. So each read opens the file,
copies one block of whole source rows' worth of bytes into a fresh tensor (converting the dtype on
the way) and closes it again; the `"pread"` backend is no help, it reads the whole tensor for any
slice.

Layout (reference/trtllm.md section 2, checked tensor for tensor against ModelOpt 0.47's
`export_tensorrt_llm_checkpoint` in tests/test_trtllm_convert.py):
- `transformer.vocab_embedding.weight` (first PP stage): vocab padded with zero rows to a multiple of
  tp and split on dim 0 (ModelOpt writes `use_parallel_embedding: true`, `embedding_sharding_dim: 0`).
- `transformer.layers.{l - first_layer_of_stage}.`: `input_layernorm`, `post_layernorm` replicated;
  `attention.qkv` = per rank cat(q_t, k_t, v_t), each split on dim 0, KV heads duplicated when tp
  exceeds them (rank t gets KV head t * kv // tp); `attention.dense` row-parallel (dim 1);
  `mlp.fc` = gate_proj, `mlp.gate` = up_proj (dim 0), `mlp.proj` = down_proj (dim 1).
  Mixtral: `mlp.router.weight` float32 replicated, `mlp.fc` [E, 2I/tp, H] = per expert w3_t then
  w1_t, `mlp.proj` [E, H, I/tp] = w2 split on its dim 1.
- `transformer.ln_f.weight`, `lm_head.weight` (last PP stage; lm_head from embed_tokens when tied,
  vocab padded with zero rows to a multiple of tp, split on dim 0).
"""

from __future__ import annotations

import json
import os
import re
import resource
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

from trtbuild import __version__
from trtbuild.errors import InvalidInput
from trtbuild.modelconfig import padded_vocab, parse_config, read_json_object

# model_type -> ModelOpt's decoder_type (modelopt/torch/export/model_utils.py).
FAMILIES = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen"}

# Class defaults of the transformers config classes, for keys a hand-written config.json may omit
# (save_pretrained writes them all). LlamaConfig's num_key_value_heads defaults to the head count.
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"rope_theta": 10000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "hidden_act": "silu"},
    "mistral": {"rope_theta": 10000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 131072,
                "num_key_value_heads": 8, "hidden_act": "silu"},
    "qwen2": {"rope_theta": 10000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
              "num_key_value_heads": 32, "hidden_act": "silu"},
    "mixtral": {"rope_theta": 1e6, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
                "num_key_value_heads": 8, "hidden_act": "silu", "num_experts_per_tok": 2},
}

DTYPES = {"float16": "float16", "fp16": "float16", "half": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16", "float32": "float32", "fp32": "float32"}
_ST_CODE = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}
ST_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
DEFAULT_CHUNK_BYTES = 64 << 20


# --------------------------------------------------------------------------------------------
# The model's shape, from config.json alone (shared with verify.py; no torch here)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HFLayout:
    """What the TensorRT-LLM layout of a LLaMA-family model depends on."""

    model_type: str
    architecture: str
    decoder: str
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    num_experts: int
    top_k: int
    tied: bool
    qkv_bias: bool
    dense_bias: bool
    mlp_bias: bool
    norm_eps: float
    max_position_embeddings: Optional[int]
    hidden_act: str
    rotary_pct: float
    rotary_base: float
    rotary_scaling: Optional[dict]
    dtype: Optional[str]


def hf_rope(hf: dict) -> tuple[float, Optional[dict]]:
    """(rotary_base, rotary_scaling) as TensorRT-LLM wants them, from rope_theta/rope_scaling or the
    transformers-5 `rope_parameters` (reference/modelopt.md section 6)."""
    params = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), dict) else None
    theta = hf.get("rope_theta")
    if theta is None and params is not None:
        theta = params.get("rope_theta")
    if theta is None:
        theta = _FAMILY_DEFAULTS.get(str(hf.get("model_type")), {}).get("rope_theta", 10000.0)
    scaling = hf.get("rope_scaling")
    if scaling is None and params is not None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if not isinstance(scaling, dict) or not scaling:
        return float(theta), None
    scaling = dict(scaling)
    # transformers 4.x config classes copy a legacy "type" into "rope_type"; ModelOpt copies the
    # resulting dict, so do the same.
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling["type"]
    if scaling.get("rope_type", scaling.get("type")) == "default" and "factor" not in scaling:
        # Deliberate difference: ModelOpt would copy {"rope_type": "default"}; it means "no scaling".
        return float(theta), None
    return float(theta), scaling


def hf_layout(hf: dict, source: str = "config.json") -> HFLayout:
    """Normalize a Hugging Face config.json dict of a supported family; InvalidInput otherwise."""
    model_type = str(hf.get("model_type", ""))
    if model_type not in FAMILIES:
        raise InvalidInput(f"{source}: model_type {model_type!r} is not supported by the streaming converter "
                           f"(supported: {', '.join(sorted(FAMILIES))})")
    filled = dict(hf)
    for key, value in _FAMILY_DEFAULTS[model_type].items():
        if filled.get(key) is None and not (key == "rope_theta" and "rope_parameters" in filled):
            filled[key] = value
    spec = parse_config(filled, source)
    base, scaling = hf_rope(filled)
    moe = model_type == "mixtral"
    if moe and spec.num_experts <= 0:
        raise InvalidInput(f"{source}: a Mixtral config needs num_local_experts")
    rotary_pct = next((float(filled[k]) for k in ("rotary_pct", "partial_rotary_factor")
                       if filled.get(k) is not None), 1.0)
    return HFLayout(
        model_type=model_type,
        architecture=spec.architecture,
        decoder=FAMILIES[model_type],
        num_layers=spec.num_layers,
        hidden=spec.hidden_size,
        heads=spec.num_heads,
        kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate=spec.intermediate_size,
        vocab=spec.vocab_size,
        num_experts=spec.num_experts if moe else 0,
        top_k=spec.experts_per_token if moe else 0,
        tied=spec.tied_embeddings,
        # Qwen2 always has q/k/v biases; Llama's attention_bias adds them to q, k, v and o.
        qkv_bias=model_type == "qwen2" or (model_type == "llama" and bool(filled.get("attention_bias"))),
        dense_bias=model_type == "llama" and bool(filled.get("attention_bias")),
        mlp_bias=model_type == "llama" and bool(filled.get("mlp_bias")),
        norm_eps=float(filled["rms_norm_eps"]),
        max_position_embeddings=spec.max_position_embeddings,
        hidden_act=str(filled.get("hidden_act") or "silu"),
        rotary_pct=rotary_pct,
        rotary_base=base,
        rotary_scaling=scaling,
        dtype=spec.dtype,
    )


def normalize_dtype(dtype: str, layout: Optional[HFLayout] = None) -> str:
    if dtype == "auto" and layout is not None and layout.dtype in ("float16", "bfloat16"):
        return layout.dtype
    if dtype not in DTYPES:
        choices = "float16, bfloat16, float32" + (" or auto" if layout else "")
        raise InvalidInput(f"dtype {dtype!r}: expected one of {choices}")
    return DTYPES[dtype]


def check_parallel(layout: HFLayout, tp: int, pp: int, source: str = "config.json") -> None:
    """The splits must be exact (ModelOpt asserts the same, except that it would zero-pad uneven
    column splits, which TensorRT-LLM cannot use)."""
    if not isinstance(tp, int) or not isinstance(pp, int) or tp < 1 or pp < 1:
        raise InvalidInput(f"tp and pp must be positive integers, got tp={tp!r} pp={pp!r}")
    if layout.heads % tp:
        raise InvalidInput(f"{source}: num_attention_heads {layout.heads} is not divisible by tp {tp}")
    if layout.kv_heads % tp and tp % layout.kv_heads:
        raise InvalidInput(f"{source}: num_key_value_heads {layout.kv_heads} and tp {tp}: one must divide the other")
    if layout.intermediate % tp:
        raise InvalidInput(f"{source}: intermediate_size {layout.intermediate} is not divisible by tp {tp}")
    if layout.num_layers % pp:
        raise InvalidInput(f"{source}: num_hidden_layers {layout.num_layers} is not divisible by pp {pp}")


def kv_rows(layout: HFLayout, tp_rank: int, tp: int) -> tuple[int, int]:
    """Rows of k_proj/v_proj that rank tp_rank holds (a whole KV head, duplicated, when tp > KV heads)."""
    hd = layout.head_dim
    if layout.kv_heads >= tp:
        per = layout.kv_heads // tp
        return tp_rank * per * hd, (tp_rank + 1) * per * hd
    head = tp_rank * layout.kv_heads // tp
    return head * hd, (head + 1) * hd


def build_trtllm_config(layout: HFLayout, tp: int, pp: int, dtype: str) -> dict:
    """config.json in the shape ModelOpt 0.47 writes it (key for key, same order) for the same
    unquantized model; differences are deliberate and commented."""
    config: dict[str, Any] = {
        # Deliberate: the producer is trtbuild, not modelopt.
        "producer": {"name": "trtbuild", "version": __version__},
        "architecture": layout.architecture,
        "dtype": dtype,
        "logits_dtype": "float16" if dtype == "bfloat16" else dtype,
        "num_hidden_layers": layout.num_layers,
        "num_attention_heads": layout.heads,
        "num_key_value_heads": layout.kv_heads,  # the HF count: duplication is in the weights
        "hidden_size": layout.hidden,
        "norm_epsilon": layout.norm_eps,
        "vocab_size": layout.vocab,  # unpadded, as ModelOpt writes it for unquantized models
        "max_position_embeddings": layout.max_position_embeddings,
        # ModelOpt's MoE config always says swiglu (layer_utils.build_moe_config).
        "hidden_act": "swiglu" if layout.num_experts else layout.hidden_act,
        "use_parallel_embedding": True,
        "embedding_sharding_dim": 0,
        "head_size": layout.head_dim,
        "intermediate_size": layout.intermediate,
        "position_embedding_type": "rope_gpt_neox",
        "share_embedding_table": False,  # lm_head.weight is always written, even when tied
        "residual_mlp": False,
        "bias": layout.dense_bias,
        "rotary_pct": layout.rotary_pct,
        "rank": tp * pp - 1,  # ModelOpt writes config.json from the last rank; TRT-LLM ignores it
        "decoder": layout.decoder,
        "rmsnorm": True,
        "lm_head_bias": False,
        # Deliberate: always written and always from the HF config (rope_theta/rope_scaling or
        # transformers-5 rope_parameters); ModelOpt drops them with transformers 5.
        "rotary_base": layout.rotary_base,
    }
    if layout.rotary_scaling:
        config["rotary_scaling"] = layout.rotary_scaling
    if layout.decoder == "qwen":
        # Deliberate: ModelOpt's fallback config (no tensorrt_llm installed) omits these, and
        # TRT-LLM's QWenConfig then defaults to qwen_type "qwen" (Qwen-1 MLP sizes).
        config["qwen_type"] = layout.model_type
        config["attn_bias"] = layout.qkv_bias
    config["mapping"] = {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}
    config["quantization"] = {"quant_algo": None, "kv_cache_quant_algo": None}
    if layout.num_experts:
        config["mapping"].update({"moe_tp_size": tp, "moe_ep_size": 1})
        config["moe"] = {"num_experts": layout.num_experts, "top_k": layout.top_k, "normalization_mode": 1}
    return config


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


# --------------------------------------------------------------------------------------------
# Source checkpoint and the per-rank plan
# --------------------------------------------------------------------------------------------

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


class _Source:
    """The tensors of a HF safetensors folder (single file, or sharded with an index)."""

    def __init__(self, folder: Path) -> None:
        self.entries: dict[str, tuple[Path, str, tuple[int, ...]]] = {}
        for name in weight_files(folder):
            path = folder / name
            for key, info in read_safetensors_header(path).items():
                self.entries[key] = (path, str(info["dtype"]), tuple(int(d) for d in info["shape"]))

    def has(self, name: str) -> bool:
        return name in self.entries

    def shape(self, name: str, expected: tuple[int, ...]) -> tuple[int, ...]:
        if name not in self.entries:
            raise InvalidInput(f"source checkpoint: tensor {name} is missing (expected shape {list(expected)})")
        found, st_dtype = self.entries[name][2], self.entries[name][1]
        if st_dtype not in ("BF16", "F16", "F32"):
            raise InvalidInput(f"source checkpoint: {name} is {st_dtype}; only unquantized (float) checkpoints "
                               f"can be converted (quantize with ModelOpt instead)")
        if found != tuple(expected):
            raise InvalidInput(f"source checkpoint: {name}: expected shape {list(expected)} from config.json, "
                               f"found {list(found)}")
        return found

    def read(self, name: str, rows: tuple[int, int], cols: Optional[tuple[int, int]], dtype):
        import torch
        from safetensors import safe_open

        path = self.entries[name][0]
        # A handle per read: the tensors safe_open returns are views of its memory map, and the
        # map (with every page touched) lives until the handle and the views are gone.
        with safe_open(str(path), framework="pt") as f:
            view = f.get_slice(name)
            part = view[rows[0]:rows[1]] if cols is None else view[rows[0]:rows[1], cols[0]:cols[1]]
            out = part.to(dtype=dtype, memory_format=torch.contiguous_format, copy=True)
            del part, view
        return out


@dataclass(frozen=True)
class _Slice:
    name: str
    rows: Optional[tuple[int, int]] = None  # on dim 0; None = all
    cols: Optional[tuple[int, int]] = None  # on dim 1 (2-D sources only); None = all


@dataclass(frozen=True)
class _Zeros:
    shape: tuple[int, ...]


@dataclass
class _Out:
    name: str
    shape: tuple[int, ...]
    dtype: str  # float16 / bfloat16 / float32
    pieces: list = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * ST_ITEMSIZE[_ST_CODE[self.dtype]]


class _Planner:
    def __init__(self, layout: HFLayout, src: _Source, tp: int, pp: int, dtype: str) -> None:
        self.L, self.src, self.tp, self.pp, self.dtype = layout, src, tp, pp, dtype

    def whole(self, dst: str, name: str, shape: tuple[int, ...], dtype: Optional[str] = None) -> _Out:
        self.src.shape(name, shape)
        return _Out(dst, shape, dtype or self.dtype, [_Slice(name)])

    def column(self, dst: str, name: str, full: tuple[int, ...], t: int) -> _Out:
        """Split on dim 0 (column-parallel linear, or its bias)."""
        self.src.shape(name, full)
        per = full[0] // self.tp
        return _Out(dst, (per,) + full[1:], self.dtype, [_Slice(name, (t * per, (t + 1) * per))])

    def row(self, dst: str, name: str, full: tuple[int, int], t: int) -> _Out:
        """Split on dim 1 (row-parallel linear)."""
        self.src.shape(name, full)
        per = full[1] // self.tp
        return _Out(dst, (full[0], per), self.dtype, [_Slice(name, None, (t * per, (t + 1) * per))])

    def vocab(self, dst: str, name: str, t: int) -> _Out:
        """Embedding / lm_head: vocab zero-padded to a multiple of tp, split on dim 0."""
        V, H = self.L.vocab, self.L.hidden
        self.src.shape(name, (V, H))
        per = padded_vocab(V, self.tp) // self.tp
        start, stop = t * per, min((t + 1) * per, V)
        pieces: list = []
        if stop > start:
            pieces.append(_Slice(name, (start, stop)))
        if per - max(stop - start, 0):
            pieces.append(_Zeros((per - max(stop - start, 0), H)))
        return _Out(dst, (per, H), self.dtype, pieces)

    def rank(self, rank: int) -> list[_Out]:
        L, tp = self.L, self.tp
        t, p = rank % tp, rank // tp
        per_stage = L.num_layers // self.pp
        first = p * per_stage
        outs: list[_Out] = []
        if p == 0:
            outs.append(self.vocab("transformer.vocab_embedding.weight", "model.embed_tokens.weight", t))
        for layer in range(first, first + per_stage):
            outs += self.layer(layer, layer - first, t)
        if p == self.pp - 1:
            outs.append(self.whole("transformer.ln_f.weight", "model.norm.weight", (L.hidden,)))
            head = "lm_head.weight"
            if L.tied or not self.src.has(head):
                if not L.tied:
                    raise InvalidInput("source checkpoint: tensor lm_head.weight is missing and "
                                       "tie_word_embeddings is false")
                head = "model.embed_tokens.weight"
            outs.append(self.vocab("lm_head.weight", head, t))
        return outs

    def layer(self, layer: int, local: int, t: int) -> list[_Out]:
        L, tp = self.L, self.tp
        s, d = f"model.layers.{layer}.", f"transformer.layers.{local}."
        H, hd = L.hidden, L.head_dim
        q_full, kv_full = L.heads * hd, L.kv_heads * hd
        q_per = q_full // tp
        k0, k1 = kv_rows(L, t, tp)
        outs = [self.whole(d + "input_layernorm.weight", s + "input_layernorm.weight", (H,))]

        names = {x: f"{s}self_attn.{x}_proj" for x in "qkvo"}
        for x, rows in (("q", q_full), ("k", kv_full), ("v", kv_full)):
            self.src.shape(names[x] + ".weight", (rows, H))
        qkv_rows = q_per + 2 * (k1 - k0)
        outs.append(_Out(d + "attention.qkv.weight", (qkv_rows, H), self.dtype, [
            _Slice(names["q"] + ".weight", (t * q_per, (t + 1) * q_per)),
            _Slice(names["k"] + ".weight", (k0, k1)),
            _Slice(names["v"] + ".weight", (k0, k1)),
        ]))
        if L.qkv_bias:
            for x, rows in (("q", q_full), ("k", kv_full), ("v", kv_full)):
                self.src.shape(names[x] + ".bias", (rows,))
            outs.append(_Out(d + "attention.qkv.bias", (qkv_rows,), self.dtype, [
                _Slice(names["q"] + ".bias", (t * q_per, (t + 1) * q_per)),
                _Slice(names["k"] + ".bias", (k0, k1)),
                _Slice(names["v"] + ".bias", (k0, k1)),
            ]))
        outs.append(self.row(d + "attention.dense.weight", names["o"] + ".weight", (H, q_full), t))
        if L.dense_bias:  # row-parallel: the bias is added once, after the all-reduce
            outs.append(self.whole(d + "attention.dense.bias", names["o"] + ".bias", (H,)))
        outs.append(self.whole(d + "post_layernorm.weight", s + "post_attention_layernorm.weight", (H,)))

        I = L.intermediate
        if L.num_experts:
            E, per = L.num_experts, I // tp
            moe = s + "block_sparse_moe."
            outs.append(self.whole(d + "mlp.router.weight", moe + "gate.weight", (E, H), dtype="float32"))
            fc, proj = [], []
            for e in range(E):
                w1, w2, w3 = (f"{moe}experts.{e}.w{i}.weight" for i in (1, 2, 3))
                self.src.shape(w1, (I, H))
                self.src.shape(w3, (I, H))
                self.src.shape(w2, (H, I))
                fc += [_Slice(w3, (t * per, (t + 1) * per)), _Slice(w1, (t * per, (t + 1) * per))]
                proj.append(_Slice(w2, None, (t * per, (t + 1) * per)))
            outs.append(_Out(d + "mlp.fc.weight", (E, 2 * per, H), self.dtype, fc))
            outs.append(_Out(d + "mlp.proj.weight", (E, H, per), self.dtype, proj))
        else:
            mlp = s + "mlp."
            outs.append(self.column(d + "mlp.fc.weight", mlp + "gate_proj.weight", (I, H), t))
            outs.append(self.column(d + "mlp.gate.weight", mlp + "up_proj.weight", (I, H), t))
            outs.append(self.row(d + "mlp.proj.weight", mlp + "down_proj.weight", (H, I), t))
            if L.mlp_bias:
                outs.append(self.column(d + "mlp.fc.bias", mlp + "gate_proj.bias", (I,), t))
                outs.append(self.column(d + "mlp.gate.bias", mlp + "up_proj.bias", (I,), t))
                outs.append(self.whole(d + "mlp.proj.bias", mlp + "down_proj.bias", (H,)))
        return outs


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

def _blocks(src: _Source, piece, torch_dtype, itemsize: int, chunk_bytes: int) -> Iterator:
    import torch

    if isinstance(piece, _Zeros):
        rows, rest = piece.shape[0], piece.shape[1:]
        width = 1
        for d in rest:
            width *= d
        step = max(1, chunk_bytes // max(1, width * itemsize))
        for r0 in range(0, rows, step):
            yield torch.zeros((min(step, rows - r0),) + tuple(rest), dtype=torch_dtype)
        return
    _, st_dtype, shape = src.entries[piece.name]
    a, b = piece.rows or (0, shape[0])
    # Block height from the *source* row width: a column slice touches whole source rows.
    width = 1
    for d in shape[1:]:
        width *= d
    step = max(1, chunk_bytes // max(1, width * ST_ITEMSIZE.get(st_dtype, 4)))
    for r0 in range(a, b, step):
        yield src.read(piece.name, (r0, min(b, r0 + step)), piece.cols, torch_dtype)


def _write_rank(path: Path, outs: list[_Out], src: _Source, chunk_bytes: int,
                progress: Optional[Callable[[int], None]]) -> int:
    """Write one safetensors file: header first (all shapes are known), then the data in order."""
    import torch

    torch_dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "producer": f"trtbuild {__version__}"}}
    offset = 0
    for out in outs:
        header[out.name] = {"dtype": _ST_CODE[out.dtype], "shape": list(out.shape),
                            "data_offsets": [offset, offset + out.nbytes]}
        offset += out.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)  # the data section starts 8-byte aligned
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for out in outs:
            dt = torch_dtypes[out.dtype]
            itemsize = ST_ITEMSIZE[_ST_CODE[out.dtype]]
            written = 0
            for piece in out.pieces:
                for block in _blocks(src, piece, dt, itemsize, chunk_bytes):
                    data = block.reshape(-1).view(torch.uint8).numpy()
                    f.write(memoryview(data))
                    written += data.nbytes
                    if progress is not None:
                        progress(data.nbytes)
                    del data, block
            if written != out.nbytes:  # a planning bug, never a user error
                raise AssertionError(f"{path.name}: {out.name}: wrote {written} bytes, planned {out.nbytes}")
    os.replace(partial, path)
    return 8 + len(raw) + offset


def _rss_now() -> Optional[int]:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def convert_hf_to_trtllm(src: Union[Path, str], out: Union[Path, str], tp: int, pp: int, dtype: str,
                         progress: Optional[Callable[[int, int], None]] = None, *,
                         chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> dict:
    """Convert the unquantized HF checkpoint folder `src` into a TensorRT-LLM checkpoint in `out`.

    `progress`, if given, is called after each block with (bytes written so far, bytes in all).
    Returns a report: per-rank tensor counts and bytes,
    seconds, and peak RSS (resource.getrusage, the whole process's high-water mark)."""
    started = time.monotonic()
    rss_start = _rss_now()
    src, out = Path(src), Path(out)
    hf = read_json_object(src / "config.json")
    if hf.get("quantization_config"):
        raise InvalidInput(f"{src / 'config.json'}: has a quantization_config; the streaming converter takes "
                           f"unquantized checkpoints only")
    layout = hf_layout(hf, str(src / "config.json"))
    dtype = normalize_dtype(dtype, layout)
    check_parallel(layout, tp, pp, str(src / "config.json"))
    source = _Source(src)
    planner = _Planner(layout, source, tp, pp, dtype)
    world = tp * pp
    plans = [planner.rank(r) for r in range(world)]  # validates every source shape before writing

    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("rank*.safetensors*"):  # leftovers of an earlier, larger mapping or a crash
        m = re.match(r"^rank(\d+)\.safetensors(\.partial)?$", stale.name)
        if m and (m.group(2) or int(m.group(1)) >= world):
            stale.unlink()
    (out / "config.json").unlink(missing_ok=True)  # written last: its presence marks a finished checkpoint

    total, written = sum(o.nbytes for plan in plans for o in plan), 0

    def advance(nbytes: int) -> None:
        nonlocal written
        written += nbytes
        progress(written, total)

    ranks = []
    for r, plan in enumerate(plans):
        path = out / f"rank{r}.safetensors"
        size = _write_rank(path, plan, source, chunk_bytes, advance if progress else None)
        ranks.append({"rank": r, "file": path.name, "tensors": len(plan), "bytes": size})

    # ModelOpt writes this for unquantized exports too; TRT-LLM reads it only for MIXED_PRECISION.
    _write_json(out / "quant_cfg.json", {"quant_algo": None, "kv_cache_quant_algo": None, "quantized_layers": {}})
    _write_json(out / "config.json", build_trtllm_config(layout, tp, pp, dtype))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "tp": tp, "pp": pp, "dtype": dtype, "architecture": layout.architecture,
        "ranks": ranks,
        "tensors_per_rank": [r["tensors"] for r in ranks],
        "bytes": sum(r["bytes"] for r in ranks),
        "seconds": round(time.monotonic() - started, 3),
        "peak_rss_bytes": peak,
        "rss_start_bytes": rss_start,
    }


def _write_json(path: Path, data: dict) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")
    os.replace(partial, path)
