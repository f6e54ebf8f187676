"""TEST STAND-IN for NVIDIA's `pynvml` (nvidia-ml-py): answers what a real driver answered.

Only the calls trtbuild/hardware.py makes exist here. It answers from a recorded file,
gpus/$STANDIN_NVML_GPU.json (A100, L40S, H100, H200, B200), with $STANDIN_NVML_COUNT identical
devices (default 1). With STANDIN_NVML_GPU unset, nvmlInit fails as it does on a host without an
NVIDIA driver. Tests put this folder first on sys.path / PYTHONPATH; trtbuild itself never reads
these variables, so no user of trtbuild can claim a GPU this way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

GPUS = Path(__file__).resolve().parent / "gpus"

# Return codes of nvml.h that the stand-in raises (the same numbers as the real library).
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_LIBRARY_NOT_FOUND = 12


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {NVML_ERROR_UNINITIALIZED: "Uninitialized", NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
                NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found"}.get(self.value, f"NVML error {self.value}")


class NVMLError_LibraryNotFound(NVMLError):  # what the real nvmlInit raises without libnvidia-ml.so
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_LIBRARY_NOT_FOUND)


_recorded: dict | None = None
_count = 0
_init_depth = 0  # NVML counts nvmlInit/nvmlShutdown pairs


def _load() -> tuple[dict, int]:
    name = os.environ.get("STANDIN_NVML_GPU")
    if not name:
        raise NVMLError_LibraryNotFound()
    path = GPUS / f"{name}.json"
    if not path.is_file():  # a test's mistake, not a host without a GPU: fail loudly
        raise FileNotFoundError(f"STANDIN_NVML_GPU={name}: no recorded answers {path}")
    return json.loads(path.read_text()), int(os.environ.get("STANDIN_NVML_COUNT", "1"))


def nvmlInit() -> None:
    global _recorded, _count, _init_depth
    _recorded, _count = _load()
    _init_depth += 1


def nvmlShutdown() -> None:
    global _init_depth
    _initialized()
    _init_depth -= 1


def _initialized() -> dict:
    if _init_depth <= 0 or _recorded is None:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _recorded


def nvmlDeviceGetCount() -> int:
    _initialized()
    return _count


def nvmlDeviceGetHandleByIndex(index: int) -> SimpleNamespace:
    _initialized()
    if not 0 <= index < _count:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return SimpleNamespace(index=index)


def nvmlDeviceGetName(handle) -> str:
    return _initialized()["nvmlDeviceGetName"]


def nvmlDeviceGetCudaComputeCapability(handle) -> tuple[int, int]:
    major, minor = _initialized()["nvmlDeviceGetCudaComputeCapability"]
    return major, minor


def nvmlDeviceGetMemoryInfo(handle) -> SimpleNamespace:  # the real one returns a c_nvmlMemory_t
    return SimpleNamespace(**_initialized()["nvmlDeviceGetMemoryInfo"])


def nvmlSystemGetDriverVersion() -> str:
    return _initialized()["nvmlSystemGetDriverVersion"]


def nvmlSystemGetCudaDriverVersion() -> int:  # e.g. 12040 for CUDA 12.4
    return _initialized()["nvmlSystemGetCudaDriverVersion"]
