"""The vLLM runner: a packaged Hugging Face checkpoint loaded as `vllm serve` would load it (the
options of its serving/vllm_args.json), scored on the validation windows, in the arrays of
validate/prompt_logprobs.py, which the gates compare with the reference.

It runs only on a host with vllm installed and an NVIDIA GPU (`available()` says why not, from
package metadata and NVML: nothing is imported at plan time); everything but `run` is plain Python
on plain data, so it is tested without vllm.

vLLM 0.33.0 facts used (the PyPI wheel vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl, read):
- vllm/entrypoints/llm.py `LLM.__init__(model, ..., skip_tokenizer_init, tensor_parallel_size,
  dtype, quantization, ..., **kwargs)`: the other engine arguments (kv_cache_dtype, max_model_len,
  pipeline_parallel_size, max_num_seqs, ...) travel as keyword arguments to EngineArgs, under the
  names of `vllm serve`'s options with `_` for `-`. `generate(prompts, sampling_params, use_tqdm)`.
- vllm/inputs/llm.py `TokensPrompt`: {"prompt_token_ids": [...]} (with skip_tokenizer_init the
  prompts must be token ids).
- vllm/sampling_params.py: `prompt_logprobs` "Number of log probabilities to return per prompt
  token"; `max_tokens`; `detokenize`.
- vllm/outputs.py `RequestOutput.prompt_logprobs` (on the request, not on its completions) and
  vllm/logprobs.py `create_prompt_logprobs`: the list starts with None ("logprob of first prompt
  token is None"), then entry t is {token_id: Logprob(logprob, rank, decoded_token)} scoring prompt
  token t: the top k plus the prompt token itself (whose rank may exceed k). So entry t+1 is the
  distribution after tokens 0..t, and the actual next token is always there: `target_logp` is exact;
  the reference's top-k tokens outside the candidate's top k are lumped into the KL tail.
- vllm/config/model.py `ModelConfig.max_logprobs: int = Field(default=20, ge=-1)` and
  vllm/sampling_params.py `_validate_logprobs`: a request whose prompt_logprobs exceeds it is refused
  ("Requested prompt logprobs of 256, which is greater than max allowed: 20"), so the LLM is made
  with `max_logprobs` = the k the metric needs (EngineArgs.max_logprobs, an engine argument).
- vllm/exceptions.py: a refused request is a `VLLMValidationError`, a `VLLMClientError` (not a
  ValueError, as it was in 0.26.0).
- The device: vllm/config/device.py `DeviceConfig.device_type` (the platform's) and
  vllm/config/parallel.py `ParallelConfig.world_size`, both on `LLM.llm_engine.vllm_config`
  (vllm/v1/engine/llm_engine.py); the report names CUDA devices by rank (the physical boards,
  after CUDA_VISIBLE_DEVICES, are the action record's `gpus`).
vLLM 0.26.0 (vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl, the GPU host's) has every name above
in the same files: `LLM(**kwargs)` into the EngineArgs dataclass, `max_logprobs` (default 20),
`llm_engine.vllm_config.device_config.device_type`, `parallel_config.world_size`; its
VLLMValidationError derives from ValueError.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Optional

from trtbuild.errors import TrtbuildError
from trtbuild.validate import prompt_logprobs

NEED = "needs vllm on a CUDA GPU"
ARGS_FILE = Path("serving") / "vllm_args.json"
# The engine arguments a smoke load takes from the artifact's serve options; the rest of `vllm
# serve`'s options (host, port, ...) are the server's, not the loader's.
LOAD_OPTIONS = ("quantization", "kv_cache_dtype", "tensor_parallel_size", "pipeline_parallel_size", "max_model_len",
                "dtype", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "trust_remote_code")
BATCH_WINDOWS = 8  # windows per generate() call


def vllm_version() -> Optional[str]:
    """The installed vllm version, from package metadata (no import); None when absent."""
    from trtbuild.host import toolchain

    return toolchain.package_version("vllm")


def available(quant: Optional[str] = None, kv_cache: Optional[str] = None) -> Optional[str]:
    """None when this host has vllm and a visible NVIDIA GPU that vLLM serves the format on, else
    the reason."""
    from trtbuild.validate import trtllm_runner

    problems = []
    if vllm_version() is None:
        problems.append("no vllm")
    if not trtllm_runner._gpu_visible():
        problems.append("no NVIDIA GPU visible")
    if problems:
        return f"{NEED}: this machine has {' and '.join(problems)}"
    return _unserved(quant, kv_cache)


def _unserved(quant: Optional[str], kv_cache: Optional[str]) -> Optional[str]:
    """Why vLLM does not serve the format on this host's GPU, by the serving table
    (trtbuild/facts/serving.py): a load that the table says fails is not run."""
    from trtbuild.host import hardware
    from trtbuild.facts.serving import support

    sm = hardware.detect_gpus()[0].sm
    cell = support("vllm", quant, kv_cache, sm)
    return None if cell.serves else f"vllm does not serve this checkpoint on this machine's {sm} GPU: {cell.reason}"


# --------------------------------------------------------------------------------------------
# Load options
# --------------------------------------------------------------------------------------------

def derived_options(quant: Optional[str], kv_cache: Optional[str], dtype: str, max_seq_len: int) -> dict[str, Any]:
    """The options a packaged checkpoint without serving/vllm_args.json is loaded with, from the
    recipe's values: ModelOpt's loader for a quantized variant (the checkpoint's config names the
    algorithm), an FP8 KV cache when the variant has one, one GPU, the plan's sequence length."""
    return {"quantization": "modelopt" if quant else None, "kv_cache_dtype": "fp8" if kv_cache == "fp8" else "auto",
            "tensor_parallel_size": 1, "max_model_len": int(max_seq_len), "dtype": dtype}


def artifact_options(folder: Path) -> Optional[dict[str, Any]]:
    """The load options of `folder`'s serving/vllm_args.json (a JSON object keyed by `vllm serve`
    option names, `--kv-cache-dtype` or `kv_cache_dtype`), or None when the artifact has none."""
    path = Path(folder) / ARGS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise TrtbuildError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TrtbuildError(f"{path}: expected a JSON object of vllm serve options, got {type(data).__name__}")
    named = {key.lstrip("-").replace("-", "_"): value for key, value in data.items()}
    return {name: named[name] for name in LOAD_OPTIONS if name in named}


def load_options(folder: Path, params: dict) -> tuple[dict[str, Any], str]:
    """(LLM keyword arguments, where they came from): the artifact's serve options when it has
    them, else derived from the recipe's (`params`: quant, kv_cache, dtype, max_seq_len)."""
    options = artifact_options(folder)
    if options is not None:
        origin = str(ARGS_FILE)
    else:
        options = derived_options(params.get("quant"), params.get("kv_cache"), params["dtype"], params["max_seq_len"])
        origin = "derived from the recipe (the artifact has no serving/vllm_args.json)"
    return {k: v for k, v in options.items() if v is not None}, origin


# --------------------------------------------------------------------------------------------
# Requests and outputs as plain data
# --------------------------------------------------------------------------------------------

def llm_arguments(options: dict[str, Any], k: int) -> dict[str, Any]:
    """`LLM` keyword arguments: the load options, and what scoring needs on top of them: token ids
    in and out (no tokenizer), and `max_logprobs` of k, without which vLLM refuses any
    prompt_logprobs above 20."""
    return {**options, "skip_tokenizer_init": True, "max_logprobs": int(k)}


def devices(device_type: str, world_size: int) -> str:
    """The device the engine ran on, as its config says: "cpu" (one process computes every rank), or
    the CUDA devices of ranks 0..world_size-1 by rank. By rank, not by the physical index vLLM's GPU
    worker maps a rank to (CUDA_VISIBLE_DEVICES): the report is part of the artifact, the same on
    every host; which boards those were goes in the action record (`gpus`, devices_used)."""
    if device_type != "cuda":
        return device_type
    return ", ".join(f"cuda:{rank}" for rank in range(world_size))


def sampling(k: int) -> dict[str, Any]:
    """SamplingParams keyword arguments: one token after the window (the least `generate` makes),
    the top k log-probs of every prompt position, no detokenizing (no tokenizer is loaded)."""
    import numpy as np

    if not isinstance(k, (int, np.integer)) or k < 1:
        raise TrtbuildError(f"k must be a positive integer for prompt_logprobs, got {k!r}")
    return {"max_tokens": 1, "prompt_logprobs": int(k), "detokenize": False}


def prompts(windows: np.ndarray) -> list[dict]:
    """One TokensPrompt per window [S, L]."""
    import numpy as np

    windows = np.asarray(windows)
    if windows.ndim != 2 or windows.shape[1] < 2:
        raise TrtbuildError(f"windows: expected token ids [windows, length >= 2], got shape {list(windows.shape)}")
    return [{"prompt_token_ids": [int(x) for x in row]} for row in windows]


def parse_prompt_logprobs(outputs, windows: np.ndarray, k: int,
                          ref_ids: Optional[np.ndarray] = None) -> dict[str, np.ndarray]:
    """The arrays of validate/prompt_logprobs.py from vLLM `RequestOutput`s: `prompt_logprobs` of
    L entries, None first, entry t+1 the distribution after tokens 0..t."""
    windows, result, scored = prompt_logprobs.scored_outputs(outputs, windows, k, ref_ids, "prompt_logprobs",
                                                             "vLLM prompt_logprobs",
                                                             "was SamplingParams.prompt_logprobs set?")
    L = windows.shape[1]
    for i, entries in scored:
        entries = list(entries)
        if len(entries) != L:
            raise TrtbuildError(f"vLLM prompt_logprobs: output {i} has {len(entries)} positions for a window of {L} "
                                "tokens (vLLM returns one per prompt token)")
        if entries[0] is not None:
            raise TrtbuildError(f"vLLM prompt_logprobs: output {i} does not start with None (vLLM's entry t scores "
                                "prompt token t, so the first has no distribution)")
        prompt_logprobs.fill_window(result, i, entries[1:], windows[i], k, ref_ids, "vLLM prompt_logprobs")
    return result


def compare(candidate: dict, ref: dict):
    return prompt_logprobs.compare(candidate, ref, "vLLM")


# --------------------------------------------------------------------------------------------
# Running (GPU host with vllm only)
# --------------------------------------------------------------------------------------------

def run(folder: Path, windows: np.ndarray, ref_ids: np.ndarray, options: dict[str, Any]) -> dict:
    """The packaged checkpoint `folder` loaded by vllm.LLM with `options`, scored on `windows`:
    the arrays of validate/prompt_logprobs.py, plus `llm_arguments` (what LLM was given), `device`
    (what the engine's config says it ran on) and `gpus` (which products those were here; None when
    it ran on no GPU). A call vLLM refuses is one line naming the checkpoint."""
    import numpy as np

    from trtbuild.validate.trtllm_runner import devices_used

    reason = available()
    if reason:
        raise TrtbuildError(f"vLLM validation runner: {reason}")
    from vllm import LLM, SamplingParams

    windows = np.asarray(windows)
    k = int(ref_ids.shape[-1])
    arguments = llm_arguments(options, k)
    with _refusals(f"vLLM {vllm_version()} refused to load {folder} with {arguments}"):
        llm = LLM(model=str(folder), **arguments)
    parts = []
    with _refusals(f"vLLM {vllm_version()} refused the scoring requests for {folder}"):
        params = SamplingParams(**sampling(k))
        for s in range(0, len(windows), BATCH_WINDOWS):
            rows = windows[s:s + BATCH_WINDOWS]
            outs = llm.generate(prompts(rows), params, use_tqdm=False)
            parts.append(parse_prompt_logprobs(outs, rows, k, ref_ids[s:s + BATCH_WINDOWS]))
    config = llm.llm_engine.vllm_config
    device_type, world_size = str(config.device_config.device_type), int(config.parallel_config.world_size)
    del llm
    result = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    result["llm_arguments"] = arguments
    result["device"] = devices(device_type, world_size)
    result["gpus"] = devices_used(world_size) if device_type == "cuda" else None
    return result


@contextlib.contextmanager
def _refusals(what: str):
    """vLLM's refusals of a call (an unknown engine argument, a request it does not allow, a
    checkpoint its loader rejects) as one TrtbuildError line: `what: Type: vLLM's message`."""
    try:
        yield
    except Exception as exc:
        try:
            from vllm.exceptions import VLLMClientError  # 0.33.0; 0.26.0's request errors are ValueErrors
        except ImportError:
            VLLMClientError = ValueError  # noqa: N806
        if not isinstance(exc, (TypeError, ValueError, VLLMClientError)):
            raise
        raise TrtbuildError(" ".join(f"{what}: {type(exc).__name__}: {exc}".split())) from None
