"""Test stand-in for the TensorRT engine backend's `LLM`: an "engine dir" here is a folder with the
engine config.json (pretrained_config, build_config, and `standin.vocab_pad`: the padding columns
a tp > 1 engine's logits carry) and the Hugging Face weights it stands for in hf/. Like tensorrt_llm 1.2 (llmapi/llm.py@4c05a748 _check_arguments), it refuses prompt logits
unless the engine was built with gather_context_logits; logits come in float16, vocab-padded."""

from __future__ import annotations

import json

import torch

from tensorrt_llm import LLM as _TorchLLM


class LLM(_TorchLLM):
    logits_dtype = torch.float16

    def _weights(self):
        config = json.loads((self.folder / "config.json").read_text())
        self.gather = bool(config["build_config"].get("gather_context_logits"))
        self.vocab_pad = int(config.get("standin", {}).get("vocab_pad", 0))
        return self.folder / "hf"

    def _check(self, params) -> None:
        if (params.prompt_logprobs or params.return_context_logits) and not self.gather:
            raise ValueError("`prompt_logprobs` requires `gather_context_logits=True` in the BuildConfig")
