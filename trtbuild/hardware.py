"""GPU catalogue (product -> SM, memory), quantization x SM rules, and the NVML probe."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

MIB = 1024 * 1024

# SM architectures an engine can target. Engines are not portable across SMs
# (reference/trtllm.md section 4), so the SM is part of every engine target and key.
SM_ARCHES: dict[str, str] = {
    "sm80": "Ampere (A100)",
    "sm86": "Ampere (GA10x)",
    "sm89": "Ada Lovelace",
    "sm90": "Hopper",
    "sm100": "Blackwell (datacenter)",
    "sm120": "Blackwell (GeForce/RTX PRO)",
}


@dataclass(frozen=True)
class GpuProduct:
    name: str
    sm: str
    memory_mib: int  # total memory as nvidia-smi reports it
    aliases: tuple[str, ...] = ()

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


# Memory sizes are the totals nvidia-smi reports for each board (MiB).
CATALOGUE: tuple[GpuProduct, ...] = (
    GpuProduct("A100-80GB", "sm80", 81920, ("A100", "A100-SXM4-80GB", "A100-PCIE-80GB", "A800")),
    GpuProduct("A100-40GB", "sm80", 40960, ("A100-SXM4-40GB", "A100-PCIE-40GB")),
    GpuProduct("A30", "sm80", 24576),
    GpuProduct("A10G", "sm86", 23028),
    GpuProduct("A10", "sm86", 23028),
    GpuProduct("A40", "sm86", 46068),
    GpuProduct("RTXA6000", "sm86", 49140, ("A6000", "RTX-A6000")),
    GpuProduct("RTX3090", "sm86", 24576),
    GpuProduct("L4", "sm89", 23034),
    GpuProduct("L40", "sm89", 46068),
    GpuProduct("L40S", "sm89", 46068),
    GpuProduct("RTX4090", "sm89", 24564),
    GpuProduct("RTX6000ADA", "sm89", 49140, ("RTX-6000-Ada",)),
    GpuProduct("H100", "sm90", 81559, ("H100-SXM", "H100-80GB", "H100-SXM5-80GB", "H800")),
    GpuProduct("H100-PCIE", "sm90", 81559),
    GpuProduct("H100-NVL", "sm90", 95830),
    GpuProduct("H20", "sm90", 97871),
    GpuProduct("H200", "sm90", 143771, ("H200-SXM", "H200-NVL")),
    GpuProduct("GH200", "sm90", 97871),
    GpuProduct("B200", "sm100", 183359),
    GpuProduct("GB200", "sm100", 189471),
    GpuProduct("RTX5090", "sm120", 32607),
    GpuProduct("RTXPRO6000", "sm120", 97887, ("RTX-PRO-6000", "RTX-PRO-6000-Blackwell")),
)

# The product whose memory an estimate uses when a recipe names only the SM.
DEFAULT_PRODUCT: dict[str, str] = {
    "sm80": "A100-80GB",
    "sm86": "A10G",
    "sm89": "L40S",
    "sm90": "H100",
    "sm100": "B200",
    "sm120": "RTX5090",
}


def _canon(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_BY_NAME: dict[str, GpuProduct] = {_canon(name): p for p in CATALOGUE for name in (p.name, *p.aliases)}


def product(name: str) -> GpuProduct:
    return _BY_NAME[_canon(name)]


def known_gpu_names() -> list[str]:
    return list(SM_ARCHES) + [p.name for p in CATALOGUE]


@dataclass(frozen=True)
class GpuChoice:
    """One `gpus:` entry of a recipe, normalized: the SM, and the product whose memory counts."""

    sm: str
    product: GpuProduct
    named_product: bool  # False when the recipe named only the SM


def resolve_gpu(name: str) -> GpuChoice:
    """`sm90`, `SM_90`, `H100`, `h100-sxm` ... -> GpuChoice; ValueError names what is known."""
    canon = _canon(str(name))
    sm_match = re.fullmatch(r"sm(\d+)", canon)
    if sm_match:
        sm = f"sm{sm_match.group(1)}"
        if sm not in SM_ARCHES:
            raise ValueError(f"{name!r} is not a supported architecture; use one of {', '.join(SM_ARCHES)}")
        return GpuChoice(sm, product(DEFAULT_PRODUCT[sm]), named_product=False)
    if canon in _BY_NAME:
        found = _BY_NAME[canon]
        return GpuChoice(found.sm, found, named_product=True)
    raise ValueError(
        f"{name!r} is not a known GPU; use an SM ({', '.join(SM_ARCHES)}) or a product "
        f"({', '.join(p.name for p in CATALOGUE)})"
    )


def sm_number(sm: str) -> int:
    return int(sm[2:])


# Quantization x SM. Sources: reference/trtllm.md section 3 and tensorrt_llm/builder.py@14e801d
# `build()`: on 100 <= SM < 120 it raises for is_int8_weight_only / is_int4_weight_only /
# has_int8_kv_cache ("INT8/INT4 quantization is not supported on SM>=100.") and for
# has_act_and_weight_quant ("SmoothQuant ..."). quantization/mode.py maps both W4A16_AWQ and
# W4A8_AWQ to use_weight_only(use_int4_weights=True, per_group=True), so both AWQ formats count as
# INT4 weight-only there. The lower bounds come from the hardware: FP8 tensor cores exist from Ada
# (sm89) on, FP4 tensor cores from Blackwell (sm100) on; TensorRT-LLM leaves them to its kernels.
FP8_MIN_SM = 89
FP4_MIN_SM = 100
QUANT_LABEL = {
    "fp8": "FP8",
    "int8_sq": "INT8 SmoothQuant",
    "int4_awq": "INT4 AWQ (W4A16)",
    "w4a8_awq": "W4A8 AWQ",
    "int8_wo": "INT8 weight-only",
    "int4_wo": "INT4 weight-only",
    "nvfp4": "NVFP4",
}


def quant_unsupported_reason(quant: str | None, kv_cache: str | None, sm: str) -> str | None:
    """Why TensorRT-LLM cannot build `quant` / `kv_cache` for `sm`, or None if it can."""
    n = sm_number(sm)
    blackwell_dc = 100 <= n < 120  # builder.build's "SM>=100" checks cover SM 100-119
    if quant in ("fp8", "w4a8_awq") and n < FP8_MIN_SM:
        return f"{QUANT_LABEL[quant]} needs FP8 tensor cores (sm89 or newer); {sm} has none"
    if quant == "nvfp4" and n < FP4_MIN_SM:
        return f"NVFP4 needs FP4 tensor cores (sm100 or newer); {sm} has none"
    if kv_cache == "fp8" and n < FP8_MIN_SM:
        return f"an FP8 KV cache needs sm89 or newer; {sm} has no FP8 support"
    if kv_cache == "nvfp4" and n < FP4_MIN_SM:
        return f"an NVFP4 KV cache needs sm100 or newer; {sm} has no FP4 support"
    if blackwell_dc:
        if quant in ("int8_wo", "int4_wo", "int4_awq", "w4a8_awq"):
            return (f"{QUANT_LABEL[quant]} is rejected on {sm} by TensorRT-LLM: "
                    "'INT8/INT4 quantization is not supported on SM>=100.'")
        if kv_cache == "int8":
            return (f"an INT8 KV cache is rejected on {sm} by TensorRT-LLM: "
                    "'INT8/INT4 quantization is not supported on SM>=100.'")
        if quant == "int8_sq":
            return f"SmoothQuant is rejected on {sm} by TensorRT-LLM: 'SmoothQuant is not supported on SM>=100.'"
    return None


# PluginConfig.validate rejects these plugins on SM 100 (reference/trtllm.md section 3).
SM100_REJECTED_PLUGINS = (
    "gemm_swiglu_plugin",
    "fp8_rowwise_gemm_plugin",
    "low_latency_gemm_plugin",
    "low_latency_gemm_swiglu_plugin",
    "bert_context_fmha_fp32_acc",
)


def plugin_unsupported_reason(flags: dict[str, object], sm: str) -> str | None:
    if sm != "sm100":
        return None
    for name in SM100_REJECTED_PLUGINS:
        value = flags.get(name)
        if value not in (None, "disable"):
            return f"engine.flags.{name}={value} is not supported on SM 100 (PluginConfig.validate)"
    return None


@dataclass(frozen=True)
class DetectedGpu:
    index: int
    name: str
    sm: str
    memory_bytes: int


@lru_cache(maxsize=1)
def detect_gpus() -> tuple[DetectedGpu, ...]:
    """GPUs visible through NVML (probed once per process); empty without a driver or a GPU."""
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return ()
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):
                name = name.decode()
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            found.append(DetectedGpu(index, name, f"sm{major}{minor}", int(memory)))
        return tuple(found)
    except pynvml.NVMLError:
        return ()
    finally:
        pynvml.nvmlShutdown()


def resolve_device(device: str) -> str:
    """`auto` -> `cuda` when this host has an NVIDIA GPU, else `cpu`; other values as given."""
    if device == "auto":
        return "cuda" if detect_gpus() else "cpu"
    return device
