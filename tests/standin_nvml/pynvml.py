"""TEST STAND-IN for NVIDIA's `pynvml` (nvidia-ml-py): answers what a real driver answered.

Only the calls trtbuild/host/hardware.py makes exist here. It answers from recorded files,
gpus/NAME.json (A100, L40S, H100, H200, B200): $STANDIN_NVML_GPU names one board, or several
separated by commas for a host whose GPUs differ ("H100,A100": GPU 0 is an H100, GPU 1 an A100),
and $STANDIN_NVML_COUNT (default 1) repeats that list. Each handle answers for its own GPU; the
system calls (driver versions) answer from GPU 0's file, as one host has one driver. With
STANDIN_NVML_GPU unset, nvmlInit fails as it does on a host without an NVIDIA driver. Tests put this
folder first on sys.path / PYTHONPATH; trtbuild itself never reads these variables, so no user of
trtbuild can claim a GPU this way.

What the real module does, and this one too (nvidia-ml-py 13.615.71, pynvml.py): NVMLError(value)
is made an instance of the subclass for that code (NVMLError.__new__ with the classes
_extractNVMLErrorsAsClasses makes, e.g. NVMLError_InvalidArgument) and prints as the code's string
(_errcode_to_string); nvmlDeviceGetHandleByIndex(i) fails with NVML_ERROR_INVALID_ARGUMENT for an
index the driver has no GPU for (the C library's answer, passed on by _nvmlCheckReturn), and so does
every nvmlDeviceGet* given something that is not a device handle; any call before nvmlInit fails
with NVML_ERROR_UNINITIALIZED.
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
    _valClassMapping: dict = {}
    _errcode_to_string = {NVML_ERROR_UNINITIALIZED: "Uninitialized", NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
                          NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found"}

    def __new__(cls, value: int):
        if cls is NVMLError:  # as the real one: NVMLError(2) is an NVMLError_InvalidArgument
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self._errcode_to_string.get(self.value, f"NVML error {self.value}")


class NVMLError_Uninitialized(NVMLError):
    def __new__(cls, value: int = NVML_ERROR_UNINITIALIZED):
        return NVMLError.__new__(cls, value)

    def __init__(self, value: int = NVML_ERROR_UNINITIALIZED) -> None:
        super().__init__(value)


class NVMLError_InvalidArgument(NVMLError):
    def __new__(cls, value: int = NVML_ERROR_INVALID_ARGUMENT):
        return NVMLError.__new__(cls, value)

    def __init__(self, value: int = NVML_ERROR_INVALID_ARGUMENT) -> None:
        super().__init__(value)


class NVMLError_LibraryNotFound(NVMLError):  # what the real nvmlInit raises without libnvidia-ml.so
    def __new__(cls, value: int = NVML_ERROR_LIBRARY_NOT_FOUND):
        return NVMLError.__new__(cls, value)

    def __init__(self, value: int = NVML_ERROR_LIBRARY_NOT_FOUND) -> None:
        super().__init__(value)


NVMLError._valClassMapping.update({NVML_ERROR_UNINITIALIZED: NVMLError_Uninitialized,
                                   NVML_ERROR_INVALID_ARGUMENT: NVMLError_InvalidArgument,
                                   NVML_ERROR_LIBRARY_NOT_FOUND: NVMLError_LibraryNotFound})


class c_nvmlDevice_t:
    """A device handle: which GPU it stands for (the real one is an opaque pointer)."""

    def __init__(self, index: int) -> None:
        self._index = index

    def __repr__(self) -> str:
        return f"<stand-in c_nvmlDevice_t of GPU {self._index}>"


_devices: list = []  # the recorded answers, one per GPU index
_init_depth = 0  # NVML counts nvmlInit/nvmlShutdown pairs


def _load() -> list:
    names = os.environ.get("STANDIN_NVML_GPU")
    if not names:
        raise NVMLError_LibraryNotFound()
    boards = []
    for name in names.split(","):
        path = GPUS / f"{name}.json"
        if not path.is_file():  # a test's mistake, not a host without a GPU: fail loudly
            raise FileNotFoundError(f"STANDIN_NVML_GPU={names}: no recorded answers {path}")
        boards.append(json.loads(path.read_text()))
    return boards * int(os.environ.get("STANDIN_NVML_COUNT", "1"))


def nvmlInit() -> None:
    global _devices, _init_depth
    devices = _load()
    if _init_depth == 0:
        _devices = devices
    _init_depth += 1


def nvmlShutdown() -> None:
    global _init_depth
    _initialized()
    _init_depth -= 1


def _initialized() -> list:
    if _init_depth <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _devices


def _device(handle) -> dict:
    devices = _initialized()
    if not isinstance(handle, c_nvmlDevice_t) or not 0 <= handle._index < len(devices):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return devices[handle._index]


def nvmlDeviceGetCount() -> int:
    return len(_initialized())


def nvmlDeviceGetHandleByIndex(index: int) -> c_nvmlDevice_t:
    devices = _initialized()
    index = int(index) & 0xFFFFFFFF  # the real one passes c_uint(index): -1 is 4294967295
    if index >= len(devices):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return c_nvmlDevice_t(index)


def nvmlDeviceGetName(handle) -> str:
    return _device(handle)["nvmlDeviceGetName"]


def nvmlDeviceGetCudaComputeCapability(handle) -> tuple[int, int]:
    major, minor = _device(handle)["nvmlDeviceGetCudaComputeCapability"]
    return major, minor


def nvmlDeviceGetMemoryInfo(handle) -> SimpleNamespace:  # the real one returns a c_nvmlMemory_t
    return SimpleNamespace(**_device(handle)["nvmlDeviceGetMemoryInfo"])


def nvmlSystemGetDriverVersion() -> str:
    return _initialized()[0]["nvmlSystemGetDriverVersion"]


def nvmlSystemGetCudaDriverVersion() -> int:  # e.g. 12040 for CUDA 12.4
    return _initialized()[0]["nvmlSystemGetCudaDriverVersion"]
