"""What this host's GPUs are: the NVML probe (GPUs, driver) and whether torch can use them. What a
GPU product or SM is (the catalogue) is a fact: trtbuild.facts.gpus."""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional


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


@lru_cache(maxsize=1)
def torch_built_cuda() -> Optional[str]:
    """The CUDA version the installed torch was built for (`cuda = '12.8'` in its torch/version.py),
    read without importing it (the runner stays light); None for a CPU wheel (`cuda: Optional[str] =
    None`) or no torch. NVIDIA's container builds carry no `+cu` in their version, so the file, not
    the version string, decides."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    except OSError:
        return None
    found = re.search(r"^cuda(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return found.group(1) if found else None


def torch_has_cuda() -> bool:
    """Whether the installed torch is a CUDA build (torch_built_cuda)."""
    return torch_built_cuda() is not None


def resolve_device(device: str) -> str:
    """`auto` -> `cuda` when this host has an NVIDIA GPU and torch can use it (a CUDA build), else
    `cpu`; other values as given."""
    if device == "auto":
        return "cuda" if detect_gpus() and torch_has_cuda() else "cpu"
    return device


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name as /proc/cpuinfo gives it (`model name`, first processor), else what Python's
    platform module says: the product a CPU measurement's platform names (trtbuild/bench/run.py)."""
    import platform

    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
