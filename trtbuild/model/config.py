"""A model's shape read from its Hugging Face config.json alone (no weights): what planning needs."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from trtbuild.errors import InvalidInput

# Families whose MLP is gated (gate_proj * act(up_proj)): three matrices per layer, not two.
_GATED_MODEL_TYPES = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3_text", "phi3", "internlm2", "granite", "granitemoe", "exaone", "deepseek", "cohere",
    "baichuan", "chatglm", "dbrx", "arctic", "olmo", "olmo2", "smollm3",
}
_GATED_ACTIVATIONS = {"silu", "swiglu", "geglu", "swish"}
_ATTENTION_BIAS_MODEL_TYPES = {"qwen2", "qwen2_moe", "qwen"}
_TORCH_DTYPE = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "half": "float16", "float": "float32"}


@dataclass(frozen=True)
class ModelSpec:
    """The numbers every rule and estimate uses, normalized across config dialects."""

    architecture: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: Optional[int]
    rope_scaling: Optional[dict]
    gated_mlp: bool
    attention_bias: bool
    tied_embeddings: bool
    num_experts: int  # 0 for dense models
    experts_per_token: int
    dtype: Optional[str]
    source: str  # the config file it came from, for messages

    @property
    def max_seq_len(self) -> Optional[int]:
        """The longest sequence the positions allow, as trtllm-build computes its max_seq_len default:
        max_position_embeddings x the rope factor, except su/longrope/llama3 whose positions already
        count it (reference/trtllm.md section 1, builder._init_max_seq_len)."""
        if self.max_position_embeddings is None:
            return None
        factor = 1.0
        if self.rope_scaling:
            kind = self.rope_scaling.get("type", self.rope_scaling.get("rope_type"))
            if kind not in ("su", "longrope", "llama3", "default", None):
                factor = float(self.rope_scaling.get("factor", 1.0))
        return int(self.max_position_embeddings * factor)


def _first(config: dict, *names: str) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return None


def _rope_scaling(config: dict) -> Optional[dict]:
    # transformers 5.x moved rope_theta/rope_scaling into rope_parameters (reference/modelopt.md section 6).
    scaling = config.get("rope_scaling")
    if scaling is None and isinstance(config.get("rope_parameters"), dict):
        params = config["rope_parameters"]
        if params.get("rope_type", "default") != "default":
            scaling = params
    return scaling if isinstance(scaling, dict) else None


def parse_config(config: dict, source: str = "config.json") -> ModelSpec:
    """Read a Hugging Face config.json dict; InvalidInput names the file and the missing key."""
    if "text_config" in config and "hidden_size" not in config:
        text = dict(config["text_config"])
        if not text.get("architectures"):
            text["architectures"] = config.get("architectures")
        config = text

    def need(*names: str) -> Any:
        value = _first(config, *names)
        if value is None:
            raise InvalidInput(f"{source}: missing {names[0]!r} (needed to plan; is this a Hugging Face config.json?)")
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InvalidInput(f"{source}: {names[0]!r} must be a positive integer, got {value!r}")
        return value

    architectures = config.get("architectures") or []
    if not architectures or not isinstance(architectures, list):
        raise InvalidInput(f"{source}: missing 'architectures' (needed to pick the TensorRT-LLM model class)")
    model_type = str(config.get("model_type", ""))
    hidden = need("hidden_size", "n_embd", "d_model")
    heads = need("num_attention_heads", "n_head")
    kv_heads = _first(config, "num_key_value_heads", "multi_query_group_num")
    if kv_heads is None:
        kv_heads = 1 if config.get("multi_query") else heads
    head_dim = _first(config, "head_dim", "kv_channels") or hidden // heads
    intermediate = _first(config, "intermediate_size", "n_inner", "ffn_hidden_size") or 4 * hidden
    act = str(_first(config, "hidden_act", "activation_function") or "")
    dtype = _first(config, "torch_dtype", "dtype")
    return ModelSpec(
        architecture=str(architectures[0]),
        model_type=model_type,
        hidden_size=hidden,
        num_layers=need("num_hidden_layers", "n_layer", "num_layers"),
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=int(intermediate),
        vocab_size=need("vocab_size", "padded_vocab_size"),
        max_position_embeddings=_first(config, "max_position_embeddings", "n_positions", "seq_length"),
        rope_scaling=_rope_scaling(config),
        gated_mlp=model_type in _GATED_MODEL_TYPES or act in _GATED_ACTIVATIONS,
        attention_bias=bool(config.get("attention_bias", model_type in _ATTENTION_BIAS_MODEL_TYPES)),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        num_experts=int(_first(config, "num_local_experts", "num_experts", "moe_num_experts") or 0),
        experts_per_token=int(_first(config, "num_experts_per_tok", "moe_top_k") or 0),
        dtype=_TORCH_DTYPE.get(str(dtype)) if dtype else None,
        source=source,
    )


def read_json_object(path: Path) -> dict:
    """A JSON file that must hold an object (config.json and the like); one-line errors."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such file") from None
    except OSError as exc:  # a folder, no permission, ...
        raise InvalidInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parse_json_object(data, str(path))


def parse_json_object(data: bytes, where: str) -> dict:
    """Bytes that must hold a JSON object (a file's, an S3 object's); `where` names them in errors."""
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{where}: not JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise InvalidInput(f"{where}: expected a JSON object")
    return parsed


def load_config(path: Path) -> ModelSpec:
    return parse_config(read_json_object(path), str(path))


def padded_vocab(vocab_size: int, tp: int) -> int:
    """TensorRT-LLM pads lm_head rows to a multiple of tp (pad_vocab_size, reference section 2)."""
    return int(math.ceil(vocab_size / tp) * tp)
