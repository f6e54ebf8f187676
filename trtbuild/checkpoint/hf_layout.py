"""A Hugging Face LLaMA-family model's shape as the TensorRT-LLM layout needs it, from config.json
alone (no torch): the converter, the verifier and the inverse converter share it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from trtbuild.errors import InvalidInput
from trtbuild.model.config import parse_config

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
