"""Memory estimates against independently known numbers (published parameter counts, hand arithmetic)."""

from __future__ import annotations

import math

import pytest

from conftest import CONFIGS, ROOT, TINY_LLAMA
from trtbuild.plan import estimate
from trtbuild.model.config import load_config, parse_config

# Parameter counts as published with the safetensors of each hub repository.
PUBLISHED_PARAMS = {
    "llama-3.1-8b-instruct.json": 8_030_261_248,
    "qwen2.5-7b-instruct.json": 7_615_616_512,  # includes the q/k/v biases
}


@pytest.mark.parametrize("name, params", PUBLISHED_PARAMS.items())
def test_unquantized_weights_equal_published_parameter_counts(name, params):
    model = load_config(CONFIGS / name)
    assert estimate.weights_bytes_per_gpu(model, 1, 1, None, "bfloat16") == 2 * params
    assert estimate.weights_bytes_per_gpu(model, 1, 1, None, "float32") == 4 * params


@pytest.mark.parametrize("name, params", PUBLISHED_PARAMS.items())
def test_parameter_counts_per_component(name, params):
    counts = estimate.parameter_counts(load_config(CONFIGS / name))
    assert counts["total"] == params
    assert counts["embedding"] == counts["lm_head"] > 0 and counts["router"] == 0
    assert counts["mlp"] > counts["attention"] > counts["norm"] > 0


def test_mixtral_parameter_count_is_published():
    counts = estimate.parameter_counts(load_config(CONFIGS / "mixtral-8x7b-instruct-v0.1.json"))
    assert counts["total"] == 46_702_792_704 and counts["router"] == 32 * 4096 * 8


def test_tied_embeddings_store_lm_head_in_trtllm_but_not_in_hf():
    smollm2 = load_config(ROOT / "trtbuild" / "recipes" / "smollm2-135m-instruct.json")
    hf = estimate.weights_bytes_per_gpu(smollm2, 1, 1, None, "bfloat16", hf_layout=True)
    assert hf == 2 * 134_515_008  # SmolLM2-135M's published count (tied embeddings)
    trt = estimate.weights_bytes_per_gpu(smollm2, 1, 1, None, "bfloat16")
    assert trt - hf == 2 * 49152 * 576  # TensorRT-LLM writes lm_head separately


def test_mixtral_counts_experts_and_a_float32_router():
    model = load_config(CONFIGS / "mixtral-8x7b-instruct-v0.1.json")
    router_params = 32 * 4096 * 8
    # 46,702,792,704 published parameters; the router is float32 in TensorRT-LLM ("Router should
    # never be quantized"), so it costs 2 bytes more per parameter than bf16.
    assert estimate.weights_bytes_per_gpu(model, 1, 1, None, "bfloat16") == 2 * 46_702_792_704 + 2 * router_params


def test_tensor_parallel_sharding_and_replication():
    model = parse_config(TINY_LLAMA)
    hidden, inter, vocab, layers = 256, 512, 1000, 4
    per_layer_tp2 = ((256 + 2 * 128) // 2 * hidden + hidden * 256 // 2 + 3 * inter // 2 * hidden) * 2 + 2 * hidden * 2
    replicated = vocab * hidden * 2 + hidden * 2  # embedding + final norm on every GPU
    lm_head_tp2 = 500 * hidden * 2
    assert estimate.weights_bytes_per_gpu(model, 2, 1, None, "bfloat16") == layers * per_layer_tp2 + replicated + lm_head_tp2


def test_vocab_is_padded_for_lm_head_split():
    model = parse_config({**TINY_LLAMA, "vocab_size": 1001})
    tp4 = estimate.weights_bytes_per_gpu(model, 4, 1, None, "float16")
    tp4_round = estimate.weights_bytes_per_gpu(parse_config({**TINY_LLAMA, "vocab_size": 1004}), 4, 1, None, "float16")
    # lm_head: 1001 rows padded to 1004, 251 per rank; the replicated embedding keeps 1001 rows
    assert tp4_round - tp4 == 3 * 256 * 2


def test_pipeline_parallel_puts_embedding_first_and_head_last():
    model = parse_config(TINY_LLAMA)
    one = estimate.weights_bytes_per_gpu(model, 1, 1, None, "bfloat16")
    two = estimate.weights_bytes_per_gpu(model, 1, 2, None, "bfloat16")
    embedding = 1000 * 256 * 2
    head = 1000 * 256 * 2 + 256 * 2
    layers = one - embedding - head
    assert two == layers // 2 + max(embedding, head)
    # 4 layers over 3 stages: the busiest stage has 2
    assert estimate.weights_bytes_per_gpu(model, 1, 3, None, "bfloat16") == layers // 2 + head


@pytest.mark.parametrize("quant, per_weight", [(None, 2), ("fp8", 1), ("int8_sq", 1), ("int8_wo", 1),
                                               ("int4_wo", 0.5), ("int4_awq", 0.5), ("w4a8_awq", 0.5), ("nvfp4", 0.5 + 1 / 16)])
def test_quantized_linear_bytes_match_exported_layouts(quant, per_weight):
    out_f, in_f = 4096, 4096
    got = estimate.linear_bytes(out_f, in_f, quant, 2, 128)
    weights = out_f * in_f * per_weight
    scales = got - weights
    assert scales >= 0 and scales < 0.07 * weights  # scales cost a few percent at most (AWQ: 4 B per 128 weights)
    if quant in ("int4_awq", "w4a8_awq", "int4_wo"):  # int4_wo is exported as W4A16_AWQ
        # weights_scaling_factor [out, in/128] float32 + prequant_scaling_factor [in] fp16 (reference/modelopt.md s.3)
        assert scales >= out_f * in_f / 128 * 4 + in_f * 2
    if quant == "int8_wo":  # quantized by TensorRT-LLM at load: per_channel_scale [out] in the model dtype
        assert scales == out_f * 2


def test_kv_bytes_per_token():
    llama8b = load_config(CONFIGS / "llama-3.1-8b-instruct.json")
    assert estimate.kv_bytes_per_token(llama8b, 1, 1, None, "bfloat16") == 2 * 32 * 8 * 128 * 2  # 128 KiB
    assert estimate.kv_bytes_per_token(llama8b, 1, 1, "fp8", "bfloat16") == 2 * 32 * 8 * 128
    assert estimate.kv_bytes_per_token(llama8b, 2, 1, "int8", "bfloat16") == 2 * 32 * 4 * 128
    assert estimate.kv_bytes_per_token(llama8b, 1, 4, None, "bfloat16") == 2 * 8 * 8 * 128 * 2
    assert estimate.kv_bytes_per_token(llama8b, 1, 1, "nvfp4", "bfloat16") == math.ceil(2 * 32 * 8 * 128 * (0.5 + 1 / 16))
    # 16 KV heads duplicated? no: tp=16 > 8 KV heads gives each GPU one head
    assert estimate.kv_bytes_per_token(llama8b, 16, 1, None, "bfloat16") == 2 * 32 * 1 * 128 * 2


def test_fit_arithmetic():
    gib = estimate.GIB
    fits, tokens = estimate.fit_on_gpu(weights=10 * gib, kv_per_token=1024 * 1024, activations=2 * gib, gpu_memory=20 * gib)
    assert fits and tokens == int((18 - 12) * 1024)
    fits, tokens = estimate.fit_on_gpu(weights=17 * gib, kv_per_token=1024, activations=2 * gib, gpu_memory=20 * gib)
    assert not fits and tokens == 0


def test_activation_reserve_grows_with_batch_and_tokens():
    model = parse_config(TINY_LLAMA)
    small = estimate.activation_bytes(model, 1, "bfloat16", max_num_tokens=1024, max_batch_size=8, max_beam_width=1)
    assert small == estimate.RUNTIME_OVERHEAD + 1024 * (4 * 256 + 3 * 512) * 2 + 8 * 1000 * 4
    assert estimate.activation_bytes(model, 1, "bfloat16", 8192, 8, 1) > small
    assert estimate.activation_bytes(model, 1, "bfloat16", 1024, 64, 4) > small


def test_format_bytes():
    assert estimate.format_bytes(512) == "512 B"
    assert estimate.format_bytes(1536) == "1.5 KiB"
    assert estimate.format_bytes(3 * estimate.GIB) == "3.0 GiB"
