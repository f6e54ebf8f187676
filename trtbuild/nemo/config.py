"""Read NeMo 1 model_config.yaml / NeMo 2 context/model.yaml into one config; write HF config.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from trtbuild.errors import InvalidInput

# NeMo 1 `activation` values (nemo.md section 1: activation_to_func) -> the HF act of the gated half.
_NEMO1_GLU_ACT = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}
# NeMo 2 `activation_func: {_target_: ...}` -> HF hidden_act.
_NEMO2_ACT = {
    "torch.nn.functional.silu": "silu",
    "torch.nn.functional.gelu": "gelu",
    "torch.nn.functional.relu": "relu",
}
_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


@dataclass
class NemoConfig:
    """The settings a Llama-layout export needs, normalized over NeMo 1 and NeMo 2 spellings."""

    source: str                      # the YAML file, for messages
    nemo_version: int                # 1 or 2
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    normalization: str               # "rmsnorm" or "layernorm" (layernorm1p -> layernorm + zero-centered)
    zero_centered_gamma: bool        # stored weight is gamma - 1 (nemo.md section 1, layernorm1p)
    layernorm_epsilon: float
    activation: str                  # as written in the YAML, for messages
    hidden_act: Optional[str]        # HF name of the gated half's activation; None if unknown
    gated: bool
    bias: bool                       # add_bias_linear
    qkv_bias: bool
    position_embedding_type: str
    rotary_base: float
    rotary_percent: float
    rotary_interleaved: bool
    seq_len_interpolation_factor: Optional[float]
    llama3_scaling: Optional[dict]   # Llama-3.1 RoPE scaling, HF rope_scaling form
    tied: bool
    vocab_size: Optional[int]        # unpadded, when the config states it (NeMo 2)
    make_vocab_size_divisible_by: int
    max_position_embeddings: Optional[int]
    dtype: str                       # "float32" / "float16" / "bfloat16" from precision
    tp: int
    pp: int
    vp: Optional[int]
    mcore_gpt: bool
    megatron_amp_O2: bool
    tokenizer: dict
    num_moe_experts: int
    init_method_std: float
    attention_dropout: float
    unsupported: list[str] = field(default_factory=list)  # "key: value" settings Llama cannot express


def _load_yaml(path: Path) -> dict:
    try:
        # safe_load: NeMo 2 YAML names classes in `_target_` keys; they are data here, never imported.
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such file") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise InvalidInput(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: expected a YAML mapping at the top level")
    return data


def _int(cfg: dict, key: str, source: str, default: Any = None) -> int:
    value = cfg.get(key, default)
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidInput(f"{source}: {key!r} must be a positive integer, got {value!r}")
    return value


def _target(value: Any) -> str:
    """`{_target_: torch.bfloat16, _call_: false}` -> "torch.bfloat16"; plain strings pass through."""
    if isinstance(value, dict):
        return str(value.get("_target_", ""))
    return "" if value is None else str(value)


def _precision_dtype(precision: Any) -> str:
    # nemo.md section 1: precision 16, 32, bf16, 16-mixed or bf16-mixed (PTL also spells "32-true").
    p = str(precision).lower()
    if p.startswith("bf16"):
        return "bfloat16"
    if p.startswith("16") or p in ("fp16", "half"):
        return "float16"
    return "float32"


def _common_unsupported(cfg: dict) -> list[str]:
    out = []
    experts = cfg.get("num_moe_experts")
    if experts:
        out.append(f"num_moe_experts: {experts} (mixture of experts)")
    for key in ("multi_latent_attention", "qk_layernorm", "apply_residual_connection_post_layernorm"):
        if cfg.get(key):
            out.append(f"{key}: {cfg[key]}")
    if cfg.get("window_size"):
        out.append(f"window_size: {cfg['window_size']} (sliding-window attention)")
    if cfg.get("softmax_scale"):
        out.append(f"softmax_scale: {cfg['softmax_scale']}")
    return out


def read_nemo1(path: Path, label: str | None = None) -> NemoConfig:
    """model_config.yaml: keys at the top level (nemo.md section 1). `label` names it in messages."""
    cfg = _load_yaml(path)
    src = label or path.name
    activation = str(cfg.get("activation", "gelu")).lower()
    base = activation[5:] if activation.startswith("fast-") else activation
    gated = activation.endswith("glu")  # megatron_base_model: gated_linear_unit = activation.endswith('glu')
    norm = str(cfg.get("normalization", "layernorm")).lower()
    zero_centered = bool(cfg.get("layernorm_zero_centered_gamma", False))
    if norm == "layernorm1p":  # LayerNorm storing gamma - 1 (megatron_gpt_model ~l.2222)
        norm, zero_centered = "layernorm", True
    unsupported = _common_unsupported(cfg)
    if cfg.get("transformer_block_type", "pre_ln") != "pre_ln":
        unsupported.append(f"transformer_block_type: {cfg['transformer_block_type']}")
    if cfg.get("normalize_attention_scores", True) is False:
        unsupported.append("normalize_attention_scores: false")
    if cfg.get("headscale"):
        unsupported.append("headscale: true")
    llama3 = None
    if cfg.get("scale_positional_embedding"):
        # mcore apply_rope_scaling defaults: factor 8, low 1, high 4, old context 8192.
        llama3 = {"rope_type": "llama3", "factor": float(cfg.get("scale_factor", 8.0)), "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    return NemoConfig(
        source=src,
        nemo_version=1,
        **_shared_fields(cfg, src),
        normalization=norm,
        zero_centered_gamma=zero_centered,
        activation=activation,
        hidden_act=_NEMO1_GLU_ACT.get(base) if gated else None,
        gated=gated,
        **_bias_and_rotary(cfg, 1),
        llama3_scaling=llama3,
        vocab_size=cfg.get("override_vocab_size"),
        max_position_embeddings=cfg.get("max_position_embeddings") or cfg.get("encoder_seq_length"),
        dtype=_precision_dtype(cfg.get("precision", 32)),
        mcore_gpt=bool(cfg.get("mcore_gpt", False)),
        megatron_amp_O2=bool(cfg.get("megatron_amp_O2", False)),
        tokenizer=dict(cfg.get("tokenizer") or {}),
        unsupported=unsupported + (["megatron_legacy: true (old [3, np, hn] QKV layout)"]
                                   if cfg.get("megatron_legacy") else []),
    )


# How NeMo 1 (model_config.yaml) and NeMo 2 (mcore TransformerConfig) spell the bias flags and the
# rotary fraction (defaults: linear bias on, QKV bias off, rotary on every dimension).
_BIAS_AND_ROTARY_KEYS = {1: ("bias", "qkv_bias", "rotary_percentage"),
                         2: ("add_bias_linear", "add_qkv_bias", "rotary_percent")}


def _bias_and_rotary(cfg: dict, nemo_version: int) -> dict:
    bias, qkv_bias, rotary = _BIAS_AND_ROTARY_KEYS[nemo_version]
    return {"bias": bool(cfg.get(bias, True)), "qkv_bias": bool(cfg.get(qkv_bias, False)),
            "rotary_percent": float(cfg.get(rotary, 1.0))}


def _shared_fields(cfg: dict, src: str) -> dict:
    """The fields NeMo 1 (model_config.yaml) and NeMo 2 (mcore TransformerConfig) spell the same way."""
    heads = _int(cfg, "num_attention_heads", src)
    hidden = _int(cfg, "hidden_size", src)
    return dict(
        num_layers=_int(cfg, "num_layers", src),
        hidden_size=hidden,
        ffn_hidden_size=_int(cfg, "ffn_hidden_size", src),
        num_attention_heads=heads,
        num_query_groups=cfg.get("num_query_groups") or heads,  # null means MHA
        kv_channels=cfg.get("kv_channels") or hidden // heads,
        layernorm_epsilon=float(cfg.get("layernorm_epsilon", 1e-5)),
        position_embedding_type=str(cfg.get("position_embedding_type", "learned_absolute")),
        rotary_base=float(cfg.get("rotary_base", 10000.0)),
        rotary_interleaved=bool(cfg.get("rotary_interleaved", False)),
        seq_len_interpolation_factor=cfg.get("seq_len_interpolation_factor"),
        tied=bool(cfg.get("share_embeddings_and_output_weights", True)),
        make_vocab_size_divisible_by=int(cfg.get("make_vocab_size_divisible_by", 128)),
        tp=int(cfg.get("tensor_model_parallel_size", 1) or 1),
        pp=int(cfg.get("pipeline_model_parallel_size", 1) or 1),
        vp=cfg.get("virtual_pipeline_model_parallel_size"),
        num_moe_experts=int(cfg.get("num_moe_experts") or 0),
        init_method_std=float(cfg.get("init_method_std", 0.02)),
        attention_dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
    )


def read_nemo2(path: Path, label: str | None = None) -> NemoConfig:
    """context/model.yaml: mcore TransformerConfig field names under `config:` (nemo.md section 3)."""
    doc = _load_yaml(path)
    cfg = doc.get("config")
    src = label or "context/model.yaml"
    if not isinstance(cfg, dict):
        raise InvalidInput(f"{src}: no 'config:' mapping (not a NeMo 2 GPT model context)")
    act_target = _target(cfg.get("activation_func", "torch.nn.functional.gelu"))
    gated = bool(cfg.get("gated_linear_unit", False))
    norm = str(cfg.get("normalization", "LayerNorm")).lower()
    params = _target(cfg.get("params_dtype")).replace("torch.", "")
    if params in _DTYPES:
        dtype = _DTYPES[params]
    else:
        dtype = "bfloat16" if cfg.get("bf16") else "float16" if cfg.get("fp16") else "float32"
    llama3 = None
    target = _target(cfg)
    # Llama31Config and its subclasses (3.2) carry scale_factor/low/high/old_context_len fields.
    if target.endswith("Llama31Config") or "old_context_len" in cfg:
        llama3 = {"rope_type": "llama3", "factor": float(cfg.get("scale_factor", 8)),
                  "low_freq_factor": float(cfg.get("low_freq_factor", 1)),
                  "high_freq_factor": float(cfg.get("high_freq_factor", 4)),
                  "original_max_position_embeddings": int(cfg.get("old_context_len", 8192))}
    tok = doc.get("tokenizer")
    return NemoConfig(
        source=src,
        nemo_version=2,
        **_shared_fields(cfg, src),
        normalization=norm,
        zero_centered_gamma=bool(cfg.get("layernorm_zero_centered_gamma", False)),
        activation=act_target,
        hidden_act=_NEMO2_ACT.get(act_target),
        gated=gated,
        **_bias_and_rotary(cfg, 2),
        llama3_scaling=llama3,
        vocab_size=cfg.get("vocab_size"),
        max_position_embeddings=cfg.get("seq_length"),
        dtype=dtype,
        mcore_gpt=True,
        megatron_amp_O2=False,
        tokenizer=dict(tok) if isinstance(tok, dict) else {},
        unsupported=_common_unsupported(cfg),
    )


def hf_config(cfg: NemoConfig, *, vocab_size: int, attention_bias: bool, mlp_bias: bool,
              bos_token_id: Optional[int] = None, eos_token_id: Any = None) -> dict:
    """The LlamaForCausalLM config.json, with the keys and defaults transformers writes."""
    rope_scaling = cfg.llama3_scaling
    if cfg.seq_len_interpolation_factor:
        # mcore divides positions by the factor: HF "linear" scaling does the same.
        rope_scaling = {"rope_type": "linear", "factor": float(cfg.seq_len_interpolation_factor)}
    out: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": attention_bias,
        "attention_dropout": cfg.attention_dropout,
        "head_dim": cfg.kv_channels,
        "hidden_act": cfg.hidden_act,
        "hidden_size": cfg.hidden_size,
        "initializer_range": cfg.init_method_std,
        "intermediate_size": cfg.ffn_hidden_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "mlp_bias": mlp_bias,
        "model_type": "llama",
        "num_attention_heads": cfg.num_attention_heads,
        "num_hidden_layers": cfg.num_layers,
        "num_key_value_heads": cfg.num_query_groups,
        "pretraining_tp": 1,
        "rms_norm_eps": cfg.layernorm_epsilon,
        "rope_scaling": rope_scaling,
        "rope_theta": cfg.rotary_base,
        "tie_word_embeddings": cfg.tied,
        "torch_dtype": cfg.dtype,
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    # Only what the checkpoint tells us: transformers' own defaults (1, 2) would be a guess.
    if bos_token_id is not None:
        out["bos_token_id"] = bos_token_id
    if eos_token_id is not None:
        out["eos_token_id"] = eos_token_id
    if out["max_position_embeddings"] is None:
        del out["max_position_embeddings"]
    return dict(sorted(out.items()))
