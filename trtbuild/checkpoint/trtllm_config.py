"""The config.json of a TensorRT-LLM checkpoint: the one the streaming converter writes, and the
corrections a ModelOpt-exported one needs (reference/modelopt.md section 6)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from trtbuild import __version__
from trtbuild.checkpoint.hf_layout import DTYPES, HFLayout, hf_layout
from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.model.config import read_json_object


def build_trtllm_config(layout: HFLayout, tp: int, pp: int, dtype: str, quant_algo: Optional[str] = None) -> dict:
    """config.json in the shape ModelOpt 0.47 writes it (key for key, same order) for the same
    unquantized model; differences are deliberate and commented. `quant_algo`: a weight-only
    algorithm TensorRT-LLM quantizes at load (quantformats.trtllm_loadtime_algo), the weights
    staying float."""
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
    if quant_algo is not None:
        # What TensorRT-LLM's own flow writes for int8 weight-only (QuantConfig(quant_algo=W8A16)):
        # QuantMode.from_quant_algo makes it per channel (no groups, so no group_size), with no zero
        # point and no pre-quant scale (written out, they are QuantConfig's defaults). No
        # exclude_modules: TensorRT-LLM's defaults keep lm_head and the embedding float, which a
        # given list would replace (trtllm_load_rules.exclusion_problems).
        config["quantization"] = {"quant_algo": quant_algo, "kv_cache_quant_algo": None,
                                  "has_zero_point": False, "pre_quant_scale": False}
    if layout.num_experts:
        config["mapping"].update({"moe_tp_size": tp, "moe_ep_size": 1})
        config["moe"] = {"num_experts": layout.num_experts, "top_k": layout.top_k, "normalization_mode": 1}
    return config


def read_mapping(cfg: dict) -> tuple[int, int, int]:
    """(tp, pp, world_size) from config.json's mapping; TrtbuildError unless they agree."""
    mapping = cfg.get("mapping")
    if not isinstance(mapping, dict):
        raise TrtbuildError(f"config.json: mapping expected {{world_size, tp_size, pp_size}}, found {mapping!r}")
    tp, pp = mapping.get("tp_size", 1), mapping.get("pp_size", 1)
    world = mapping.get("world_size", 1)
    for key, value in (("tp_size", tp), ("pp_size", pp), ("world_size", world)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TrtbuildError(f"config.json: mapping.{key} expected a positive integer, found {value!r}")
    if world != tp * pp:
        raise TrtbuildError(f"config.json: mapping world_size expected tp_size x pp_size = {tp * pp}, found {world}")
    return tp, pp, world


def norm_rope_scaling(scaling: Any) -> Optional[dict]:
    if not isinstance(scaling, dict) or not scaling:
        return None
    out = {k: v for k, v in scaling.items() if k != "type"}
    out["rope_type"] = scaling.get("rope_type", scaling.get("type"))
    return {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v) for k, v in out.items()}


_MISSING = object()


def fix_trtllm_config(folder: Path, hf_config: dict, requested: dict) -> list[str]:
    """Correct a ModelOpt-exported config.json in place and return one line per change:
    rotary_base/rotary_scaling from the HF config (ModelOpt drops them with transformers 5),
    qwen_type/attn_bias for Qwen (ModelOpt's fallback config omits them), and dtype and mapping as
    `requested` ({"dtype": ..., "tp": ..., "pp": ...}; "tp_size"/"pp_size" are accepted too)."""
    folder = Path(folder)
    path = folder / "config.json"
    cfg = read_json_object(path)
    layout = hf_layout(hf_config, "HF config.json")
    changes: list[str] = []

    def put(key: str, value: Any, where: Optional[dict] = None, label: Optional[str] = None) -> None:
        target = cfg if where is None else where
        old = target.get(key, _MISSING)
        if old is _MISSING or old != value:
            target[key] = value
            changes.append(f"{label or key}: {'missing' if old is _MISSING else repr(old)} -> {value!r}")

    put("rotary_base", layout.rotary_base)
    if layout.rotary_scaling:
        if norm_rope_scaling(cfg.get("rotary_scaling")) != norm_rope_scaling(layout.rotary_scaling):
            put("rotary_scaling", layout.rotary_scaling)
    elif "rotary_scaling" in cfg:
        changes.append(f"rotary_scaling: {cfg.pop('rotary_scaling')!r} -> removed (the HF config has no rope scaling)")
    if layout.decoder == "qwen":
        put("qwen_type", layout.model_type)
        put("attn_bias", layout.qkv_bias)

    if requested.get("dtype") not in (None, "auto"):
        dtype = DTYPES.get(str(requested["dtype"]))
        if dtype is None:
            raise InvalidInput(f"requested dtype {requested['dtype']!r}: expected float16, bfloat16 or float32")
        put("dtype", dtype)
        put("logits_dtype", "float16" if dtype == "bfloat16" else dtype)  # ModelOpt's rule
    tp = requested.get("tp", requested.get("tp_size"))
    pp = requested.get("pp", requested.get("pp_size"))
    if tp is not None or pp is not None:
        mapping = cfg.setdefault("mapping", {})
        tp = int(tp if tp is not None else mapping.get("tp_size", 1))
        pp = int(pp if pp is not None else mapping.get("pp_size", 1))
        put("world_size", tp * pp, mapping, "mapping.world_size")
        put("tp_size", tp, mapping, "mapping.tp_size")
        put("pp_size", pp, mapping, "mapping.pp_size")
        if "moe_tp_size" in mapping:
            put("moe_tp_size", tp, mapping, "mapping.moe_tp_size")
        if "rank" in cfg:
            put("rank", tp * pp - 1)

    if changes:
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(cfg, indent=4) + "\n", encoding="utf-8")
        os.replace(partial, path)
    return changes
