"""Test stand-in for tensorrt_llm's LLM API (see ../README.md): the PyTorch-backend `LLM` serving a
Hugging Face checkpoint folder, with the output objects and the prompt_logprobs behaviour of
tensorrt_llm 1.2.0rc2 (executor/result.py@a678b91a: top-k dicts only, one per prompt token)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from tensorrt_llm import _llm_args

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


class StandinRefusal(NotImplementedError):
    """A call the real LLM API may accept but this stand-in does not emulate: it says so, naming itself."""

    def __init__(self, what: str) -> None:
        super().__init__(f"tensorrt_llm {__version__} (a test stand-in): {what}")


class LLM:
    """`LLM(model=folder, skip_tokenizer_init=True)` on a Hugging Face checkpoint folder. Keyword
    arguments are checked as tensorrt_llm 1.2's are (_llm_args.py says where from): an unknown one,
    or one only the TensorRT backend takes, raises the real ValueError; a real one the stand-in does
    not emulate, or an explicit argument away from its default, raises StandinRefusal."""

    vocab_pad = 0  # the engine stand-in pads the vocabulary as a tp > 1 engine would
    logits_dtype = torch.float32
    _fields = _llm_args.TORCH_FIELDS

    def __init__(self, model: str, tokenizer=None, tokenizer_mode: str = "auto", skip_tokenizer_init: bool = False,
                 trust_remote_code: bool = False, tensor_parallel_size: int = 1, dtype: str = "auto",
                 revision=None, tokenizer_revision=None, **kwargs: Any):
        self.closed = True  # until the model is loaded: shutdown() and __del__ have nothing to free
        self._check_kwargs(kwargs)
        explicit = {"tokenizer": tokenizer, "tokenizer_mode": tokenizer_mode, "trust_remote_code": trust_remote_code,
                    "tensor_parallel_size": tensor_parallel_size, "dtype": dtype, "revision": revision,
                    "tokenizer_revision": tokenizer_revision}
        for name, value in {**explicit, **kwargs}.items():
            if value != _llm_args.EXPLICIT.get(name, object()):
                raise StandinRefusal(f"LLM({name}={value!r}) is not emulated")
        if not model:  # llm_args._ModelWrapper
            raise ValueError("model should be provided.")
        if skip_tokenizer_init is not True:
            raise StandinRefusal("LLM(skip_tokenizer_init=False) is not emulated: the stand-in loads no tokenizer")
        self.folder = Path(model)
        if not self.folder.is_dir():
            raise StandinRefusal(f"model {model!r} is not a local folder (the stand-in downloads nothing)")
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(self._weights(), dtype=torch.float32).eval()
        self.closed = False

    def _check_kwargs(self, kwargs: dict) -> None:
        """_TorchLLM.__init__ then BaseLLM.__init__ (llm.py@4c05a748)."""
        kwargs.pop("backend", "pytorch")
        _llm_args.check_torch_kwargs(kwargs)
        _llm_args.check_kwargs(type(self).__name__, self._fields, kwargs)

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
