"""What an engine is tied to: the one model of an engine's platform. The engine stage's
trtbuild.json holds these facts (store.summaries.EngineSummary.platform reads them out), the lock
file keeps them per engine target, `ls`/`pull` choose by them and `trtbuild check` compares them
with a deploy host. It sits in the store, below the lock and the deploy verbs, so that every one of them can use it."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field


class EnginePlatform(BaseModel):
    """An engine's platform: the SM it was built for, its parallelism, the toolchain it loads
    under, its quantization and its size per GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    sm: str = Field(pattern=r"^sm\d+$", description="The SM the engine was built for.")
    tp: int = Field(ge=1, description="Tensor parallelism.")
    pp: int = Field(ge=1, description="Pipeline parallelism.")
    world_size: int = Field(ge=1, description="GPUs the engine needs (tp x pp).")
    tensorrt_llm: Optional[str] = Field(description="The tensorrt_llm version that built it (engines load only there).")
    tensorrt: Optional[str] = Field(description="The TensorRT version that built it.")
    image: Optional[str] = Field(None, description="The container image it was built in, if any.")
    quantization: Optional[dict[str, Any]] = Field(None, description="config.json's quantization (quant_algo, ...).")
    engine_bytes_per_rank: Optional[int] = Field(None, ge=0, description="The largest rank's engine, in bytes.")
    standin: bool = Field(False, description="Made by a stand-in toolchain (tests): never for real use.")
