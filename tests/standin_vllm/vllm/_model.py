"""The model the stand-in computes with: transformers on the CPU in float32, a ModelOpt FP8 export's
weights multiplied back by their scales (activation and KV-cache scales dropped: not emulated).

Its own copy, not the TensorRT-LLM stand-in's loader: that one checks tensorrt_llm's LLM arguments,
which are not vLLM's, and the two stand-ins' rules change independently."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

FP8_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN")  # what the stand-in dequantizes of vLLM's accepted list


class Model:
    def __init__(self, folder: Path, quant_algo: "str | None"):
        from transformers import AutoModelForCausalLM

        self._scratch = None
        weights = folder if quant_algo is None else self._dequantized(folder, quant_algo)
        self.model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32).eval()

    def _dequantized(self, folder: Path, quant_algo: str) -> Path:
        from safetensors.torch import load_file, save_file

        if quant_algo not in FP8_ALGOS:
            raise NotImplementedError(f"vllm stand-in: computing with a {quant_algo} checkpoint is not implemented")
        state = {}
        for path in sorted(folder.glob("*.safetensors")):
            state.update(load_file(str(path)))
        out = {}
        for name, tensor in state.items():
            if name.endswith(("_scale", ".input_scale")):
                continue
            if tensor.dtype == torch.float8_e4m3fn:
                scale = state[name[: -len("weight")] + "weight_scale"].float()
                tensor = tensor.float() * (scale.reshape(-1, 1) if scale.dim() == 1 else scale)
            out[name] = tensor
        self._scratch = tempfile.TemporaryDirectory(prefix="standin-vllm-")
        scratch = Path(self._scratch.name)
        config = json.loads((folder / "config.json").read_text())
        config.pop("quantization_config", None)
        (scratch / "config.json").write_text(json.dumps(config))
        save_file({k: v.contiguous() for k, v in out.items()}, str(scratch / "model.safetensors"))
        return scratch

    def logits(self, ids: list) -> torch.Tensor:
        # STANDIN_VLLM_LOGIT_SCALE (tests only, never real vLLM behaviour): logits multiplied by it, as
        # kernels that compute another distribution would, so a test can make the runtime's gates fail
        # where torch's pass
        scale = float(os.environ.get("STANDIN_VLLM_LOGIT_SCALE", "1"))
        with torch.no_grad():
            return self.model(input_ids=torch.tensor(ids)[None]).logits[0].float() * scale  # [L, V]

    def shutdown(self) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
