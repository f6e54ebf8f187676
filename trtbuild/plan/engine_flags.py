"""The trtllm-build flags of one engine: the recipe's `engine.flags` plus the flags derived from the
quantization, the SM and the validation twin, each with where it came from; and the plan-time
check that a recipe flag suits the target's SM and quantization.

Every rule cites reference/trtllm.md (facts read from TensorRT-LLM 1.2's build.py, builder.py and
plugin.py) or the flag's help text in trtbuild/data/trtllm-build-flags.json; the refusals of
trtllm-build itself cite the upstream file and commit (BUILD_PY, PLUGIN_PY, BUILDER_PY below), the
same sources tests/standin_trtllm/bin/trtllm-build transcribes independently (tests/test_standins.py
runs every derived command of a set of recipes through it: plan's ok <=> the stand-in builds). A derived flag only
writes down what trtllm-build would do anyway, or picks the plugin precision it would resolve to,
so that the engine key and `trtbuild explain` say what the engine is; a recipe flag wins over a
derived one unless the rule says it is invalid for the target, which the plan reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from trtbuild.facts import gpus, quantformats, serving
from trtbuild.facts import trtllm
from trtbuild.facts.quantformats import QuantAlgo

REF = "reference/trtllm.md"
# Where trtllm-build's refusals were read (NVIDIA/TensorRT-LLM, 1.x line; the 1.2.x tags could not be
# read, see reference/trtllm.md section 1). builder.py is served by the source index without its commit.
BUILD_PY = "tensorrt_llm/commands/build.py@65f1d15"
PLUGIN_PY = "tensorrt_llm/plugin/plugin.py@c20322f"
BUILDER_PY = "tensorrt_llm/builder.py (1.x, commit not given by the source index)"
SWIGLU_PLUGINS = ("gemm_swiglu_plugin", "low_latency_gemm_swiglu_plugin")

# QuantAlgos whose context attention may run in FP8 (build(): use_fp8_context_fmha is turned off
# for any other quant_algo, and below SM 89: reference section 1 "Overrides", section 3).
FP8_CONTEXT_FMHA_ALGOS = (QuantAlgo.FP8, QuantAlgo.W4A8_AWQ, QuantAlgo.NVFP4)
# QuantAlgos that keep use_fused_mlp (build() forces it off for the others: reference section 1).
FUSED_MLP_ALGOS = (None, QuantAlgo.FP8)
# FP8 GEMM fusions: "FP8 on Hopper only" (gemm_swiglu_plugin's help, trtllm-build-flags.json).
HOPPER_FP8_PLUGINS = ("gemm_swiglu_plugin", "low_latency_gemm_plugin", "low_latency_gemm_swiglu_plugin")
HOPPER = "sm90"
# FP8 GEMMs, FP8 context FMHA and a paged FP8 KV cache need FP8 tensor cores; NVFP4 GEMMs FP4 ones
# (the SMs that have them: trtbuild/data/gpus.json).
FP8_SM, FP4_SM = gpus.FP8_TENSOR_CORES_FROM, gpus.FP4_TENSOR_CORES_FROM


@dataclass(frozen=True)
class EngineFormat:
    """What the flag rules read of a target: its formats, the checkpoint dtype, the SM."""

    quant: Optional[str]  # variants.X.quant (trtbuild's spelling)
    kv_cache: Optional[str]
    dtype: str  # the checkpoint's dtype (plan.dtype)
    sm: str  # "sm90"

    @property
    def quant_algo(self) -> Optional[str]:
        return quantformats.FORMATS[self.quant].quant_algo if self.quant else None

    @property
    def fp8_tensor_cores(self) -> bool:
        return gpus.has_fp8_tensor_cores(self.sm)

    @property
    def fp4_tensor_cores(self) -> bool:
        return gpus.has_fp4_tensor_cores(self.sm)

    def describe(self) -> str:
        return f"{serving.format_label(self.quant, self.kv_cache)} on {self.sm}"


@dataclass(frozen=True)
class FlagValue:
    value: Any
    origin: str  # "recipe: engine.flags.NAME" or "rule: ... (reference ...)"


# ---- derived flags ---------------------------------------------------------------------------

def gemm_plugin(fmt: EngineFormat) -> FlagValue:
    """The cuBLASLt GEMM plugin's precision."""
    algo = fmt.quant_algo
    if algo == QuantAlgo.NVFP4 and fmt.fp4_tensor_cores:
        # help: "NVFP4 checkpoints enable gemm_plugin=nvfp4 automatically unless explicitly 'disable'"
        return FlagValue("nvfp4", "rule: NVFP4 weights use the nvfp4 GEMM plugin, as trtllm-build picks it "
                         "for NVFP4 checkpoints (gemm_plugin help, trtllm-build-flags.json)")
    if algo == QuantAlgo.FP8 and fmt.fp8_tensor_cores:
        # help: the plugin "only affects non-quantized GEMMs (except FP8)"; FP8 needs sm89+ (section 3)
        return FlagValue("fp8", "rule: FP8 weights use the fp8 GEMM plugin, the one plugin precision that "
                         f"runs FP8 GEMMs, on {FP8_SM} or newer ({REF} sections 1 and 3)")
    # Unquantized, weight-only, AWQ and SmoothQuant: the plugin runs the non-quantized GEMMs in the
    # checkpoint dtype, which is what "auto" resolves to (PluginConfig.dtype = checkpoint dtype).
    return FlagValue(fmt.dtype, f"rule: the checkpoint dtype ({fmt.dtype}); 'auto' resolves to it "
                     f"({REF} section 1: plugin flags)")


def use_fp8_context_fmha(fmt: EngineFormat) -> FlagValue:
    if fmt.quant_algo in FP8_CONTEXT_FMHA_ALGOS and fmt.fp8_tensor_cores:
        return FlagValue("enable", f"rule: FP8 context FMHA for {fmt.quant_algo} on {FP8_SM} or newer ({REF} sections 1, 3)")
    return FlagValue("disable", f"rule: trtllm-build keeps FP8 context FMHA only for FP8, W4A8_AWQ or NVFP4 "
                     f"on {FP8_SM} or newer; {fmt.describe()} ({REF} sections 1, 3)")


def use_paged_context_fmha(fmt: EngineFormat) -> Optional[FlagValue]:
    if fmt.kv_cache == "int8":
        return FlagValue("disable", f"rule: builder.build disables paged context FMHA with an INT8 KV cache ({REF} section 3)")
    if fmt.kv_cache == "fp8" and not fmt.fp8_tensor_cores:
        return FlagValue("disable", f"rule: builder.build disables paged context FMHA with an FP8 KV cache below "
                         f"{FP8_SM} ({REF} section 3)")
    return None


def use_fused_mlp(fmt: EngineFormat) -> Optional[FlagValue]:
    if fmt.quant_algo in FUSED_MLP_ALGOS:
        return None  # trtllm-build's default (enable) stands
    return FlagValue("disable", f"rule: build() turns use_fused_mlp off unless quant_algo is None, FP8 or "
                     f"MIXED_PRECISION; {fmt.quant_algo} ({REF} section 1)")


def derived_flags(fmt: EngineFormat) -> dict[str, FlagValue]:
    """The flags the quantization and SM rules give a target."""
    flags = {"gemm_plugin": gemm_plugin(fmt), "use_fp8_context_fmha": use_fp8_context_fmha(fmt)}
    for name, rule in (("use_paged_context_fmha", use_paged_context_fmha), ("use_fused_mlp", use_fused_mlp)):
        found = rule(fmt)
        if found is not None:
            flags[name] = found
    return flags


def engine_flags(recipe_flags: dict[str, Any], fmt: EngineFormat, gather: Optional[str] = None) -> dict[str, FlagValue]:
    """The complete flag set trtbuild passes besides limits and paths, sorted by name: the derived
    flags, overridden by the recipe's (canonical names), and --gather_context_logits where `gather`
    says why the engine needs it. Every value is checked against the pinned flag table here, at
    plan time (the recipe's were checked on load; `recipe_flag_problem` checks them per target)."""
    flags = derived_flags(fmt)
    for name, value in trtllm.canonical_flags(recipe_flags).items():
        flags[name] = FlagValue(value, f"recipe: engine.flags.{name}")
    if gather and flags.get("gather_context_logits", FlagValue(False, "")).value is not True:
        # last: a validated engine must gather, whatever the recipe says
        flags["gather_context_logits"] = FlagValue(True, f"rule: {gather}: TensorRT-LLM returns prompt logits only "
                                                   "from an engine built with it (validate/trtllm_runner.py)")
    for name, flag in flags.items():
        reason = trtllm.check_flag(name, flag.value)
        if reason:  # the recipe's were checked on load: this is a rule of trtbuild's that is wrong
            raise AssertionError(f"trtbuild derived an invalid trtllm-build flag {name}={flag.value!r}: {reason}")
    return dict(sorted(flags.items()))


# ---- recipe flags that do not suit a target ------------------------------------------------------

def recipe_flag_problem(recipe_flags: dict[str, Any], fmt: EngineFormat, architecture: Optional[str] = None,
                        gather: Optional[str] = None) -> Optional[str]:
    """Why one of the recipe's engine.flags cannot build this target (first found), or None.
    The message starts with the YAML path `engine.flags.NAME=VALUE`. `architecture`: the checkpoint's
    (config.json `architecture`); `gather`: why the engine is also built with --gather_context_logits
    (`validate.engines: twin`), None when it is not."""
    flags = trtllm.canonical_flags(recipe_flags)
    algo = fmt.quant_algo

    def at(name: str) -> str:
        return f"engine.flags.{name}={flags[name]}"

    refused = trtllm_build_refusal(flags, fmt, architecture, gather)
    if refused:
        return refused
    gemm = flags.get("gemm_plugin")
    if gemm == "fp8" and not (algo == QuantAlgo.FP8 and fmt.fp8_tensor_cores):
        return f"{at('gemm_plugin')} needs FP8 weights (quant: fp8) on {FP8_SM} or newer; the target has {fmt.describe()}"
    if gemm == "nvfp4" and not (algo == QuantAlgo.NVFP4 and fmt.fp4_tensor_cores):
        return f"{at('gemm_plugin')} needs NVFP4 weights (quant: nvfp4) on {FP4_SM} or newer; the target has {fmt.describe()}"
    for name in HOPPER_FP8_PLUGINS:
        if flags.get(name) == "fp8" and not (algo == QuantAlgo.FP8 and fmt.sm == HOPPER):
            return f"{at(name)} runs FP8 GEMMs on Hopper only (quant: fp8 on {HOPPER}); the target has {fmt.describe()}"
    # BUILDER_PY optimize_model_with_config(): RuntimeError "GemmSwiGLU plugin requires --use_fused_mlp flag".
    # After the Hopper rule: the swiglu plugins' one value is fp8, and use_fused_mlp is derived off only
    # for quantizations other than FP8, so only the recipe's own use_fused_mlp: disable reaches here.
    fused_mlp = flags.get("use_fused_mlp") or getattr(use_fused_mlp(fmt), "value", "enable")
    for name in SWIGLU_PLUGINS:
        if flags.get(name, "disable") != "disable" and fused_mlp != "enable":
            return (f"{at(name)} requires use_fused_mlp, which engine.flags.use_fused_mlp disables "
                    f"({BUILDER_PY} optimize_model_with_config())")
    if flags.get("use_fp8_context_fmha") == "enable" and not (algo in FP8_CONTEXT_FMHA_ALGOS and fmt.fp8_tensor_cores):
        return (f"{at('use_fp8_context_fmha')} needs FP8, W4A8 AWQ or NVFP4 quantization on {FP8_SM} or newer "
                f"(trtllm-build turns it off otherwise); the target has {fmt.describe()}")
    if flags.get("use_paged_context_fmha") == "enable" and use_paged_context_fmha(fmt) is not None:
        return (f"{at('use_paged_context_fmha')} is turned off by trtllm-build with {fmt.describe()} "
                f"({REF} section 3)")
    if flags.get("use_fused_mlp") == "enable" and algo not in FUSED_MLP_ALGOS:
        return (f"{at('use_fused_mlp')} is turned off by trtllm-build unless quant_algo is None, FP8 or "
                f"MIXED_PRECISION; the target has {fmt.describe()}")
    return None


def trtllm_build_refusal(flags: dict[str, Any], fmt: EngineFormat, architecture: Optional[str],
                         gather: Optional[str]) -> Optional[str]:
    """The flag combinations trtllm-build itself refuses (raises on) for this target, each from its
    source; `flags` by canonical name. The SM rules of the quantization formats are in
    quantformats.py (quantformats.quant_unsupported_reason)."""

    def at(name: str) -> str:
        return f"engine.flags.{name}={flags[name]}"

    # PluginConfig.validate: a plugin of its SM-100 list on SM 100 (NotImplementedError) (PLUGIN_PY)
    sm100 = trtllm.plugin_unsupported_reason(flags, fmt.sm)
    if sm100:
        return sm100
    draft = flags.get("max_draft_len", 0)
    if draft > 0:  # BUILD_PY main(): RuntimeError "Gather context logits is not support with draft len > 0"
        for name in ("gather_context_logits", "gather_all_token_logits"):
            if flags.get(name) is True:
                return (f"{at('max_draft_len')} with engine.flags.{name}: trtllm-build refuses context logits with "
                        f"a draft length above 0 ({BUILD_PY} main())")
        if gather:
            return (f"{at('max_draft_len')}: {gather} builds the engine with --gather_context_logits, which "
                    f"trtllm-build refuses with a draft length above 0 ({BUILD_PY} main()); set validate.engines: none")
    if flags.get("multiple_profiles") == "enable" and "opt_num_tokens" in flags:
        # BUILD_PY main(): RuntimeError "multiple_profiles is enabled, while opt_num_tokens is set"
        return (f"{at('opt_num_tokens')} with engine.flags.multiple_profiles=enable: trtllm-build refuses the two "
                f"together ({BUILD_PY} main())")
    if flags.get("pp_reduce_scatter") == "enable" and architecture is not None \
            and architecture != "MixtralForCausalLM":
        # BUILD_PY build_model(): AssertionError "PP reduce scatter is only supported in the mixtral model."
        return (f"{at('pp_reduce_scatter')} is supported for MixtralForCausalLM only; the model is {architecture} "
                f"({BUILD_PY} build_model())")
    if flags.get("speculative_decoding_mode") == "eagle":
        # BUILDER_PY build(): `assert hasattr(model.config, 'num_eagle_layers')` before EAGLE's batch and
        # draft-length limits; trtbuild writes no EAGLE checkpoint (plan.CHECKPOINT_ARCHITECTURES)
        return (f"{at('speculative_decoding_mode')} needs an EAGLE checkpoint (num_eagle_layers in its config), "
                f"which trtbuild does not write ({BUILDER_PY} build())")
    return None
