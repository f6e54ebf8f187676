"""The quantization formats trtbuild builds: one table, read by the recipe, the plan, the SM rules,
the default gates, the quantizer and the checkpoint verifier.

The shape follows TensorRT-LLM's `QuantConfig` (`quant_algo`, `kv_cache_quant_algo`, `group_size`,
reference/trtllm.md sections 2-3): a recipe's `quant` is one weight/activation format, its
`kv_cache` one KV-cache format. Plain data, no torch or numpy: `plan` imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from trtbuild.facts import gpus


class QuantAlgo:
    """TensorRT-LLM's QuantAlgo names, as config.json's `quantization` spells them (the ones
    trtbuild writes or checks; reference/trtllm.md section 3)."""

    FP8 = "FP8"
    FP8_PER_CHANNEL_PER_TOKEN = "FP8_PER_CHANNEL_PER_TOKEN"
    W8A8_SQ_PER_CHANNEL = "W8A8_SQ_PER_CHANNEL"
    W4A16_AWQ = "W4A16_AWQ"
    W4A8_AWQ = "W4A8_AWQ"
    W8A16 = "W8A16"
    W4A16 = "W4A16"
    NVFP4 = "NVFP4"
    INT8 = "INT8"  # KV cache only (QUANT_ALGO_LIST excludes it)


# The quant_algo values the verifier knows the tensor layout of (None: unquantized).
QUANT_ALGOS = (None, QuantAlgo.FP8, QuantAlgo.FP8_PER_CHANNEL_PER_TOKEN, QuantAlgo.W8A8_SQ_PER_CHANNEL,
               QuantAlgo.W4A16_AWQ, QuantAlgo.W4A8_AWQ, QuantAlgo.W8A16, QuantAlgo.W4A16, QuantAlgo.NVFP4)
# KV_CACHE_QUANT_ALGO_LIST, asserted by QuantMode.from_quant_algo.
KV_CACHE_ALGOS = (None, QuantAlgo.FP8, QuantAlgo.INT8, QuantAlgo.NVFP4)
# Per-group int4 layouts: QuantConfig.group_size and pre_quant_scale apply.
PER_GROUP_ALGOS = (QuantAlgo.W4A16_AWQ, QuantAlgo.W4A8_AWQ)
TRTLLM_DEFAULT_GROUP_SIZE = 128  # QuantConfig.group_size's default (the docs table says 64; the code 128)
# The quant_algos whose group size shapes the weights, so a deploy host compares it: the per-group
# int4 layouts, W4A16 (QuantConfig.group_size) and NVFP4 (its fixed block, NVFP4_BLOCK).
GROUP_SIZED_ALGOS = (*PER_GROUP_ALGOS, QuantAlgo.W4A16, QuantAlgo.NVFP4)
NVFP4_BLOCK = 16  # FP4 values with an FP8 scale per 16 elements (ModelOpt NVFP4_DEFAULT_CFG's block_sizes)
MODELOPT_INT4_BLOCK = 128  # the int4 configs' block_sizes {-1: 128} (INT4_AWQ_CFG, W4A8_AWQ_BETA_CFG, INT4_BLOCKWISE...)

# ModelOpt 0.47's export_tensorrt_llm_checkpoint writes the unquantized tensors in float16 when
# asked for any other dtype than these ("dtype ... not fully compatible with TensorRT-LLM
# optimizations, Default to float16", model_config_export.torch_to_tensorrt_llm_checkpoint).
MODELOPT_TRTLLM_EXPORT_DTYPES = ("float16", "bfloat16")

_SM100_INT = "'INT8/INT4 quantization is not supported on SM>=100.'"  # tensorrt_llm builder.build
# The SMs those RuntimeErrors cover: builder.build checks 100 <= sm < 120 (sm120 is not rejected).
TRTLLM_INT_REJECTED_SMS = (100, 120)


@dataclass(frozen=True)
class SmRule:
    """TensorRT-LLM cannot build the format for an SM in [low, high): `reason` ({sm}: the SM)."""

    low: int
    high: int
    reason: str

    def applies(self, sm_number: int) -> bool:
        return self.low <= sm_number < self.high


# The lower bounds are the hardware's (the tensor cores of trtbuild/data/gpus.json: FP8 from Ada,
# FP4 from Blackwell); TensorRT-LLM leaves those to its kernels. The SM 100-119 rejections are the RuntimeErrors
# of tensorrt_llm/builder.py build() (1.x; the source index serves it without a commit: builder.py@14e801d
# is a 0.x version without these checks) for is_int8/int4_weight_only, has_int8_kv_cache and
# has_act_and_weight_quant (SmoothQuant); both AWQ formats count as INT4 weight-only there
# (quantization/mode.py: use_weight_only(use_int4_weights=True, per_group=True)).
def _needs_tensor_cores(first_sm: str, what: str) -> SmRule:
    """Below `first_sm` (gpus.FP8_TENSOR_CORES_FROM, ...): `what` ends the reason ({sm}: the SM)."""
    return SmRule(0, gpus.sm_number(first_sm), what)


def _needs_fp8(label: str) -> SmRule:
    return _needs_tensor_cores(gpus.FP8_TENSOR_CORES_FROM,
                               f"{label} needs FP8 tensor cores ({gpus.FP8_TENSOR_CORES_FROM} or newer); {{sm}} has none")


def _rejected_on_blackwell(label: str, message: str = _SM100_INT) -> SmRule:
    return SmRule(*TRTLLM_INT_REJECTED_SMS, f"{label} is rejected on {{sm}} by TensorRT-LLM: {message}")


@dataclass(frozen=True)
class QuantFormat:
    """One `variants.X.quant` value."""

    name: str  # the recipe's spelling
    label: str  # for people
    family: str  # default gates: "8bit" or "4bit" (validate/gates.py)
    modelopt_config: str  # attribute of modelopt.torch.quantization
    quant_algo: str  # what ModelOpt 0.47's exports write (QuantConfig.quant_algo, hf_quant_config.json)
    grouped: bool = False  # the weight quantizer is per group of `group_size` input channels
    default_group_size: Optional[int] = None
    awq: bool = False  # calibrated by awq_lite (its statistics depend on the batch size)
    block: Optional[int] = None  # fixed block along the input dimension (NVFP4: 16)
    cuda_only: Optional[str] = None  # why ModelOpt cannot calibrate it on a CPU
    sm_rules: tuple[SmRule, ...] = ()
    # TensorRT-LLM 1.2 quantizes the weights itself at load: its checkpoint holds them as floats with
    # `quant_algo: trtllm_loadtime` (they need no calibration), None: the checkpoint holds them quantized
    trtllm_loadtime: Optional[str] = None


@dataclass(frozen=True)
class KvCacheFormat:
    """One `variants.X.kv_cache` value."""

    name: str
    label: str  # "an FP8 KV cache"
    family: str  # default gates of a variant with only a quantized KV cache
    modelopt_config: Optional[str]  # None: built by trtbuild (ModelOpt 0.47 has no INT8_KV_CFG)
    quant_algo: str  # QuantConfig.kv_cache_quant_algo
    num_bits: object  # the k/v BMM quantizers' num_bits: (exponent, mantissa) bits of a float, or int bits
    hf_export: bool  # whether ModelOpt 0.47's export_hf_checkpoint supports it
    block: Optional[int] = None
    cuda_only: Optional[str] = None
    sm_rules: tuple[SmRule, ...] = ()


# tensor_quant._dynamic_block_quantize_impl asserts amax.is_cuda during calibration.
_DYNAMIC_BLOCK_CUDA_ONLY = ("NVFP4 uses dynamic block quantization (FP4 values with an FP8 scale per 16 elements), "
                            "which ModelOpt 0.47 implements only as a CUDA kernel (it asserts 'amax must be a CUDA "
                            "tensor for dynamic block quantization' during calibration)")

# TensorRT-LLM 1.2 reads W8A16 (and W4A16) weights only as floats and quantizes them itself when it
# loads the checkpoint (modeling_utils.preprocess_perlayer_weights -> convert_utils.weight_only_quantize_dict
# -> the symmetric_quantize_last_axis_of_batched_matrix op, per output channel, into the layout of the GPU
# trtllm-build runs on; trtbuild/checkpoint/trtllm_loadtime.py emulates it, with file and commit). So an
# int8_wo engine is built from a float checkpoint that says `quant_algo: W8A16`: no ModelOpt calibration,
# and the int8 values are TensorRT-LLM's, not ModelOpt's (scale max/128, not max/127).
# A quantized KV cache needs ModelOpt's calibrated KV scales in the same checkpoint, which this path
# has no stage for yet.
_LOADTIME_WITH_KV = ("{label} engines are built from a float checkpoint that TensorRT-LLM quantizes at load "
                     "(quant_algo {algo}); trtbuild has no stage yet that adds ModelOpt's calibrated KV-cache scales "
                     "to it: build {label} without kv_cache, or use another format with {kv}")

FORMATS: dict[str, QuantFormat] = {f.name: f for f in (
    QuantFormat("fp8", "FP8", "8bit", "FP8_DEFAULT_CFG", QuantAlgo.FP8,
                sm_rules=(_needs_fp8("FP8"),)),
    QuantFormat("int8_sq", "INT8 SmoothQuant", "8bit", "INT8_SMOOTHQUANT_CFG", QuantAlgo.W8A8_SQ_PER_CHANNEL,
                sm_rules=(_rejected_on_blackwell("SmoothQuant", "'SmoothQuant is not supported on SM>=100.'"),)),
    QuantFormat("int4_awq", "INT4 AWQ (W4A16)", "4bit", "INT4_AWQ_CFG", QuantAlgo.W4A16_AWQ,
                grouped=True, default_group_size=MODELOPT_INT4_BLOCK, awq=True,
                sm_rules=(_rejected_on_blackwell("INT4 AWQ (W4A16)"),)),
    QuantFormat("w4a8_awq", "W4A8 AWQ", "4bit", "W4A8_AWQ_BETA_CFG", QuantAlgo.W4A8_AWQ,
                grouped=True, default_group_size=MODELOPT_INT4_BLOCK, awq=True,
                sm_rules=(_needs_fp8("W4A8 AWQ"), _rejected_on_blackwell("W4A8 AWQ"))),
    QuantFormat("int8_wo", "INT8 weight-only", "8bit", "INT8_WEIGHT_ONLY_CFG", QuantAlgo.W8A16,
                sm_rules=(_rejected_on_blackwell("INT8 weight-only"),), trtllm_loadtime=QuantAlgo.W8A16),
    # Per-group INT4 weights, max calibration, no activation quantization (INT4_AWQ_CFG's
    # quantizers without the AWQ search), exported as W4A16_AWQ with a pre_quant_scale of ones.
    QuantFormat("int4_wo", "INT4 weight-only", "4bit", "INT4_BLOCKWISE_WEIGHT_ONLY_CFG", QuantAlgo.W4A16_AWQ,
                grouped=True, default_group_size=MODELOPT_INT4_BLOCK,
                sm_rules=(_rejected_on_blackwell("INT4 weight-only"),)),
    QuantFormat("nvfp4", "NVFP4", "4bit", "NVFP4_DEFAULT_CFG", QuantAlgo.NVFP4, block=NVFP4_BLOCK,
                cuda_only=_DYNAMIC_BLOCK_CUDA_ONLY,
                sm_rules=(_needs_tensor_cores(gpus.FP4_TENSOR_CORES_FROM, f"NVFP4 needs FP4 tensor cores "
                                                                 f"({gpus.FP4_TENSOR_CORES_FROM} or newer); {{sm}} has none"),)),
)}

KV_FORMATS: dict[str, KvCacheFormat] = {f.name: f for f in (
    KvCacheFormat("fp8", "an FP8 KV cache", "8bit", "FP8_KV_CFG", QuantAlgo.FP8, (4, 3), hf_export=True,
                  sm_rules=(_needs_tensor_cores(gpus.FP8_TENSOR_CORES_FROM, f"an FP8 KV cache needs "
                                                                f"{gpus.FP8_TENSOR_CORES_FROM} or newer; {{sm}} has no FP8 support"),)),
    KvCacheFormat("int8", "an INT8 KV cache", "8bit", None, QuantAlgo.INT8, 8, hf_export=False,
                  sm_rules=(_rejected_on_blackwell("an INT8 KV cache"),)),
    KvCacheFormat("nvfp4", "an NVFP4 KV cache", "4bit", "NVFP4_KV_CFG", QuantAlgo.NVFP4, (2, 1), hf_export=True,
                  block=NVFP4_BLOCK,
                  cuda_only=_DYNAMIC_BLOCK_CUDA_ONLY,
                  sm_rules=(_needs_tensor_cores(gpus.FP4_TENSOR_CORES_FROM, f"an NVFP4 KV cache needs "
                                                                f"{gpus.FP4_TENSOR_CORES_FROM} or newer; {{sm}} has no FP4 support"),)),
)}

QUANT_NAMES = tuple(FORMATS)
KV_CACHE_NAMES = tuple(KV_FORMATS)
GROUPED = tuple(name for name, f in FORMATS.items() if f.grouped)


def quant_unsupported_reason(quant: Optional[str], kv_cache: Optional[str], sm: str) -> Optional[str]:
    """Why TensorRT-LLM cannot build `quant` / `kv_cache` for `sm`, or None if it can: the first SM
    rule of the weight format, then of the KV-cache format, that `sm` breaks (sources above and in
    reference/trtllm.md section 3)."""
    rules = (FORMATS[quant].sm_rules if quant else ()) + (KV_FORMATS[kv_cache].sm_rules if kv_cache else ())
    return next((rule.reason.format(sm=sm) for rule in rules if rule.applies(gpus.sm_number(sm))), None)


def trtllm_loadtime_algo(quant: Optional[str]) -> Optional[str]:
    """The quant_algo of a float TensorRT-LLM checkpoint that TensorRT-LLM quantizes at load, when
    that is how the format's engines are built (None: the checkpoint holds quantized weights)."""
    return FORMATS[quant].trtllm_loadtime if quant else None


def trtllm_checkpoint_calibrated(quant: Optional[str], kv_cache: Optional[str]) -> bool:
    """Whether the variant's TensorRT-LLM checkpoint comes from a ModelOpt-calibrated model (else the
    streaming converter writes it from the source's float weights)."""
    return kv_cache is not None or (quant is not None and trtllm_loadtime_algo(quant) is None)


def trtllm_checkpoint_problem(quant: Optional[str], kv_cache: Optional[str]) -> Optional[str]:
    """Why no TensorRT-LLM checkpoint of the variant can be written (None: one can)."""
    algo = trtllm_loadtime_algo(quant)
    if algo is not None and kv_cache is not None:
        return _LOADTIME_WITH_KV.format(label=FORMATS[quant].label, algo=algo, kv=KV_FORMATS[kv_cache].label)
    return None


def trtllm_export_dtype_problem(quant: Optional[str], kv_cache: Optional[str], dtype: str) -> Optional[str]:
    """Why ModelOpt's TensorRT-LLM export cannot write a checkpoint of this variant in `dtype`."""
    if not trtllm_checkpoint_calibrated(quant, kv_cache) or dtype in MODELOPT_TRTLLM_EXPORT_DTYPES:
        return None  # trtbuild's converter writes any dtype
    what = FORMATS[quant].label if quant else KV_FORMATS[kv_cache].label
    return (f"ModelOpt's TensorRT-LLM export writes unquantized tensors in float16 or bfloat16 only; "
            f"dtype {dtype} is not supported with {what}: use bfloat16 or float16")


# ---- GGUF: llama.cpp's own quantization types (the gguf backend) ---------------------------------
# Read from llama.cpp as vendored in llama-cpp-python 0.3.36 (its sdist on PyPI,
# llama_cpp_python-0.3.36.tar.gz: vendor/llama.cpp/, which is ggml-org/llama.cpp at commit
# 0c1e57098bba43ac29e6e3b677cdceebdd22334f, its CHANGELOG says), the quantizer trtbuild runs:
# - include/llama.h `enum llama_ftype`: the file type each name asks llama_model_quantize for;
# - tools/quantize/quantize.cpp QUANT_OPTIONS: the names `llama-quantize` takes (Q8_0, Q4_K_M, ...);
# - ggml/src/ggml-common.h: QK_K 256 (the K-quants' super-block), 32 for Q8_0/Q5_0, and the block
#   sizes in bytes (the static_asserts: block_q8_0 34, block_q5_0 22, block_q4_0 18, block_q4_K 144, block_q6_K 210);
# - src/llama-quant.cpp tensor_type_fallback: a tensor whose rows (ne[0]) a K-quant's 256 does not
#   divide is stored in a 32-block type instead (q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0);
# - src/llama-quant.cpp llama_tensor_get_type_impl: the output head (the embedding, when tied) is
#   q8_0 when the block does not divide its rows (or the type is Q8_0), else q6_K; Q4_K_M and Q5_K_M
#   store attn_v and ffn_down in q6_K in the layers `use_more_bits` picks (the first and last eighth,
#   and every third between).
LLAMA_CPP_SOURCE = "ggml-org/llama.cpp@0c1e57098 (llama-cpp-python 0.3.36's vendor/llama.cpp)"
K_QUANT_BLOCK = 256


@dataclass(frozen=True)
class GgmlType:
    """One ggml tensor type: `block` weights stored in `block_bytes` bytes."""

    name: str
    block: int
    block_bytes: int
    fallback: Optional[str] = None  # tensor_type_fallback's type when `block` does not divide the rows

    @property
    def bytes_per_weight(self) -> float:
        return self.block_bytes / self.block


GGML_TYPES: dict[str, GgmlType] = {t.name: t for t in (
    GgmlType("f32", 1, 4), GgmlType("f16", 1, 2), GgmlType("bf16", 1, 2),
    GgmlType("q8_0", 32, 34), GgmlType("q5_0", 32, 22), GgmlType("q4_0", 32, 18), GgmlType("q5_1", 32, 24),
    GgmlType("q4_K", K_QUANT_BLOCK, 144, fallback="q5_0"), GgmlType("q5_K", K_QUANT_BLOCK, 176, fallback="q5_1"),
    GgmlType("q6_K", K_QUANT_BLOCK, 210, fallback="q8_0"),
)}


@dataclass(frozen=True)
class GgufType:
    """One `variants.X.gguf` value: a llama.cpp file type (llama-quantize's name for it)."""

    name: str  # llama-quantize's spelling: Q8_0, Q4_K_M
    ftype: int  # enum llama_ftype: what llama_model_quantize is asked for
    family: str  # default gates (validate/gates.py): none, 8bit, 4bit
    weights: str  # the ggml type of most 2-D weights (GGML_TYPES)
    label: str
    # the K-quant mixes' type for attn_v and ffn_down in the layers use_more_bits picks (None: none)
    more_bits: Optional[str] = None


GGUF_TYPES: dict[str, GgufType] = {t.name: t for t in (
    GgufType("Q8_0", 7, "8bit", "q8_0", "8-bit round-to-nearest blocks of 32"),
    GgufType("Q6_K", 18, "8bit", "q6_K", "6-bit K-quant"),
    GgufType("Q5_K_M", 17, "4bit", "q5_K", "5-bit K-quant, medium", more_bits="q6_K"),
    GgufType("Q4_K_M", 15, "4bit", "q4_K", "4-bit K-quant, medium (some tensors in 6 bits)", more_bits="q6_K"),
    GgufType("Q4_0", 2, "4bit", "q4_0", "4-bit round-to-nearest blocks of 32"),
)}
GGUF_TYPE_NAMES = tuple(GGUF_TYPES)


def use_more_bits(layer: int, layers: int) -> bool:
    """llama-quant.cpp's use_more_bits: the layers whose attn_v and ffn_down a K mix keeps in more bits."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def gguf_weight_type(gguf_type: str, rows: int, more_bits: bool = False) -> GgmlType:
    """The ggml type llama.cpp's quantizer stores a 2-D weight of `rows` input features in:
    the type's own (its `more_bits` one where asked), or tensor_type_fallback's when its block does
    not divide the rows."""
    fmt = GGUF_TYPES[gguf_type]
    main = GGML_TYPES[fmt.more_bits if more_bits and fmt.more_bits else fmt.weights]
    if rows % main.block and main.fallback:
        return GGML_TYPES[main.fallback]
    return main


def gguf_output_type(gguf_type: str, rows: int) -> GgmlType:
    """The ggml type llama.cpp's quantizer stores the output head (a tied embedding) in."""
    main = GGML_TYPES[GGUF_TYPES[gguf_type].weights]
    return GGML_TYPES["q8_0" if rows % main.block or main.name == "q8_0" else "q6_K"]
