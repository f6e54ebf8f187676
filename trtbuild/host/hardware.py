"""GPU catalogue (product -> SM, memory), quantization x SM rules, and the NVML probe (GPUs, driver)."""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from trtbuild.facts import quantformats

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


def quant_unsupported_reason(quant: str | None, kv_cache: str | None, sm: str) -> str | None:
    """Why TensorRT-LLM cannot build `quant` / `kv_cache` for `sm`, or None if it can: the SM rules
    of trtbuild/facts/quantformats.py's table (sources there and in reference/trtllm.md section 3)."""
    return quantformats.sm_unsupported_reason(quant, kv_cache, sm_number(sm), sm)


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


@contextmanager
def _nvml():
    """NVML initialized for the block, or None where there is none (no pynvml, no driver)."""
    try:
        import pynvml
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        yield None
        return
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value  # older pynvml returns bytes


@lru_cache(maxsize=1)
def detect_gpus() -> tuple[DetectedGpu, ...]:
    """GPUs visible through NVML (probed once per process); empty without a driver or a GPU.
    The only source of a host's SMs: nothing a user sets can claim a GPU this host lacks."""
    with _nvml() as nvml:
        if nvml is None:
            return ()
        try:
            found = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle).total
                found.append(DetectedGpu(index, _text(nvml.nvmlDeviceGetName(handle)), f"sm{major}{minor}", int(memory)))
            return tuple(found)
        except nvml.NVMLError:
            return ()


@lru_cache(maxsize=1)
def driver_info() -> dict[str, Optional[str]]:
    """{"driver": "550.90.07", "cuda_driver": "12.4"} through NVML, None where unknown. Recorded
    with a build, never keyed: any driver new enough runs the same engine."""
    info: dict[str, Optional[str]] = {"driver": None, "cuda_driver": None}
    with _nvml() as nvml:
        if nvml is None:
            return info
        try:
            info["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            pass
        try:
            version = int(nvml.nvmlSystemGetCudaDriverVersion())  # 12040 -> "12.4", as nvidia-smi shows it
            info["cuda_driver"] = f"{version // 1000}.{version % 1000 // 10}"
        except nvml.NVMLError:
            pass
    return info


def clear_probe_cache() -> None:
    """Probe NVML afresh on the next call (tests that swap the NVML module use it)."""
    detect_gpus.cache_clear()
    driver_info.cache_clear()


def resolve_device(device: str) -> str:
    """`auto` -> `cuda` when this host has an NVIDIA GPU and torch can use it (a CUDA build), else
    `cpu`; other values as given."""
    if device == "auto":
        from trtbuild.host.toolchain import torch_has_cuda

        return "cuda" if detect_gpus() and torch_has_cuda() else "cpu"
    return device
