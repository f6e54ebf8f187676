"""The GPU catalogue: the SM architectures an engine can target, the tensor-core formats each has,
and the products of each SM with their memory. The reader of trtbuild/data/gpus.json, the one
table of those facts; what a host has is probed by trtbuild.host.hardware (NVML).
Plain data, no torch or numpy: `plan` imports it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MIB = 1024 * 1024
TABLE_FILE = "gpus.json"


class SmArch(BaseModel):
    """One SM architecture an engine can target."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    title: str = Field(description="the architecture, for people: 'Hopper'")
    default_product: str = Field(description="the product whose memory an estimate uses when a recipe names only the SM")


class TensorCores(BaseModel):
    """From which SM on a number format has tensor cores (every later SM has them too)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    from_sm: str = Field(alias="from", description="the first SM with them: 'sm89'")
    why: str = Field(description="for people, with the architecture that brought them")


class GpuProduct(BaseModel):
    """One board: its SM and the total memory nvidia-smi reports for it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(description="the catalogue's spelling: 'H100'")
    sm: str
    memory_mib: int = Field(gt=0, description="total memory as nvidia-smi reports it (MiB)")
    aliases: tuple[str, ...] = Field((), description="other spellings NVML or people use: 'H100-SXM'")

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


class GpuTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    about: str
    sms: dict[str, SmArch] = Field(description="sm -> architecture, oldest first")
    tensor_cores: dict[Literal["fp8", "fp4"], TensorCores]
    products: tuple[GpuProduct, ...]

    @model_validator(mode="after")
    def _consistent(self) -> "GpuTable":
        names = {p.name for p in self.products}
        for sm, arch in self.sms.items():
            if re.fullmatch(r"sm\d+", sm) is None:
                raise ValueError(f"sms.{sm}: an SM is spelled smNN")
            if arch.default_product not in names:
                raise ValueError(f"sms.{sm}.default_product {arch.default_product!r} is not a product")
        for p in self.products:
            if p.sm not in self.sms:
                raise ValueError(f"products.{p.name}.sm {p.sm!r} is not one of the table's SMs")
        for kind, cores in self.tensor_cores.items():
            if cores.from_sm not in self.sms:
                raise ValueError(f"tensor_cores.{kind}.from {cores.from_sm!r} is not one of the table's SMs")
        return self


@lru_cache(maxsize=None)
def table() -> GpuTable:
    """The table as stored (trtbuild/data/gpus.json)."""
    return GpuTable.model_validate(json.loads(resources.files("trtbuild").joinpath("data", TABLE_FILE).read_text()))


def sm_number(sm: str) -> int:
    """`sm90` -> 90."""
    return int(sm[2:])


# SM architectures an engine can target, oldest first: sm -> title.
SM_ARCHES: dict[str, str] = {sm: arch.title for sm, arch in table().sms.items()}
CATALOGUE: tuple[GpuProduct, ...] = table().products
DEFAULT_PRODUCT: dict[str, str] = {sm: arch.default_product for sm, arch in table().sms.items()}
FP8_TENSOR_CORES_FROM: str = table().tensor_cores["fp8"].from_sm  # "sm89"
FP4_TENSOR_CORES_FROM: str = table().tensor_cores["fp4"].from_sm  # "sm100"


def has_fp8_tensor_cores(sm: str) -> bool:
    return sm_number(sm) >= sm_number(FP8_TENSOR_CORES_FROM)


def has_fp4_tensor_cores(sm: str) -> bool:
    return sm_number(sm) >= sm_number(FP4_TENSOR_CORES_FROM)


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
