"""Test stand-in for vLLM 0.33.0's offline LLM API (see ../README.md): `LLM(model=folder, ...)` on a
Hugging Face checkpoint folder, `generate` with `prompt_logprobs` in vLLM's output shape."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

__version__ = "0.33.0+standin"

# The engine arguments trtbuild passes (names as vllm/engine/arg_utils.py's EngineArgs has them);
# anything else is refused, as EngineArgs refuses an unknown keyword.
ENGINE_ARGS = {"quantization", "kv_cache_dtype", "tensor_parallel_size", "pipeline_parallel_size", "max_model_len",
               "dtype", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "trust_remote_code",
               "skip_tokenizer_init"}


def _trtllm_standin_llm():
    """The TensorRT-LLM stand-in's LLM class (its checkpoint loading and dequantizing), loaded from
    its file under a private name: `tensorrt_llm` stays unimportable and uninstalled here."""
    path = Path(__file__).resolve().parents[2] / "standin_trtllm" / "tensorrt_llm" / "__init__.py"
    spec = importlib.util.spec_from_file_location("_standin_trtllm_for_vllm", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.LLM


@dataclass
class SamplingParams:
    """The fields of vllm/sampling_params.py that trtbuild sets."""

    max_tokens: Optional[int] = 16
    prompt_logprobs: Optional[int] = None
    detokenize: bool = True


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
        unknown = sorted(set(kwargs) - ENGINE_ARGS)
        if unknown:
            raise TypeError(f"EngineArgs.__init__() got unexpected keyword arguments: {', '.join(unknown)}")
        self.options = dict(kwargs)
        self._model = _trtllm_standin_llm()(model=model)

    def generate(self, prompts: list, sampling_params: SamplingParams, use_tqdm: bool = True) -> list:
        outputs = []
        for i, prompt in enumerate(prompts):
            ids = list(prompt["prompt_token_ids"])
            with torch.no_grad():
                logits = self._model.model(input_ids=torch.tensor(ids)[None]).logits[0].float()  # [L, V]
            k = sampling_params.prompt_logprobs
            entries = _prompt_logprobs(logits, ids, k) if k else None
            outputs.append(RequestOutput(str(i), None, ids, entries, [CompletionOutput(0, "", [int(logits[-1].argmax())])]))
        return outputs

    def __del__(self):
        model = getattr(self, "_model", None)
        if model is not None:
            model.shutdown()
