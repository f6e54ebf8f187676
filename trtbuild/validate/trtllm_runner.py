"""The TensorRT-LLM runner: a candidate's teacher-forced log-probabilities on the validation windows,
computed by TensorRT-LLM 1.2.x itself (an engine, or a Hugging Face checkpoint on the PyTorch
backend), in the arrays the torch runner produces: `topk_ids` int32 [S, L-1, k], `topk_logp` float32
[S, L-1, k], `target_logp` float32 [S, L-1], where position t is the distribution after tokens
0..t, i.e. the one that predicts token t+1.

It runs only on a GPU host with tensorrt_llm 1.2.x (`available()` says why not); everything but
`to_llm_api` and `run` is plain Python on plain data, so it is tested here without tensorrt_llm.

Two ways to get the numbers out of `LLM.generate` (one request per window, `max_tokens=1`):
- prompt log-probabilities, `SamplingParams(prompt_logprobs=k)`: per prompt position a dict
  {token_id: Logprob(logprob, rank)} of the top k. TensorRT-LLM computes them after the forward
  pass from the request's context logits, in the worker (base_worker._get_logprobs ->
  result.compute_logprobs, log_softmax in float32), so only k numbers per position reach this
  process. Alignment: one dict per prompt token, entry t from the logits row at token t (predicts
  token t+1); the last entry predicts the generated token and is dropped here. Unlike vLLM there is
  no `None` for the first position. In 1.2.0rc2 the dicts hold the top k only, so the actual next
  token's log-prob is known only where it ranks within k (`target_logp` is NaN elsewhere and
  `target_found` False); later versions add the actual next token to each dict (its rank may exceed
  k), which the parser uses when present.
- context logits, `SamplingParams(return_context_logits=True)`: the full [L, V] logits per request
  (`RequestOutput.context_logits`), log-softmaxed here: exact target log-probs, and the candidate's
  log-prob of any token (what metrics.kl_topk needs at the reference's top-k ids), at the price of
  L x V x 4 bytes per window copied to this process (2048 x 128k vocab: 1 GiB), so `run` sends
  windows in small batches.

Cost and which path is used:
- Engines (TensorRT backend, `tensorrt_llm._tensorrt_engine.LLM`): both paths need an engine built
  with `--gather_context_logits`; without it the LLM API refuses prompt_logprobs ("requires
  gather_context_logits=True in the BuildConfig") and has no context logits. The flag reserves a
  logits buffer of about max_num_tokens x vocab x 4 bytes (float32 logits; 8192 x 128k = 4 GiB),
  so it belongs on validation engines only, or the published engine must carry that memory. On this
  backend prompt_logprobs are computed from those same context logits, so they save nothing:
  `run` uses the context-logits path for engines (exact). The logits come in the engine's
  `logits_dtype` (float16 for bf16 checkpoints as the converter writes them) and may be
  vocab-padded (to a multiple of tp); the padding columns are cut before the softmax.
- Hugging Face checkpoints (PyTorch backend, `tensorrt_llm.LLM`): no build flag. prompt_logprobs
  make the executor gather context logits for that request only (SamplingParams._get_output_config
  turns return_context_logits on internally and the worker drops them after the top-k), so only k
  numbers per position travel; but KL(reference || candidate) needs the candidate's log-prob of
  the reference's top-k tokens, and those outside the candidate's own top-k are then unknown (they
  are lumped into the tail: a lower bound, loose on flat distributions). `run` therefore takes the
  context-logits path for both backends by default (exact), and offers prompt_logprobs for
  hf-checkpoints (`path="prompt_logprobs"`: less data moved), where `logp_at_reference` is NaN for
  the lumped tokens (the validate stage reports their share).

TensorRT-LLM source facts used (NVIDIA/TensorRT-LLM, file@commit; b35ac1b6 is 1.2.0rc2 by its
tensorrt_llm/version.py):
- tensorrt_llm/sampling_params.py@b35ac1b64368513d215c57d2ed01d62d910df8da: SamplingParams fields
  `max_tokens` (default 32), `end_id`, `pad_id`, `logprobs`, `prompt_logprobs` ("Number of log
  probabilities to return per prompt token"), `return_context_logits`, `detokenize`; `_validate`
  does `prompt_logprobs and int(prompt_logprobs)` (so 0 means none); `_get_output_config(
  is_pytorch_backend=True)` enables context logits internally for prompt_logprobs.
- tensorrt_llm/executor/base_worker.py@b35ac1b64368513d215c57d2ed01d62d910df8da:
  `_compute_pytorch_prompt_logprobs` calls `compute_logprobs(prompt_logprobs, None,
  context_logits, None, None)` (no prompt tokens: top-k only); the TRT backend calls
  `compute_logprobs(prompt_logprobs, logprobs, context_logits, generation_logits, ...)`.
- tensorrt_llm/executor/result.py@a678b91aafbeff265cd0b764abb59d7def624ac2: `Logprob(logprob, rank)`
  (dataclass, slots), `TokenLogprobs = list[dict[int, Logprob]]`, `CompletionOutput.prompt_logprobs`,
  and `compute_logprobs._topk_logprobs`: squeezes [1, T, V] to [T, V], log_softmax in float32,
  `torch.topk`, one dict per row with ranks 1..k, the actual token added only when `tokens` is given.
- tensorrt_llm/llmapi/llm.py@4c05a74891e4df8066f08ed4ce14b0972abe4e25: `generate(inputs,
  sampling_params)` takes a list of prompts and a list of SamplingParams (one per prompt); the TRT
  backend auto-enables `return_context_logits` for prompt_logprobs (`_prepare_sampling_params`) and
  `_check_arguments` raises unless `build_config.gather_context_logits`; the PyTorch backend skips
  those checks; `RequestOutput` has `prompt_token_ids`, `outputs`, `context_logits`; `class
  LLM(_TorchLLM)` and "use 'from tensorrt_llm._tensorrt_engine import LLM' ... to use the
  TensorRT backend".
- tensorrt_llm/_tensorrt_engine/__init__.py@1620d4fd1b30d9b655b479c0de692486e6af01f4:
  `from tensorrt_llm.llmapi.llm import _TrtLLM as LLM`.
- tensorrt_llm/inputs/data.py@092f84d40074bed61d29dfb2ff6c816922fef753: `TokensPrompt` =
  {"prompt_token_ids": [...]}; `prompt_inputs` passes such a dict through.
- trtllm-bench and the LLM-API tests use `SamplingParams(end_id=-1, pad_id=-1)` with
  `skip_tokenizer_init=True` (unpinned): token ids in, no tokenizer needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from trtbuild.facts import serving
from trtbuild.errors import TrtbuildError
from trtbuild.model.config import read_json_object
from trtbuild.validate import prompt_logprobs

NEEDS = {"engine": "needs tensorrt_llm 1.2.x and an NVIDIA GPU",  # the TensorRT engine backend ends with 1.2
         # the runtime table's first version of the PyTorch backend that serves hf-checkpoints (its trtllm row)
         "hf": f"needs tensorrt_llm (PyTorch backend, {serving.oldest_version('trtllm')} or later) and an NVIDIA GPU"}
PATHS = ("prompt_logprobs", "context_logits")
BATCH_WINDOWS = 8  # windows per generate() call: bounds the context logits held at once


# --------------------------------------------------------------------------------------------
# Availability
# --------------------------------------------------------------------------------------------

def _trtllm_version() -> Optional[str]:
    """The installed tensorrt_llm version, from package metadata (no import); None when absent."""
    from trtbuild.host import toolchain

    return toolchain.package_version("tensorrt_llm")


def _gpu_visible() -> bool:
    """A GPU visible through NVML (hardware.detect_gpus: probed once, no torch import)."""
    from trtbuild.host import hardware

    return bool(hardware.detect_gpus())


def devices_used(world_size: int) -> str:
    """The GPUs TensorRT-LLM runs on, as "cuda:0 (NVIDIA H200, sm90), ...": one rank per GPU on
    this host, rank r on CUDA device r, which CUDA_VISIBLE_DEVICES maps to an NVML index (the
    probe's order otherwise). A device the probe cannot name (a UUID in the variable) is given
    without a name."""
    import os

    from trtbuild.host import hardware

    gpus = {gpu.index: gpu for gpu in hardware.detect_gpus()}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    order = [int(i) if i.strip().isdigit() else None for i in visible.split(",")] if visible else sorted(gpus)
    names = []
    for rank in range(world_size):
        gpu = gpus.get(order[rank]) if rank < len(order) and order[rank] is not None else None
        names.append(f"cuda:{rank} ({gpu.name}, {gpu.sm})" if gpu else f"cuda:{rank}")
    return ", ".join(names)


def engine_world_size(folder: Path) -> int:
    """Ranks of a TensorRT-LLM engine: pretrained_config.mapping.world_size (default 1)."""
    config = read_json_object(Path(folder) / "config.json")
    return int(((config.get("pretrained_config") or {}).get("mapping") or {}).get("world_size", 1))


def _version_fits(version: str, backend: str, series: str) -> bool:
    if backend == "engine":  # the recipe's engine toolchain, e.g. 1.2 for toolchain.tensorrt_llm 1.2.1
        return version == series or version.startswith(series + ".") or version.startswith(series + "rc")
    return serving.at_least_oldest("trtllm", version)


def available(backend: str = "engine", series: str = "1.2") -> Optional[str]:
    """None when this host can run `backend` ("engine": tensorrt_llm of the engines' `series`, 1.2
    by default; "hf": the PyTorch backend of tensorrt_llm, of the runtime table's oldest version or
    a later one) on a visible GPU, else the reason."""
    problems = []
    version = _trtllm_version()
    if version is None:
        problems.append("no tensorrt_llm")
    elif not _version_fits(version, backend, series):
        problems.append(f"tensorrt_llm {version}")
    if not _gpu_visible():
        problems.append("no NVIDIA GPU visible")
    if problems:
        need = NEEDS[backend].replace("1.2.x", f"{series}.x")
        return f"{need} (this machine: {', '.join(problems)})"
    return None


# --------------------------------------------------------------------------------------------
# Requests as plain data
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LogprobRequest:
    """One window for `LLM.generate`: the prompt as token ids and the SamplingParams keyword
    arguments (field names as in tensorrt_llm/sampling_params.py@b35ac1b6)."""

    prompt_token_ids: list
    sampling: dict = field(default_factory=dict)


def build_requests(windows: np.ndarray, k: int, *, path: str = "prompt_logprobs",
                   end_id: Optional[int] = -1) -> list[LogprobRequest]:
    """One request per window [S, L]: generate one token (`max_tokens=1`, the least the LLM API
    allows) after the whole window, with `prompt_logprobs=k` or `return_context_logits=True`.
    `end_id`/`pad_id` -1 (as trtllm-bench does) let the LLM run without a tokenizer; pass None to
    let it take the tokenizer's."""
    import numpy as np

    windows = np.asarray(windows)
    if windows.ndim != 2 or windows.shape[1] < 2:
        raise TrtbuildError(f"windows: expected token ids [windows, length >= 2], got shape {list(windows.shape)}")
    if not np.issubdtype(windows.dtype, np.integer):
        raise TrtbuildError(f"windows: expected integer token ids, got {windows.dtype}")
    if path not in PATHS:
        raise TrtbuildError(f"path {path!r}: expected one of {', '.join(PATHS)}")
    if path == "prompt_logprobs" and (not isinstance(k, (int, np.integer)) or k < 1):
        raise TrtbuildError(f"k must be a positive integer for prompt_logprobs (0 means none), got {k!r}")
    sampling: dict[str, Any] = {"max_tokens": 1}
    if path == "prompt_logprobs":
        sampling["prompt_logprobs"] = int(k)
    else:
        sampling["return_context_logits"] = True
    if end_id is not None:
        sampling["end_id"] = int(end_id)
        sampling["pad_id"] = int(end_id)
    sampling["detokenize"] = False
    return [LogprobRequest([int(x) for x in row], dict(sampling)) for row in windows]


def to_llm_api(requests: Sequence[LogprobRequest]) -> tuple[list, list]:
    """(inputs, sampling_params) for `LLM.generate`: TokensPrompt dicts and one
    tensorrt_llm.SamplingParams per request. Imports tensorrt_llm, so only where it is installed."""
    if _trtllm_version() is None:
        raise TrtbuildError("TensorRT-LLM validation runner: no tensorrt_llm installed")
    from tensorrt_llm import SamplingParams

    inputs = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in requests]
    return inputs, [SamplingParams(**r.sampling) for r in requests]


# --------------------------------------------------------------------------------------------
# Parsing RequestOutput objects
# --------------------------------------------------------------------------------------------

def parse_prompt_logprobs(outputs, windows: np.ndarray, k: int,
                          ref_ids: Optional[np.ndarray] = None) -> dict[str, np.ndarray]:
    """The arrays of the module docstring from `RequestOutput`s of the prompt_logprobs path
    (`outputs[i].outputs[0].prompt_logprobs`: a list of L dicts {token_id: Logprob}). Fewer than k
    entries at a position leave id -1 and log-prob -inf; the actual next token's log-prob is NaN
    (and `target_found` False) where TensorRT-LLM did not return it. With the reference's top-k ids
    [S, L-1, k'], `logp_at_reference` holds the candidate's log-prob of each (NaN where the
    candidate did not return that token)."""
    import numpy as np

    windows = np.asarray(windows)
    S, L = windows.shape
    outputs = prompt_logprobs.check_outputs(outputs, windows, "prompt_logprobs")
    result = prompt_logprobs.empty(S, L - 1, k, ref_ids)
    for i, out in enumerate(outputs):
        completions = getattr(out, "outputs", None) or []
        entries = getattr(completions[0], "prompt_logprobs", None) if completions else None
        if not entries:
            raise TrtbuildError(f"prompt_logprobs: output {i} has none (was SamplingParams.prompt_logprobs set, "
                                f"and on an engine, was it built with --gather_context_logits?)")
        if entries[0] is None:
            raise TrtbuildError(f"prompt_logprobs: output {i} starts with None (vLLM's convention, entry t scoring "
                                f"token t); TensorRT-LLM's entry t is the distribution after token t")
        if len(entries) != L:
            raise TrtbuildError(f"prompt_logprobs: output {i} has {len(entries)} positions for a window of {L} tokens "
                                f"(TensorRT-LLM returns one per prompt token)")
        prompt_logprobs.fill_window(result, i, entries[:L - 1], windows[i], k, ref_ids, "prompt_logprobs")
    return result


def parse_context_logits(outputs, windows: np.ndarray, k: int, vocab_size: Optional[int] = None,
                         ref_ids: Optional[np.ndarray] = None) -> dict[str, np.ndarray]:
    """The arrays of the module docstring from `RequestOutput.context_logits` ([L, V] per request,
    or [1, L, V]); `vocab_size` cuts the engine's vocab padding off before the softmax. With the
    reference's top-k ids, `logp_at_reference` holds the candidate's exact log-prob of each."""
    import numpy as np

    from trtbuild.validate.metrics import topk_reference

    windows, result, scored = prompt_logprobs.scored_outputs(
        outputs, windows, k, ref_ids, "context_logits", "context_logits",
        "was SamplingParams.return_context_logits set, and on an engine, was it built with --gather_context_logits?")
    L = windows.shape[1]
    for i, logits in scored:
        rows = _to_numpy(logits)
        if rows.ndim == 3 and rows.shape[0] == 1:
            rows = rows[0]
        if rows.ndim != 2 or rows.shape[0] != L:
            raise TrtbuildError(f"context_logits: output {i} has shape {list(rows.shape)}, expected [{L}, vocab] "
                                f"for a window of {L} tokens")
        if vocab_size is not None:
            if rows.shape[1] < vocab_size:
                raise TrtbuildError(f"context_logits: output {i} has {rows.shape[1]} logits per position, fewer than "
                                    f"the vocabulary ({vocab_size})")
            rows = rows[:, :vocab_size]
        rows = rows[:-1].astype(np.float64)  # the last row predicts the generated token
        logp = rows - rows.max(axis=-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(axis=-1, keepdims=True))
        kk = min(k, logp.shape[1])
        ids, values = topk_reference(logp, kk)
        result["topk_ids"][i, :, :kk] = ids
        result["topk_logp"][i, :, :kk] = values
        result["target_logp"][i] = logp[np.arange(L - 1), windows[i, 1:]]
        result["target_found"][i] = True
        if ref_ids is not None:
            result["logp_at_reference"][i] = np.take_along_axis(logp, ref_ids[i].astype(np.int64), axis=-1)
        del rows, logp
    return result


def _to_numpy(tensor) -> np.ndarray:
    import numpy as np

    if hasattr(tensor, "detach"):  # torch.Tensor (on the GPU, or in float16/bfloat16)
        return tensor.detach().float().cpu().numpy()
    return np.asarray(tensor, dtype=np.float32)


# --------------------------------------------------------------------------------------------
# Running (GPU host only)
# --------------------------------------------------------------------------------------------

def run(folder: Path, windows: np.ndarray, ref_ids: np.ndarray, backend: str, path: str = "context_logits") -> dict:
    """The candidate's teacher-forced log-probs on the reference's windows: the arrays of the module
    docstring plus `logp_at_reference` (the candidate's log-prob of each of the reference's top-k
    tokens, NaN where unknown), `path`, `device` (the CUDA devices by rank; `cpu` for a stand-in) and
    `gpus` (which products those were here, `devices_used`; None for a stand-in). `folder`
    is an engine dir (backend "engine", TensorRT backend) or a Hugging Face checkpoint dir (backend
    "hf", PyTorch backend).

    The default context-logits path is exact. "prompt_logprobs" (PyTorch backend only) moves k
    numbers per position instead of the vocabulary, but the reference's top-k tokens missing from
    the candidate's are lumped into the KL tail: still a lower bound, and a loose one where the
    candidate's distribution is flat (measured on a random tiny model: 0.009 against an exact
    0.12 with 87% lumped), so a gate should not rely on it; windows missing an actual next token
    are re-run through the context-logits path."""
    import numpy as np

    if backend not in NEEDS:
        raise TrtbuildError(f"backend {backend!r}: expected 'engine' or 'hf'")
    if path not in PATHS or (path == "prompt_logprobs" and backend == "engine"):
        raise TrtbuildError(f"path {path!r}: engines use context_logits (their prompt log-probs are computed from "
                            "the same gathered logits); hf-checkpoints take context_logits or prompt_logprobs")
    reason = available(backend)
    if reason:
        raise TrtbuildError(f"TensorRT-LLM validation runner: {reason}")
    folder = Path(folder)
    windows = np.asarray(windows)
    k = int(ref_ids.shape[-1])
    if backend == "engine":
        config = read_json_object(folder / "config.json")
        if not (config.get("build_config") or {}).get("gather_context_logits"):
            raise TrtbuildError(f"{folder}: the engine was built without --gather_context_logits, so TensorRT-LLM "
                                "returns no prompt logits to validate it with (validate.engines: twin or published "
                                "builds one with it)")
        from tensorrt_llm._tensorrt_engine import LLM

        vocab = (config.get("pretrained_config") or {}).get("vocab_size")
        world_size = engine_world_size(folder)
    else:
        from tensorrt_llm import LLM

        vocab = read_json_object(folder / "config.json").get("vocab_size")
        world_size = 1  # LLM(model=...) without tensor_parallel_size: one GPU
    llm = LLM(model=str(folder), skip_tokenizer_init=True)
    try:
        def generate(rows: np.ndarray, how: str) -> dict[str, np.ndarray]:
            inputs, params = to_llm_api(build_requests(windows[rows], k, path=how))
            outs = llm.generate(inputs, params, use_tqdm=False)
            if how == "prompt_logprobs":
                return parse_prompt_logprobs(outs, windows[rows], k, ref_ids[rows])
            return parse_context_logits(outs, windows[rows], k, vocab, ref_ids[rows])

        everything = np.arange(len(windows))
        parts = [generate(everything[s:s + BATCH_WINDOWS], path) for s in range(0, len(windows), BATCH_WINDOWS)]
        result = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
        missing = np.flatnonzero(~result["target_found"].all(axis=1))
        for s in range(0, len(missing), BATCH_WINDOWS):
            rows = missing[s:s + BATCH_WINDOWS]
            exact = generate(rows, "context_logits")
            for key in result:
                result[key][rows] = exact[key]
    finally:
        llm.shutdown()
    result["path"] = path
    from trtbuild.host import toolchain

    if toolchain.is_standin_version(toolchain.package_version("tensorrt_llm")):
        # A stand-in computes with torch on this host's CPU: say so. TensorRT-LLM's LLM API has no
        # device to ask (it runs on CUDA only), so the stand-in's label is what tells them apart.
        result["device"], result["gpus"] = "cpu", None
    else:
        result["device"] = cuda_devices(world_size)  # by rank: the same on every host
        result["gpus"] = devices_used(world_size)  # the products: a fact of this host, for the action record
    return result


def cuda_devices(world_size: int) -> str:
    """The CUDA devices TensorRT-LLM runs `world_size` ranks on, by rank: rank r on device r (each
    worker sets device `global_rank % torch.cuda.device_count()`: NVIDIA/TensorRT-LLM
    tensorrt_llm/executor/base_worker.py@b35ac1b64368513d215c57d2ed01d62d910df8da,
    `BaseWorker._get_comm_ranks_device_id`)."""
    return ", ".join(f"cuda:{rank}" for rank in range(world_size))


def compare(candidate: dict, ref: dict):
    """metrics.Comparison of the runner's arrays against the reference artifact's."""
    return prompt_logprobs.compare(candidate, ref, "TensorRT-LLM")
