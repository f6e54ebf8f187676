"""Where the runtimes keep the caches a warm start reuses, and what they already check, read from
their sources (each fact names the file and the commit it was read at). trtbuild/bench/warmstart.py
decides from these where a captured cache goes and why it keys what it keys.

vLLM 0.26.0: read from the vllm-0.26.0 wheel on PyPI (its vllm/_version.py says commit
ffd46bfab of vllm-project/vllm); FlashInfer 0.6.14 (the version vLLM 0.26.0's closure installs,
../shared/gpu-vllm/wheels.txt) at its tag v0.6.14; TensorRT-LLM's autotuner at the one commit of
it that could be read (its tensorrt_llm/version.py says 1.2.0rc2)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """A fact's origin: repository, commit and path."""

    repo: str
    commit: str
    path: str

    def cite(self) -> str:
        return f"{self.repo}@{self.commit[:12]}:{self.path}"


VLLM_VERSION = "0.26.0"
VLLM_COMMIT = "ffd46bfab"  # vllm/_version.py's __commit_id__ in the 0.26.0 wheel ("gffd46bfab")
FLASHINFER_VERSION = "0.6.14"
FLASHINFER_COMMIT = "19f1a41e6b21f0c422d775e377b6fdf9a1fc9d23"  # tag v0.6.14
TRTLLM_COMMIT = "b35ac1b64368513d215c57d2ed01d62d910df8da"  # tensorrt_llm/version.py: 1.2.0rc2

# --- vLLM ------------------------------------------------------------------------------------
#: The variable vLLM reads its cache root from; unset, $XDG_CACHE_HOME/vllm, else ~/.cache/vllm
#: (envs.py: "VLLM_CACHE_ROOT": os.path.expanduser(os.getenv("VLLM_CACHE_ROOT",
#: os.path.join(get_default_cache_root(), "vllm")))).
VLLM_CACHE_ENV = "VLLM_CACHE_ROOT"
VLLM_CACHE_DEFAULT = "~/.cache/vllm"
VLLM_CACHE_ROOT_SOURCE = Source("vllm-project/vllm", VLLM_COMMIT, "vllm/envs.py")

#: torch.compile's cache: VLLM_CACHE_ROOT/torch_compile_cache/<hash_key>/rank_<rank>_<dp_rank>/<prefix>,
#: hash_key = sha256(str([env_hash, config_hash, code_hash, compiler_hash]))[:10] (VllmBackend.__call__):
#: env_hash hashes envs.compile_factors() (every VLLM_* variable but a few, VLLM_CACHE_ROOT among
#: those left out); config_hash is VllmConfig.compute_hash() (vLLM's __version__, the model, cache,
#: parallel, scheduler, device, load ... configs; ModelConfig.compute_hash ignores the tokenizer,
#: seed, served name and a few more, not `model`, the path it was given); code_hash hashes the
#: traced source files; compiler_hash (Inductor) hashes get_inductor_factors(): torch's
#: CacheBase.get_system() and torch_key() and Inductor's config. Inductor's and Triton's own caches
#: are sent below it (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR = <hash_key>/inductor_cache,
#: triton_cache). Each rank folder gets cache_key_factors.json with the raw factors.
TORCH_COMPILE_CACHE = "torch_compile_cache"
TORCH_COMPILE_SOURCE = Source("vllm-project/vllm", VLLM_COMMIT, "vllm/compilation/backends.py")
TORCH_COMPILE_FACTORS_SOURCES = (
    Source("vllm-project/vllm", VLLM_COMMIT, "vllm/config/vllm.py"),  # VllmConfig.compute_hash
    Source("vllm-project/vllm", VLLM_COMMIT, "vllm/config/model.py"),  # ModelConfig.compute_hash
    Source("vllm-project/vllm", VLLM_COMMIT, "vllm/compilation/compiler_interface.py"),  # get_inductor_factors
    Source("vllm-project/vllm", VLLM_COMMIT, "vllm/envs.py"),  # compile_factors
)
#: So vLLM already names the folder by its version, torch's, the GPU and CUDA Inductor sees and the
#: configuration, and a cache from another of these is not found (it compiles afresh, into another
#: folder) rather than misused; but the model's path is among the factors: a cache is found only
#: when the artifact is served from the path it was captured with.
MODEL_PATH_IS_A_FACTOR = True

#: FlashInfer's autotune results: VLLM_CACHE_ROOT/flashinfer_autotune_cache/<flashinfer version>/
#: <archs>/<sha256 of aot_compile_hash_factors(vllm_config)>/autotune_configs.json (the two middle
#: parts are the last two of flashinfer.jit.env.FLASHINFER_WORKSPACE_DIR = ~/.cache/flashinfer/
#: <version>/<sorted target CUDA archs joined by _>); VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR replaces
#: the root. aot_compile_hash_factors is [env hash, VllmConfig.compute_hash()] (+ Inductor's
#: factors with VLLM_USE_MEGA_AOT_ARTIFACT). Rank 0 tunes and writes it (temp file + rename) and
#: broadcasts it to the other ranks.
FLASHINFER_AUTOTUNE_CACHE = "flashinfer_autotune_cache"
FLASHINFER_AUTOTUNE_ENV = "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"
FLASHINFER_AUTOTUNE_SOURCE = Source("vllm-project/vllm", VLLM_COMMIT,
                                    "vllm/model_executor/warmup/flashinfer_autotune_cache.py")
FLASHINFER_WORKSPACE_SOURCE = Source("flashinfer-ai/flashinfer", FLASHINFER_COMMIT, "flashinfer/jit/env.py")
#: FlashInfer's AutoTuner.load_configs rejects (falls back to its default tactics) a file whose
#: `_metadata` differs from the running one: flashinfer_version, cuda_version (torch.version.cuda),
#: cublas_version, cudnn_version, cudnn_frontend_version and gpu (the device's name).
FLASHINFER_METADATA_CHECKED = ("flashinfer_version", "cuda_version", "cublas_version", "cudnn_version",
                               "cudnn_frontend_version", "gpu")
FLASHINFER_METADATA_SOURCE = Source("flashinfer-ai/flashinfer", FLASHINFER_COMMIT, "flashinfer/autotuner.py")

# --- TensorRT-LLM ------------------------------------------------------------------------------
#: The PyTorch backend's warm-up runs `autotune(cache_path=os.environ.get("TLLM_AUTOTUNER_CACHE_PATH"))`.
#: autotune() loads and saves `<cache_path without its extension>.rank<rank>.json`; it turns tuning
#: off only when the file at cache_path itself exists, yet ops found in the loaded file are not
#: profiled again. The file is JSON: {"metadata": {lib_version, creation_timestamp, device_name,
#: device_capability}, "cache_data": {str(key): {runner_id, tactic, min_time}}}; load_cache reads
#: the metadata back into the cache object and compares none of it with the running library or GPU.
TRTLLM_CACHE_ENV = "TLLM_AUTOTUNER_CACHE_PATH"
TRTLLM_CACHE_FILE = "autotuner.json"  # what trtbuild sets the variable to, in the folder it captures
TRTLLM_METADATA_RECORDED = ("lib_version", "creation_timestamp", "device_name", "device_capability")
TRTLLM_METADATA_CHECKED: tuple[str, ...] = ()
TRTLLM_AUTOTUNER_SOURCE = Source("NVIDIA/TensorRT-LLM", TRTLLM_COMMIT, "tensorrt_llm/_torch/autotuner.py")

#: The runtimes whose caches trtbuild captures.
RUNTIMES = ("vllm", "trtllm")
#: The package whose version is the key's runtime_version.
RUNTIME_PACKAGE = {"vllm": "vllm", "trtllm": "tensorrt_llm"}
