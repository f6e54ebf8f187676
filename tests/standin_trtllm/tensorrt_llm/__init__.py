"""Test stand-in for tensorrt_llm's LLM API (see ../README.md): the PyTorch-backend `LLM` serving a
Hugging Face checkpoint folder, with the output objects and the prompt_logprobs behaviour of
tensorrt_llm 1.2.0rc2 (executor/result.py@a678b91a: top-k dicts only, one per prompt token)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

__version__ = "1.2.0+standin"


@dataclass
class SamplingParams:
    """The fields of tensorrt_llm/sampling_params.py@b35ac1b6 that trtbuild sets."""

    max_tokens: int = 32
    end_id: Optional[int] = None
    pad_id: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    return_context_logits: bool = False
    detokenize: bool = True


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: Optional[int] = None


@dataclass
class CompletionOutput:
    index: int
    token_ids: list = field(default_factory=list)
    prompt_logprobs: list = field(default_factory=list)


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list
    outputs: list
    context_logits: Optional[torch.Tensor] = None


def _topk_dicts(logits: torch.Tensor, k: int) -> list:
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    values, ids = torch.topk(logprobs, k=min(k, logprobs.shape[-1]), dim=-1)
    return [{int(i): Logprob(float(v), r + 1) for r, (v, i) in enumerate(zip(values[t], ids[t]))}
            for t in range(logprobs.shape[0])]


class LLM:
    """`LLM(model=folder, skip_tokenizer_init=True)` on a Hugging Face checkpoint folder."""

    vocab_pad = 0  # the engine stand-in pads the vocabulary as a tp > 1 engine would
    logits_dtype = torch.float32

    def __init__(self, model: str, skip_tokenizer_init: bool = False, **kwargs: Any):
        from transformers import AutoModelForCausalLM

        self.folder = Path(model)
        self.model = AutoModelForCausalLM.from_pretrained(self._weights(), dtype=torch.float32).eval()
        self.closed = False

    def _weights(self) -> Path:
        if (self.folder / "hf_quant_config.json").is_file():
            return self._dequantized()
        return self.folder

    def _dequantized(self) -> Path:
        """A ModelOpt Hugging Face export (FP8, or W8A16 per channel) with its weights multiplied
        back by their scales, in a temporary folder: what the stand-in computes with. Activation and
        KV-cache scales are dropped (the stand-in does not emulate them); other formats are refused."""
        import json
        import tempfile

        from safetensors.torch import load_file, save_file

        algo = json.loads((self.folder / "hf_quant_config.json").read_text())["quantization"]["quant_algo"]
        if algo not in ("FP8", "W8A16"):
            raise ValueError(f"the stand-in PyTorch backend serves no {algo} checkpoint")
        state = {}
        for path in sorted(self.folder.glob("*.safetensors")):
            state.update(load_file(str(path)))
        out = {}
        for name, tensor in state.items():
            if name.endswith(("_scale", ".input_scale")):
                continue
            if tensor.dtype in (torch.int8, torch.float8_e4m3fn):
                scale = state[name[: -len("weight")] + "weight_scale"].float()
                tensor = tensor.float() * (scale[:, None] if scale.dim() == 1 else scale)
            out[name] = tensor
        self._scratch = tempfile.TemporaryDirectory(prefix="standin-hf-")
        folder = Path(self._scratch.name)
        config = json.loads((self.folder / "config.json").read_text())
        config.pop("quantization_config", None)
        (folder / "config.json").write_text(json.dumps(config))
        save_file({k: v.contiguous() for k, v in out.items()}, str(folder / "model.safetensors"))
        return folder

    def _check(self, params: SamplingParams) -> None:
        pass

    def generate(self, inputs: list, sampling_params: list, use_tqdm: bool = True) -> list:
        if self.closed:
            raise RuntimeError("LLM was shut down")
        outputs = []
        for i, (prompt, params) in enumerate(zip(inputs, sampling_params)):
            self._check(params)
            ids = torch.tensor(prompt["prompt_token_ids"])[None]
            with torch.no_grad():
                logits = self.model(input_ids=ids).logits[0].float()  # [L, V]
            generated = int(logits[-1].argmax())
            completion = CompletionOutput(0, [generated], _topk_dicts(logits, params.prompt_logprobs)
                                          if params.prompt_logprobs else [])
            context = None
            if params.return_context_logits:
                context = torch.cat([logits, torch.zeros(logits.shape[0], self.vocab_pad)], dim=1).to(self.logits_dtype)
            outputs.append(RequestOutput(i, list(prompt["prompt_token_ids"]), [completion], context))
        return outputs

    def shutdown(self) -> None:
        self.closed = True
        if getattr(self, "_scratch", None) is not None:
            self._scratch.cleanup()
