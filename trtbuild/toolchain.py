"""Toolchain fingerprints: versions of the packages a stage uses, read from package metadata (no
imports), plus CUDA and the container image when one is used. A stage's key holds only its parts."""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from importlib import metadata
from typing import Optional

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
    return sorted(name for name, version in versions.items() if version and version.split("+", 1)[-1] == "standin"
                  and "+" in version)


def missing(parts: tuple[str, ...]) -> list[str]:
    """Packages among `parts` that are not installed here."""
    return [p for p in parts if p not in ("cuda", "image", "python") and package_version(p) is None]


def engine_host_problem(sm: str, version: str) -> Optional[str]:
    """Why this machine cannot build an engine for `sm` with tensorrt_llm `version`, or None."""
    from trtbuild import hardware

    series = ".".join(version.split(".")[:2])
    installed = package_version("tensorrt_llm")
    sms = sorted({g.sm for g in hardware.detect_gpus()})
    if sm in sms and installed is not None and installed.startswith(series + "."):
        return None
    have = f"{'/'.join(sms)} GPU" if sms else "no GPU"
    have += f", tensorrt_llm {installed}" if installed else ", no tensorrt_llm"
    return f"needs {sm} GPU with tensorrt_llm {series}.x (this machine: {have})"


def container_host_problem(sm: str, image: str) -> Optional[str]:
    """Why this machine cannot build an engine for `sm` in the container `image`, or None."""
    import shutil

    from trtbuild import hardware

    sms = sorted({g.sm for g in hardware.detect_gpus()})
    if sm in sms and shutil.which("docker"):
        return None
    have = f"{'/'.join(sms)} GPU" if sms else "no GPU"
    have += ", docker" if shutil.which("docker") else ", no docker"
    return f"needs {sm} GPU and docker to build in {image} (this machine: {have})"


# TEMPORARY STUB (replaced by wt-probe's at merge)
from dataclasses import dataclass as _dc
@_dc(frozen=True)
class EngineToolchain:
    tensorrt_llm: Optional[str]; tensorrt: Optional[str]; cuda: Optional[str]; image: Optional[str]; standin: bool
def probe_engine_toolchain(image=None):
    v = {"tensorrt_llm": package_version("tensorrt_llm"), "tensorrt": package_version("tensorrt")}
    return EngineToolchain(v["tensorrt_llm"], v["tensorrt"], cuda_version(), image, bool(standin_parts(v)))
