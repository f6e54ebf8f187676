"""Toolchain fingerprints: versions of the packages a stage uses, read from package metadata (no
imports), plus CUDA and the container image when one is used. A stage's key holds only its parts."""

from __future__ import annotations

import inspect
import json
import os
import platform
import shutil
import subprocess
from functools import lru_cache
from importlib import metadata
from typing import Any, Optional

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, model_validator

from trtbuild.errors import TrtbuildError
from trtbuild.host import hardware

# Distribution names of the packages stages may depend on.
DISTRIBUTIONS = {
    "torch": ("torch",),
    "transformers": ("transformers",),
    "modelopt": ("nvidia-modelopt",),
    "tensorrt_llm": ("tensorrt-llm", "tensorrt_llm"),
    "tensorrt": ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt_cu12", "tensorrt_cu13"),
    "gguf": ("gguf",),
    "safetensors": ("safetensors",),
    "accelerate": ("accelerate",),
    "llama_cpp": ("llama_cpp_python", "llama-cpp-python"),
}
IMAGE_ENV = "TRTBUILD_IMAGE_DIGEST"  # set in a container to the image digest it runs from


@lru_cache(maxsize=None)
def package_version(name: str) -> Optional[str]:
    for dist in DISTRIBUTIONS.get(name, (name,)):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def cuda_version() -> Optional[str]:
    """The CUDA build of torch (`2.11.0+cu130` -> `13.0`), or None for CPU builds."""
    version = package_version("torch") or ""
    if "+cu" in version:
        digits = version.split("+cu", 1)[1]
        return f"{digits[:-1]}.{digits[-1]}" if digits.isdigit() and len(digits) >= 2 else digits
    return None


def fingerprint(parts: tuple[str, ...]) -> dict[str, Optional[str]]:
    """{part: version or None} for the parts a stage names ('cuda' and 'image' included)."""
    out: dict[str, Optional[str]] = {}
    for part in parts:
        if part == "cuda":
            out[part] = cuda_version()
        elif part == "image":
            out[part] = os.environ.get(IMAGE_ENV)
        elif part == "python":
            out[part] = platform.python_version()
        elif part == "llamacpp_converter":
            from trtbuild.host import llamacpp

            out[part] = llamacpp.converter_fingerprint()
        else:
            out[part] = package_version(part)
    return out


def stage_fingerprint(parts: tuple[str, ...], image: Optional[str] = None) -> dict[str, Optional[str]]:
    """What a stage's key holds of its toolchain: a container image pinned by digest pins every package
    in it, so a stage run in one is keyed by the image alone; otherwise the versions installed here."""
    if image:
        return {"image": image}
    return fingerprint(parts)


def standin_parts(versions: dict[str, Optional[str]]) -> list[str]:
    """The parts of a toolchain that are test stand-ins (a version whose local label is `standin`,
    such as tensorrt_llm 1.2.0+standin): what they made must never pass for the real thing."""
    return sorted(name for name, version in versions.items() if is_standin_version(version))


def missing(parts: tuple[str, ...]) -> list[str]:
    """Packages among `parts` that are not installed here."""
    return [p for p in parts if p not in ("cuda", "image", "python", "llamacpp_converter") and package_version(p) is None]


STANDIN_LABEL = "standin"  # the local version label of everything a stand-in toolchain made: 0+standin
IMAGE_PROBE_TIMEOUT_S = 1800  # `docker run` may pull a multi-GB image first


def is_standin_version(version: Optional[str]) -> bool:
    """`1.2.0+standin`, `0+standin`: the local label says a test stand-in made it."""
    if not version:
        return False
    try:
        return Version(version).local == STANDIN_LABEL
    except InvalidVersion:
        return version.rpartition("+")[2] == STANDIN_LABEL and "+" in version


class EngineToolchain(BaseModel):
    """What builds (or loads) an engine: TensorRT-LLM and TensorRT, which the engine is tied to;
    CUDA, recorded only; the container image, when one is used."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    tensorrt_llm: Optional[str] = None
    tensorrt: Optional[str] = None
    cuda: Optional[str] = None
    image: Optional[str] = None
    standin: bool = False  # True when any version carries the local label `standin`

    @model_validator(mode="before")
    @classmethod
    def _mark_standin(cls, data: Any) -> Any:
        if isinstance(data, dict):
            versions = (data.get("tensorrt_llm"), data.get("tensorrt"), data.get("cuda"))
            data = {**data, "standin": bool(data.get("standin")) or any(is_standin_version(v) for v in versions)}
        return data


def _versions_in_this_python(distributions: dict) -> dict:
    """The engine toolchain's versions from package metadata (no imports of tensorrt). Standard
    library only: this function's source is also the script `probe_engine_toolchain` runs in an image."""
    import os
    from importlib import metadata

    def first(names):
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return None

    torch = first(["torch"]) or ""
    digits = torch.split("+cu", 1)[1] if "+cu" in torch else ""
    if digits.isdigit() and len(digits) >= 2:  # torch 2.9.0+cu128 -> 12.8
        cuda = f"{digits[:-1]}.{digits[-1]}"
    else:  # NVIDIA's images set CUDA_VERSION=12.9.1
        cuda = ".".join(os.environ["CUDA_VERSION"].split(".")[:2]) if os.environ.get("CUDA_VERSION") else None
    return {"tensorrt_llm": first(distributions["tensorrt_llm"]), "tensorrt": first(distributions["tensorrt"]), "cuda": cuda}


def _image_probe_script() -> str:
    return (inspect.getsource(_versions_in_this_python)
            + f"\nimport json\nprint(json.dumps(_versions_in_this_python({DISTRIBUTIONS!r})))\n")


def probe_engine_toolchain(image: Optional[str] = None) -> EngineToolchain:
    """The engine toolchain of this environment, or, with `image`, of that container image
    (`docker run --rm --entrypoint python3 IMAGE -c ...`). A missing docker or a failing probe is
    one line naming the image."""
    if image is None:  # package_version: the one reader of this environment's versions (tests patch it)
        return EngineToolchain(tensorrt_llm=package_version("tensorrt_llm"), tensorrt=package_version("tensorrt"),
                               cuda=_versions_in_this_python(DISTRIBUTIONS)["cuda"])
    where = f"toolchain probe of image {image}"
    docker = shutil.which("docker")
    if docker is None:
        raise TrtbuildError(f"{where}: docker is not installed on this host")
    try:
        done = subprocess.run([docker, "run", "--rm", "--entrypoint", "python3", image, "-c", _image_probe_script()],
                              capture_output=True, text=True, timeout=IMAGE_PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise TrtbuildError(f"{where} failed: no answer within {IMAGE_PROBE_TIMEOUT_S} s") from None
    if done.returncode != 0:
        reason = next((line.strip() for line in reversed(done.stderr.splitlines()) if line.strip()), "no message")
        raise TrtbuildError(f"{where} failed (exit {done.returncode}): {reason}")
    last = next((line for line in reversed(done.stdout.splitlines()) if line.strip()), "")
    try:
        versions = json.loads(last)
        return EngineToolchain(**{k: versions.get(k) for k in ("tensorrt_llm", "tensorrt", "cuda")}, image=image)
    except (ValueError, TypeError, AttributeError):
        raise TrtbuildError(f"{where} failed: its python3 printed no versions ({last[:200]!r})") from None


def engine_host_problem(sm: str, version: str) -> Optional[str]:
    """Why this machine cannot build an engine for `sm` with tensorrt_llm `version`, or None."""
    series = ".".join(version.split(".")[:2])
    installed = package_version("tensorrt_llm")  # not probe_engine_toolchain: its CUDA lookup is not cached
    sms = sorted({g.sm for g in hardware.detect_gpus()})
    if sm in sms and installed is not None and installed.startswith(series + "."):
        return None
    have = f"{'/'.join(sms)} GPU" if sms else "no GPU"
    have += f", tensorrt_llm {installed}" if installed else ", no tensorrt_llm"
    return f"needs {sm} GPU with tensorrt_llm {series}.x (this machine: {have})"


def container_host_problem(sm: str, image: str) -> Optional[str]:
    """Why this machine cannot build an engine for `sm` in the container `image`, or None."""
    sms = sorted({g.sm for g in hardware.detect_gpus()})
    if sm in sms and shutil.which("docker"):
        return None
    have = f"{'/'.join(sms)} GPU" if sms else "no GPU"
    have += ", docker" if shutil.which("docker") else ", no docker"
    return f"needs {sm} GPU and docker to build in {image} (this machine: {have})"
