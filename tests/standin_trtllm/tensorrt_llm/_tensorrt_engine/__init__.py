"""Test stand-in for the TensorRT engine backend's `LLM`. An engine dir is what the stand-in
`trtllm-build` (../../bin/trtllm-build) writes: the engine config.json (pretrained_config,
build_config, `standin.vocab_pad`: the padding columns a tp > 1 engine's logits carry) and
rank{N}.engine files holding each rank's dequantized weights, which are joined back into the Hugging
Face model (LLaMA family) with trtbuild's own inverse of the TensorRT-LLM layout. A folder with the
Hugging Face weights in hf/ (what tests/test_trtllm_stage.py makes by hand) is read directly.
Like tensorrt_llm 1.2 (llmapi/llm.py@4c05a748 _check_arguments), it refuses prompt logits unless
the engine was built with gather_context_logits; logits come in float16, vocab-padded."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from tensorrt_llm import LLM as _TorchLLM
from tensorrt_llm import _llm_args


def hf_config_of(pretrained: dict) -> dict:
    """The Hugging Face config a LLaMA-family engine's pretrained_config stands for."""
    if pretrained["architecture"] not in ("LlamaForCausalLM", "MistralForCausalLM"):
        raise ValueError(f"the stand-in engine runs LLaMA-family models only, not {pretrained['architecture']}")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": pretrained["hidden_size"], "intermediate_size": pretrained["intermediate_size"],
              "num_hidden_layers": pretrained["num_hidden_layers"],
              "num_attention_heads": pretrained["num_attention_heads"],
              "num_key_value_heads": pretrained.get("num_key_value_heads", pretrained["num_attention_heads"]),
              "vocab_size": pretrained["vocab_size"], "max_position_embeddings": pretrained["max_position_embeddings"],
              "rms_norm_eps": pretrained.get("norm_epsilon", 1e-5), "rope_theta": pretrained.get("rotary_base", 10000.0),
              "head_dim": pretrained.get("head_size", pretrained["hidden_size"] // pretrained["num_attention_heads"]),
              "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": pretrained["dtype"]}
    if pretrained.get("rotary_scaling"):
        config["rope_scaling"] = pretrained["rotary_scaling"]
    return config


class _TrtLLM(_TorchLLM):
    """Named as the real one is (tensorrt_llm/_tensorrt_engine/__init__.py@1620d4fd: `from
    tensorrt_llm.llmapi.llm import _TrtLLM as LLM`), so its errors name `_TrtLLM` too."""

    logits_dtype = torch.float16
    _fields = _llm_args.TRT_FIELDS

    def _check_kwargs(self, kwargs: dict) -> None:
        """_TrtLLM.__init__ passes every keyword to BaseLLM.__init__ (llm.py@4c05a748)."""
        _llm_args.check_kwargs(type(self).__name__, self._fields, kwargs)

    def _weights(self):
        config = json.loads((self.folder / "config.json").read_text())
        self.gather = bool(config["build_config"].get("gather_context_logits"))
        self.vocab_pad = int(config.get("standin", {}).get("vocab_pad", 0))
        if (self.folder / "hf").is_dir():
            return self.folder / "hf"
        return self._rebuild(config["pretrained_config"])

    def _rebuild(self, pretrained: dict) -> Path:
        """The engine's ranks joined into a Hugging Face folder (temporary, removed at shutdown)."""
        from safetensors.torch import save_file

        from trtbuild.checkpoint.trtllm_inverse import trtllm_to_hf_state

        self._scratch = tempfile.TemporaryDirectory(prefix="standin-engine-")
        scratch = Path(self._scratch.name)
        checkpoint = scratch / "checkpoint"
        checkpoint.mkdir()
        unquantized = {**pretrained, "quantization": {"quant_algo": None, "kv_cache_quant_algo": None}}
        (checkpoint / "config.json").write_text(json.dumps(unquantized))
        world = int(pretrained["mapping"].get("world_size", 1))
        for rank in range(world):
            (checkpoint / f"rank{rank}.safetensors").symlink_to(self.folder / f"rank{rank}.engine")
        hf_config = hf_config_of(pretrained)
        state = trtllm_to_hf_state(checkpoint, hf_config)
        hf = scratch / "hf"
        hf.mkdir()
        (hf / "config.json").write_text(json.dumps(hf_config))
        save_file({k: v.contiguous() for k, v in state.items()}, str(hf / "model.safetensors"))
        return hf

    def _check(self, params) -> None:
        if (params.prompt_logprobs or params.return_context_logits) and not self.gather:
            raise ValueError("`prompt_logprobs` requires `gather_context_logits=True` in the BuildConfig")



LLM = _TrtLLM
