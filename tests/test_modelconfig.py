"""Reading config.json dialects into the numbers planning needs."""

from __future__ import annotations

import pytest

from conftest import CONFIGS, TINY_LLAMA
from trtbuild.errors import InvalidInput
from trtbuild.model.config import load_config, padded_vocab, parse_config


def test_llama_31_config():
    m = load_config(CONFIGS / "llama-3.1-8b-instruct.json")
    assert (m.architecture, m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim) == ("LlamaForCausalLM", 4096, 32, 32, 8, 128)
    assert (m.intermediate_size, m.vocab_size, m.gated_mlp, m.attention_bias, m.dtype) == (14336, 128256, True, False, "bfloat16")
    assert m.rope_scaling["rope_type"] == "llama3" and m.max_seq_len == 131072


def test_qwen2_has_attention_bias_and_mixtral_has_experts():
    qwen = load_config(CONFIGS / "qwen2.5-7b-instruct.json")
    assert qwen.attention_bias and qwen.num_kv_heads == 4 and qwen.max_seq_len == 32768
    mixtral = load_config(CONFIGS / "mixtral-8x7b-instruct-v0.1.json")
    assert (mixtral.num_experts, mixtral.experts_per_token) == (8, 2)


def test_gpt2_style_names():
    m = parse_config({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_head": 12,
                      "n_layer": 12, "vocab_size": 50257, "n_positions": 1024, "activation_function": "gelu_new"})
    assert (m.hidden_size, m.num_heads, m.num_kv_heads, m.num_layers, m.intermediate_size) == (768, 12, 12, 12, 3072)
    assert not m.gated_mlp and m.max_seq_len == 1024 and m.dtype is None


def test_transformers5_dtype_and_rope_parameters():
    m = parse_config({**{k: v for k, v in TINY_LLAMA.items() if k != "torch_dtype"}, "dtype": "float16",
                      "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}})
    assert m.dtype == "float16" and m.max_seq_len == 8192


def test_multimodal_text_config_is_used():
    m = parse_config({"architectures": ["SomeVLM"], "text_config": {**TINY_LLAMA, "architectures": None}})
    assert m.architecture == "SomeVLM" and m.hidden_size == 256


@pytest.mark.parametrize("config, message", [
    ({**TINY_LLAMA, "architectures": []}, "missing 'architectures'"),
    ({k: v for k, v in TINY_LLAMA.items() if k != "vocab_size"}, "missing 'vocab_size'"),
    ({**TINY_LLAMA, "num_hidden_layers": "four"}, "'num_hidden_layers' must be a positive integer, got 'four'"),
])
def test_bad_configs_name_the_key(config, message):
    with pytest.raises(InvalidInput, match=message):
        parse_config(config, "x/config.json")


def test_unreadable_configs(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidInput, match=r"config.json: not JSON"):
        load_config(bad)
    with pytest.raises(InvalidInput, match="no such file"):
        load_config(tmp_path / "nope.json")


def test_padded_vocab():
    assert padded_vocab(49152, 3) == 49152 and padded_vocab(1001, 4) == 1004
