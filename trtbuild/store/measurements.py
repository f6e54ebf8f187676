"""Typed, versioned records of serving measurements, stored beside the artifact they measure and
never in it (an artifact is a function of its key's inputs; a measurement is a fact about a host).

- `BenchRecord` (bench/<artifact digest>/<id>.json): one workload at one concurrency level on one
  runtime on one GPU (or CPU), with the load generator's summary figures and, as a blob, its raw
  per-request results. `id` is the sha256 of (artifact digest, runtime, runtime version, GPU product,
  SM, workload digest): a later run of the same measurement replaces it; nothing else does.
- `WarmStartRecord` (warmstart/<artifact digest>/<key digest>.json): a runtime's compile and
  autotune caches captured after a start on the artifact, stored as an artifact of their own (a
  manifest in the CAS), with everything that makes them valid (`WarmStartKey`).

Both are pushed and pulled with their artifact and removed by gc with it; neither is part of any
action key."""

from __future__ import annotations

import hashlib
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtbuild.keys import canonical_json
from trtbuild.store.errors import CorruptStore
from trtbuild.store.records import Digest, UtcTime, first_error

BENCH_SCHEMA = 1
WARMSTART_SCHEMA = 2  # 2: the key holds served_from
SHA256 = r"^[0-9a-f]{64}$"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Platform(_Record):
    """Where the server ran: a GPU product and its SM, or the CPU (llama.cpp's packaged command)."""

    device: Literal["gpu", "cpu"] = Field(description="`gpu`, or `cpu` for a server that runs on the CPU.")
    product: str = Field(description="The GPU's product name as NVML reports it (`NVIDIA H200`); for the CPU, its "
                                     "model name (/proc/cpuinfo).")
    sm: Optional[str] = Field(None, description="The GPU's SM (`sm90`); None on the CPU.")
    count: int = Field(ge=0, description="GPUs the server used (its tensor times pipeline parallel size); 0 on the CPU.")
    driver: Optional[str] = Field(None, description="NVIDIA driver version (NVML); None on the CPU.")


class Percentiles(_Record):
    """One latency's distribution over the run's requests, in milliseconds."""

    mean: float = Field(ge=0, description="Mean, ms.")
    p50: float = Field(ge=0, description="Median, ms.")
    p90: float = Field(ge=0, description="90th percentile, ms.")
    p95: float = Field(ge=0, description="95th percentile, ms.")
    p99: float = Field(ge=0, description="99th percentile, ms.")


class Figures(_Record):
    """What the load generator measured, as its own summary says (never recomputed here)."""

    ttft_ms: Percentiles = Field(description="Time to first token.")
    tpot_ms: Percentiles = Field(description="Time per output token after the first (per request: (end-to-end - TTFT) "
                                             "/ (tokens - 1)).")
    itl_ms: Percentiles = Field(description="Inter-token latency (every gap between streamed tokens).")
    e2el_ms: Percentiles = Field(description="End-to-end request latency.")
    request_throughput: float = Field(ge=0, description="Completed requests per second over the run.")
    output_token_throughput: float = Field(ge=0, description="Generated tokens per second over the run.")
    total_token_throughput: float = Field(ge=0, description="Prompt plus generated tokens per second over the run.")
    completed: int = Field(ge=0, description="Requests that completed.")
    failed: int = Field(ge=0, description="Requests that failed (a run with any failure is not recorded).")
    input_tokens: int = Field(ge=0, description="Prompt tokens sent, in total.")
    output_tokens: int = Field(ge=0, description="Tokens generated, in total.")
    duration_s: float = Field(ge=0, description="Wall-clock seconds of the run.")


class LoadGenerator(_Record):
    name: Literal["aiperf", "vllm-bench"] = Field(description="NVIDIA's aiperf, or vLLM's `vllm bench serve`.")
    version: str = Field(description="Its package's version (aiperf, or vllm).")
    command: list[str] = Field(description="The command line it ran with (ports and paths as they were).")


class BenchRecord(_Record):
    """bench/<artifact>/<id>.json: one measured workload at one concurrency level."""

    schema_: int = Field(BENCH_SCHEMA, alias="schema", description="Version of this record's layout.")
    id: str = Field(pattern=SHA256, description="sha256 of the measurement's identity (bench_id): artifact, runtime "
                                                "and version, GPU product and SM, workload.")
    artifact: Digest = Field(description="The artifact served: digest of its manifest and its size.")
    target: str = Field(description="The recipe target the artifact was pulled or built as.")
    recipe: str = Field(description="The recipe's name.")
    runtime: str = Field(description="The runtime that served it (`vllm`, `trtllm`, `sglang`, `llamacpp`).")
    runtime_version: str = Field(description="Its package's version.")
    platform: Platform = Field(description="Where it ran.")
    workload: str = Field(description="The workload's name in the recipe that ran it.")
    workload_spec: dict[str, Any] = Field(description="What was sent (Workload.identity): lengths, spread, requests, "
                                                      "concurrency, seed.")
    workload_digest: str = Field(pattern=SHA256, description="sha256 of workload_spec's canonical JSON.")
    figures: Figures = Field(description="The load generator's summary.")
    time_to_ready_s: float = Field(ge=0, description="Seconds from the server's start to its first answer on "
                                                     "/v1/models, for the start this run used.")
    warm_start: Optional[str] = Field(None, pattern=SHA256, description="The warm-start cache artifact installed for "
                                                                        "that start, if one was.")
    peak_gpu_memory_mib: Optional[float] = Field(None, ge=0, description="Peak GPU memory in use on the server's "
                                                                         "GPUs during the run (NVML), MiB; None on the CPU.")
    peak_rss_mib: float = Field(ge=0, description="Peak resident memory of the server's processes during the run, MiB.")
    load_generator: LoadGenerator = Field(description="What drove the load.")
    raw: Digest = Field(description="Blob of the load generator's per-request results, as it wrote them.")
    created: UtcTime = Field(description="When the run ended (UTC, RFC 3339).")
    host: str = Field(description="Host name of the machine that ran it.")
    standin: list[str] = Field(default_factory=list, description="Parts that were test stand-ins (never real figures).")


def bench_id(artifact: str, runtime: str, runtime_version: str, platform: Platform, workload_digest: str) -> str:
    """The one place that decides what makes two measurements the same measurement."""
    identity = {"artifact": artifact, "runtime": runtime, "runtime_version": runtime_version,
                "device": platform.device, "product": platform.product, "sm": platform.sm, "gpus": platform.count,
                "workload": workload_digest}
    return hashlib.sha256(canonical_json(identity)).hexdigest()


class WarmStartKey(_Record):
    """Everything that decides whether a runtime can reuse a captured compile and autotune cache. A
    host installs the cache only when every field equals its own (warmstart.host_key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    artifact: str = Field(pattern=SHA256, description="The checkpoint or engine the runtime loaded.")
    runtime: str = Field(description="`vllm` or `trtllm`.")
    runtime_version: str = Field(description="The runtime package's version.")
    torch: Optional[str] = Field(description="torch's version.")
    triton: Optional[str] = Field(description="triton's version.")
    flashinfer: Optional[str] = Field(description="flashinfer-python's version.")
    cuda: Optional[str] = Field(description="The CUDA version torch was built with.")
    driver: Optional[str] = Field(description="NVIDIA driver version.")
    sm: str = Field(description="The GPUs' SM.")
    tp: int = Field(ge=1, description="Tensor-parallel size it was started with.")
    pp: int = Field(ge=1, description="Pipeline-parallel size it was started with.")
    serve_options: str = Field(pattern=SHA256, description="sha256 of the serve options it was started with (the "
                                                           "packaged options, canonical JSON).")
    served_from: Optional[str] = Field(None, description="vLLM: the model path it was started on (absolute). vLLM "
                                       "hashes that path into its compile cache folder's name, so the cache is used "
                                       "only by a start on the same path; None for TensorRT-LLM, whose autotuner "
                                       "cache does not depend on it.")

    def digest(self) -> str:
        return hashlib.sha256(canonical_json(self.model_dump(mode="json"))).hexdigest()


class WarmStartRecord(_Record):
    """warmstart/<artifact>/<key digest>.json: a captured cache and what it is valid for."""

    schema_: int = Field(WARMSTART_SCHEMA, alias="schema", description="Version of this record's layout.")
    key: WarmStartKey = Field(description="What the cache is valid for.")
    cache: Digest = Field(description="The cache folder, stored as an artifact (its manifest's digest).")
    cold_ready_s: float = Field(ge=0, description="Time to ready of the start that made the cache.")
    warm_ready_s: float = Field(ge=0, description="Time to ready of the start that validated it (with the cache).")
    created: UtcTime = Field(description="When it was captured (UTC).")
    host: str = Field(description="Host that captured it.")


def parse_model(model: type[BaseModel], data: bytes, where: str, what: str):
    """A stored record's bytes, checked: CorruptStore naming `where` when they do not parse."""
    try:
        return model.model_validate_json(data, strict=False)
    except ValidationError as exc:
        raise CorruptStore(f"{what} {where} is malformed ({first_error(exc)}); run `trtbuild cache verify --repair`") from None
    except ValueError:
        raise CorruptStore(f"{what} {where} is not valid JSON; run `trtbuild cache verify --repair`") from None
