"""Test stand-in for vLLM 0.33.0's offline LLM API (see ../README.md): `LLM(model=folder, ...)` on a
Hugging Face checkpoint folder, `generate` with `prompt_logprobs` in vLLM's output shape, computed
on the CPU (and saying so).

It refuses what vLLM refuses, in vLLM's words, for each rule below; every rule is read from the PyPI
wheel vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl (sha256 4b6bdec4ab269990bf70d45a3c1e94c3
760a27064513760193b26d6f0da883aa), path given, and checked against vllm-0.26.0-cp38-abi3-
manylinux_2_28_x86_64.whl (sha256 adb1e4c9b46d0dfdb094121ae5aad670a42412dd813ed4e5db069ed6a15006de),
the version the GPU host runs, where it says "(0.26.0: same)":

- Unknown engine arguments. vllm/entrypoints/llm.py `LLM.__init__(model, *, ..., **kwargs)` passes
  its keyword arguments on as `EngineArgs(model=model, ..., **kwargs)`, and vllm/engine/arg_utils.py
  declares `EngineArgs` a `@dataclass`: a name it lacks is Python's own TypeError
  "EngineArgs.__init__() got an unexpected keyword argument 'x'" (0.26.0: same). The stand-in's
  EngineArgs is a dataclass of that name holding only the arguments it implements, so it refuses
  the others the same way: stricter than vLLM, never looser.
- `max_logprobs`: vllm/config/model.py `ModelConfig.max_logprobs: int = Field(default=20, ge=-1)`,
  -1 meaning the vocabulary size (0.26.0: same); EngineArgs.max_logprobs defaults to it.
  vllm/sampling_params.py `SamplingParams._validate_logprobs`, run for every request by
  vllm/v1/engine/input_processor.py: prompt_logprobs (-1: the vocabulary) above max_logprobs raises
  `VLLMValidationError("Requested prompt logprobs of {n}, which is greater than max allowed: {max}",
  parameter="prompt_logprobs", value=n)`; `_verify_args`: prompt_logprobs below -1 and max_tokens
  below 1 are refused when the SamplingParams is made (0.26.0: same messages).
- ModelOpt checkpoints. vllm/transformers_utils/config.py: the quantization config is config.json's
  `quantization_config`, else hf_quant_config.json. vllm/config/model.py `_verify_quantization`: a
  ModelOpt config whose algorithm has an override (modelopt.py `override_quantization_method`:
  FP8 -> modelopt, *FP4* -> modelopt_fp4, *MXFP8* -> modelopt_mxfp8, MIXED_PRECISION ->
  modelopt_mixed) is loaded by that method whatever the `quantization` argument says; otherwise an
  argument other than the config's quant_method is refused. vllm/model_executor/layers/quantization/modelopt.py `ModelOptQuantConfigBase.from_config`:
  no quant_algo, or one outside QUANT_ALGOS, is refused (0.26.0: same list, same message). An
  unquantized checkpoint loaded with `quantization="modelopt"`: vllm/model_executor/model_loader/
  weight_utils.py `get_quant_config` finds no hf_quant_config.json, "Cannot find the config file
  for modelopt".
- The device. vllm/config/device.py `DeviceConfig.device_type` (the platform's, from
  vllm/platforms) and vllm/config/parallel.py `ParallelConfig.world_size` (pp x tp x pcp), reached as
  `LLM.llm_engine.vllm_config` (vllm/v1/engine/llm_engine.py) (0.26.0: same): here "cpu", the device
  the stand-in computes on.

What it does not model (so a call it accepts may still fail on vLLM): prompts longer than
max_model_len, engine argument values (kv_cache_dtype, dtype names), quantization methods other than
ModelOpt's (refused here as not implemented), GPU memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from pydantic import Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from ._model import Model
from .exceptions import VLLMValidationError

__version__ = "0.33.0+standin"

# vllm/model_executor/layers/quantization/modelopt.py: QUANT_ALGOS = [*LINEAR_ALGOS, "MIXED_PRECISION"]
QUANT_ALGOS = ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "MXFP8", "MIXED_PRECISION"]


@dataclass
class EngineArgs:
    """The engine arguments the stand-in implements (names and defaults of vllm/engine/arg_utils.py's
    EngineArgs; LLM's own default for gpu_memory_utilization). A dataclass, as vLLM's is: any other
    keyword is Python's TypeError, worded as vLLM's."""

    model: str
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    dtype: str = "auto"
    quantization: Optional[str] = None
    kv_cache_dtype: str = "auto"
    max_model_len: Optional[int] = None
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    gpu_memory_utilization: float = 0.92
    max_logprobs: int = 20
    seed: int = 0
    enforce_eager: bool = False
    disable_log_stats: bool = True


@pydantic_dataclass
class ModelConfig:
    """The ModelConfig fields the stand-in checks: pydantic validates them, as vLLM's config does."""

    model: str
    vocab_size: int
    max_logprobs: int = Field(default=20, ge=-1)
    quantization: Optional[str] = None

    def get_vocab_size(self) -> int:
        return self.vocab_size


@dataclass
class DeviceConfig:
    device_type: str


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    @property
    def world_size(self) -> int:
        return self.pipeline_parallel_size * self.tensor_parallel_size


@dataclass
class VllmConfig:
    model_config: ModelConfig
    device_config: DeviceConfig
    parallel_config: ParallelConfig


@dataclass
class LLMEngine:
    vllm_config: VllmConfig


class SamplingParams:
    """The fields of vllm/sampling_params.py that trtbuild sets, with `_verify_args`' checks of them."""

    def __init__(self, max_tokens: Optional[int] = 16, prompt_logprobs: Optional[int] = None,
                 detokenize: bool = True) -> None:
        self.max_tokens, self.prompt_logprobs, self.detokenize = max_tokens, prompt_logprobs, detokenize
        if max_tokens is not None and max_tokens < 1:
            raise VLLMValidationError(f"max_tokens must be at least 1, got {max_tokens}.", parameter="max_tokens",
                                      value=max_tokens)
        if prompt_logprobs is not None and prompt_logprobs != -1 and prompt_logprobs < 0:
            raise VLLMValidationError(f"prompt_logprobs must be non-negative or -1, got {prompt_logprobs}.",
                                      parameter="prompt_logprobs", value=prompt_logprobs)

    def verify(self, model_config: ModelConfig) -> None:
        """`_validate_logprobs`' check of prompt_logprobs."""
        max_logprobs = model_config.max_logprobs
        if max_logprobs == -1:
            max_logprobs = model_config.get_vocab_size()
        if num := self.prompt_logprobs:
            if num == -1:
                num = model_config.get_vocab_size()
            if num > max_logprobs:
                raise VLLMValidationError(f"Requested prompt logprobs of {num}, which is greater than max allowed: "
                                          f"{max_logprobs}", parameter="prompt_logprobs", value=num)


@dataclass
class Logprob:
    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list = field(default_factory=list)


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list
    prompt_logprobs: Optional[list]
    outputs: list
    finished: bool = True


def _quant_config(folder: Path) -> Optional[dict]:
    """config.json's quantization_config, else hf_quant_config.json (vllm/transformers_utils/config.py)."""
    config = json.loads((folder / "config.json").read_text())
    if config.get("quantization_config") is not None:
        return config["quantization_config"]
    path = folder / "hf_quant_config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _modelopt_algo(cfg: dict) -> str:
    """modelopt.py `_extract_modelopt_quant_algo`: upper-cased, from `quantization` or the top level."""
    inner = cfg.get("quantization")
    return str((inner if isinstance(inner, dict) else cfg).get("quant_algo", "")).upper()


def _verify_quantization(folder: Path, quantization: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """(the method vLLM loads `folder` with, the ModelOpt algorithm), or vLLM's refusal (see the
    module's docstring)."""
    cfg = _quant_config(folder)
    if cfg is None:
        if quantization is None:
            return None, None
        if quantization.startswith("modelopt"):
            raise ValueError(f"Cannot find the config file for {quantization}")
        raise NotImplementedError(f"vllm stand-in: online quantization ({quantization}) is not implemented")
    method = str(cfg.get("quant_method", ""))
    if not method.lower().startswith("modelopt"):
        raise NotImplementedError(f"vllm stand-in: only ModelOpt checkpoints are implemented, not {method!r}")
    algo = _modelopt_algo(cfg)
    override = ("modelopt" if algo == "FP8" else "modelopt_fp4" if "NVFP4" in algo or "FP4" in algo
                else "modelopt_mxfp8" if "MXFP8" in algo else "modelopt_mixed" if algo == "MIXED_PRECISION" else None)
    if override is None and quantization is not None and quantization != method:  # an override replaces the argument
        raise ValueError(f"Quantization method specified in the model config ({method}) does not match the "
                         f"quantization method specified in the `quantization` argument ({quantization}).")
    resolved = override or method
    if not algo:
        raise ValueError("Missing 'quant_algo' in quantization config")
    if algo not in QUANT_ALGOS:
        raise ValueError(f"ModelOpt currently only supports: {QUANT_ALGOS} quantizations in vLLM. Please check the "
                         "`hf_quant_config.json` file for your model's quant configuration.")
    return resolved, algo


def _prompt_logprobs(logits: torch.Tensor, prompt: list, k: int) -> list:
    """vLLM's shape: None, then per prompt token t >= 1 the top k of the distribution after tokens
    0..t-1, plus token t itself with its rank."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    entries: list = [None]
    for t in range(1, len(prompt)):
        row = logprobs[t - 1]
        values, ids = torch.topk(row, k=min(k, row.shape[-1]))
        entry = {int(i): Logprob(float(v), r + 1) for r, (v, i) in enumerate(zip(values, ids))}
        token = int(prompt[t])
        if token not in entry:
            entry[token] = Logprob(float(row[token]), int((row > row[token]).sum()) + 1)
        entries.append(entry)
    return entries


class LLM:
    def __init__(self, model: str, **kwargs: Any):
        args = EngineArgs(model=model, **kwargs)
        folder = Path(model)
        vocab = int(json.loads((folder / "config.json").read_text())["vocab_size"])
        quantization, algo = _verify_quantization(folder, args.quantization)
        self.llm_engine = LLMEngine(VllmConfig(
            ModelConfig(model=model, vocab_size=vocab, max_logprobs=args.max_logprobs, quantization=quantization),
            DeviceConfig("cpu"), ParallelConfig(args.tensor_parallel_size, args.pipeline_parallel_size)))
        self._model = Model(folder, algo)

    def generate(self, prompts: list, sampling_params: SamplingParams, use_tqdm: bool = True) -> list:
        sampling_params.verify(self.llm_engine.vllm_config.model_config)  # every request, before any runs
        outputs = []
        for i, prompt in enumerate(prompts):
            ids = list(prompt["prompt_token_ids"])
            logits = self._model.logits(ids)
            k = sampling_params.prompt_logprobs
            if k == -1:
                k = logits.shape[-1]
            entries = _prompt_logprobs(logits, ids, k) if k else None
            outputs.append(RequestOutput(str(i), None, ids, entries, [CompletionOutput(0, "", [int(logits[-1].argmax())])]))
        return outputs

    def __del__(self):
        model = getattr(self, "_model", None)
        if model is not None:
            model.shutdown()
