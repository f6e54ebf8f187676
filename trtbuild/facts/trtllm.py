"""Facts about TensorRT-LLM 1.2.x that planning needs: trtllm-build's flags, defaults and MODEL_MAP.

The flag table is trtbuild/data/trtllm-build-flags.json, a copy of
shared/reference/trtllm-build-flags.json (read from tensorrt_llm/commands/build.py@65f1d15 and
plugin/plugin.py@c20322f); re-check it with `trtllm-build --help` in the pinned container.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from packaging.version import InvalidVersion, Version

ENGINE_TOOLCHAIN_SERIES = "1.2"  # the last TensorRT-LLM line with the TensorRT engine backend
DEFAULT_TENSORRT_LLM = "1.2.1"

# tensorrt_llm/models/__init__.py@02267d3 MODEL_MAP keys (reference/trtllm.md section 8; LLaMAForCausalLM
# is the class the Llama family maps to, not a key):
# build_model asserts "Unsupported model architecture" for anything else.
ENGINE_ARCHITECTURES = frozenset(
    """
    GPT2LMHeadModel GPT2LMHeadCustomModel GPTBigCodeForCausalLM Starcoder2ForCausalLM FuyuForCausalLM
    Kosmos2ForConditionalGeneration JAISLMHeadModel GPTForCausalLM NemotronForCausalLM
    LlamaForCausalLM LlavaLlamaModel ExaoneForCausalLM MistralForCausalLM MixtralForCausalLM
    ArcticForCausalLM InternLMForCausalLM InternLM2ForCausalLM InternLMXComposer2ForCausalLM
    GraniteForCausalLM GraniteMoeForCausalLM SkyworkForCausalLM
    OPTForCausalLM BloomForCausalLM RWForCausalLM FalconForCausalLM PhiForCausalLM Phi3ForCausalLM
    Phi3VForCausalLM Phi3SmallForCausalLM PhiMoEForCausalLM Phi4MMForCausalLM MambaForCausalLM
    GPTNeoXForCausalLM GPTJForCausalLM MptForCausalLM MPTForCausalLM GLMModel ChatGLMModel
    ChatGLMForCausalLM ChatGLMForConditionalGeneration LlavaNextForConditionalGeneration
    Grok1ModelForCausalLM MedusaForCausalLM MedusaLlamaForCausalLM ReDrafterForLLaMALM
    ReDrafterForQWenLM BaichuanForCausalLM BaiChuanForCausalLM GemmaForCausalLM Gemma2ForCausalLM
    Gemma3ForCausalLM QWenLMHeadModel QWenForCausalLM Qwen2ForCausalLM Qwen2MoeForCausalLM
    Qwen2ForSequenceClassification Qwen2VLForConditionalGeneration Qwen2VLModel Qwen3ForCausalLM
    WhisperEncoder EncoderModel DecoderModel DbrxForCausalLM RecurrentGemmaForCausalLM
    CogVLMForCausalLM DiT SD3Transformer2DModel STDiT3 DeepseekForCausalLM DeepseekV2ForCausalLM
    DeciLMForCausalLM EagleForCausalLM CohereForCausalLM MLLaMAModel MllamaForConditionalGeneration
    BertForQuestionAnswering BertForSequenceClassification BertModel RobertaModel
    RobertaForQuestionAnswering RobertaForSequenceClassification VoRAForCausalLM
    """.split()
)

# Flags trtbuild derives from the recipe or its own layout; a recipe may not set them in
# engine.flags, because the stage must control them (and the cache key must see them).
MANAGED_FLAGS: dict[str, str] = {
    "checkpoint_dir": "trtbuild passes the checkpoint stage's output",
    "model_config": "trtbuild passes the checkpoint stage's output",
    "build_config": "it would make trtllm-build ignore the recipe's limits",
    "output_dir": "trtbuild chooses the engine folder",
    "max_batch_size": "set it in limits.max_batch_size",
    "max_input_len": "set it in limits.max_input_len",
    "max_seq_len": "set it in limits.max_seq_len",
    "max_num_tokens": "set it in limits.max_num_tokens",
    "max_beam_width": "set it in limits.max_beam_width",
    "input_timing_cache": "trtbuild manages the timing cache as an artifact",
    "output_timing_cache": "trtbuild manages the timing cache as an artifact",
    "workers": "trtbuild sets it from the target's GPU count",
    "model_cls_file": "it loads Python code from a path; recipes never run code",
    "model_cls_name": "it loads Python code from a path; recipes never run code",
    "lora_dir": "LoRA adapters are not inputs trtbuild can hash yet",
    "visualize_network": "it is a debugging output, not an engine characteristic",
    "dry_run": "a dry run builds no engine",
    "paged_kv_cache": "deprecated by TensorRT-LLM; use kv_cache_type",
    # build_model asserts "StreamingLLM is no longer supported" (reference/trtllm.md section 1).
    "streamingllm": "TensorRT-LLM 1.x rejects StreamingLLM",
}


@dataclass(frozen=True)
class Flag:
    name: str  # without the leading dashes
    kind: str  # int | str | bool | list
    default: Any
    choices: tuple[str, ...]
    aliases: tuple[str, ...]
    help: str


def _kind(raw_type: str) -> str:
    if raw_type == "store_true":
        return "bool"
    if raw_type == "int":
        return "int"
    if "nargs" in raw_type:
        return "list"
    return "str"


@lru_cache(maxsize=1)
def flag_table() -> dict[str, Flag]:
    """Every trtllm-build flag of the pinned line, by name and by alias (no leading dashes)."""
    raw = json.loads(resources.files("trtbuild").joinpath("data/trtllm-build-flags.json").read_text())
    table: dict[str, Flag] = {}
    for entry in raw["flags"]:
        choices = tuple(c for c in entry.get("choices") or () if not c.startswith("<"))
        flag = Flag(
            name=entry["flag"].lstrip("-"),
            kind=_kind(entry["type"]),
            default=entry["default"],
            choices=choices,
            aliases=tuple(a.lstrip("-") for a in entry.get("aliases") or ()),
            help=entry.get("help", ""),
        )
        table[flag.name] = flag
        for alias in flag.aliases:
            table[alias] = flag
    return table


def build_default(name: str) -> Any:
    """trtllm-build's default for a limit flag (BuildConfig class attributes, reference section 5)."""
    return flag_table()[name].default


def check_flag(name: str, value: Any) -> str | None:
    """Why `name: value` is not a valid engine.flags entry, or None when it is."""
    table = flag_table()
    key = name[2:] if name.startswith("--") else name
    if key not in table:
        import difflib

        close = difflib.get_close_matches(key, [k for k in table if k not in MANAGED_FLAGS], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown trtllm-build flag {name!r} for tensorrt_llm {ENGINE_TOOLCHAIN_SERIES}.x{hint}"
    flag = table[key]
    if flag.name in MANAGED_FLAGS:
        return f"{name!r} cannot be set in a recipe: {MANAGED_FLAGS[flag.name]}"
    if flag.kind == "bool":
        if not isinstance(value, bool):
            return f"{value!r} is not true or false ({name} is a switch)"
    elif flag.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{value!r} is not an integer"
        if value < 0:
            return f"{value!r} must not be negative"
    elif flag.kind == "list":
        if not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
            return f"{value!r} is not a non-empty list of strings"
        if flag.choices and (bad := [v for v in value if v not in flag.choices]):
            return f"{bad[0]!r} is not one of {', '.join(flag.choices)}"
    elif flag.choices:
        if not isinstance(value, str) or value not in flag.choices:
            return f"{value!r} is not one of {', '.join(flag.choices)}"
    elif not isinstance(value, str):
        return f"{value!r} is not a string"
    return None


def canonical_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """Flags keyed by canonical name (aliases and leading dashes removed), for keys and commands."""
    table = flag_table()
    return {table[k.lstrip("-")].name: v for k, v in flags.items()}


def check_engine_toolchain(version: str) -> str | None:
    """Why `version` of tensorrt_llm cannot build engines, or None if it can."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return f"{version!r} is not a version number"
    if parsed.release[:2] != (1, 2):
        if parsed >= Version("1.3.0.dev0"):
            return (f"tensorrt_llm {version} has no TensorRT engine backend (removed after the 1.2 line); "
                    "pin 1.2.x for engines or build the hf-checkpoint backend")
        return f"trtbuild builds engines with tensorrt_llm 1.2.x only; {version} has other flags and formats"
    return None


# PluginConfig.validate rejects these plugins on SM 100 (NotImplementedError; plugin/plugin.py@c20322f,
# reference/trtllm.md section 3).
SM100_REJECTED_PLUGINS = (
    "gemm_swiglu_plugin",
    "fp8_rowwise_gemm_plugin",
    "low_latency_gemm_plugin",
    "low_latency_gemm_swiglu_plugin",
    "bert_context_fmha_fp32_acc",
)


def plugin_unsupported_reason(flags: dict[str, object], sm: str) -> str | None:
    """Why PluginConfig.validate refuses one of `flags` (canonical names) on `sm`, or None."""
    if sm != "sm100":
        return None
    for name in SM100_REJECTED_PLUGINS:
        value = flags.get(name)
        if value not in (None, "disable"):
            return f"engine.flags.{name}={value} is not supported on SM 100 (PluginConfig.validate)"
    return None
