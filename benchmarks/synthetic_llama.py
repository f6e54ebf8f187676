"""A synthetic LLaMA checkpoint for the benchmarks (checkpoint_speed.py, pipeline_speed.py).

`write_synthetic(folder, layers)` writes a bf16 Hugging Face LLaMA folder of random N(0, 0.02)
weights (LLaMA-2-7B widths with 8 KV heads; 10 layers give 4.07 GB), one safetensors shard per
layer, holding one shard's tensors at a time; `tiny=True` uses TINY's widths instead (hidden 64:
a few hundred KB, for the benchmarks' smoke runs in tests/test_benchmarks.py). `write_byte_tokenizer(folder)` adds a tokenizer, so
that trtbuild can build the folder as a `path:` source (calibration and validation tokenize text).

torch, safetensors, transformers and tokenizers are imported inside the functions: a benchmark
that measures its children's peak RSS calls these in a child process and stays small itself.
"""

from __future__ import annotations

import json
from pathlib import Path

# The synthetic model (LLaMA-2-7B widths with 8 KV heads; the layer count sets the size).
SYNTH = {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 8,
         "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "tie_word_embeddings": False}
# The same architecture at smoke-test size (the byte-level tokenizer's 259 tokens fit its vocabulary).
TINY = {**SYNTH, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 320}


def widths(tiny: bool = False) -> dict:
    return TINY if tiny else SYNTH


def describe(layers: int, tiny: bool = False) -> str:
    w = widths(tiny)
    return (f"{layers} layers, hidden {w['hidden_size']}, intermediate {w['intermediate_size']}, "
            f"{w['num_attention_heads']} heads / {w['num_key_value_heads']} KV, vocab {w['vocab_size']}")


def write_synthetic(folder: str, layers: int, tiny: bool = False) -> int:
    """A bf16 LLaMA checkpoint in Hugging Face names, one shard per layer (plus embeddings and
    head), random N(0, 0.02) values; holds one shard's tensors at a time. Returns the bytes."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    folder = Path(folder)
    folder.mkdir(parents=True)
    w = widths(tiny)
    cfg = LlamaConfig(num_hidden_layers=layers, **w)
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.dtype = "bfloat16"
    cfg.to_json_file(str(folder / "config.json"))
    h, i, v = w["hidden_size"], w["intermediate_size"], w["vocab_size"]
    kv = w["num_key_value_heads"] * h // w["num_attention_heads"]
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.empty(shape, dtype=torch.bfloat16).normal_(0.0, 0.02, generator=gen)

    def norm():
        return (1.0 + rand(h)).contiguous()

    shards = [("model-embed.safetensors", lambda: {"model.embed_tokens.weight": rand(v, h)})]
    for layer in range(layers):
        p = f"model.layers.{layer}."
        shards.append((f"model-layer{layer:03d}.safetensors", lambda p=p: {
            p + "input_layernorm.weight": norm(), p + "post_attention_layernorm.weight": norm(),
            p + "self_attn.q_proj.weight": rand(h, h), p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, h),
            p + "mlp.gate_proj.weight": rand(i, h), p + "mlp.up_proj.weight": rand(i, h),
            p + "mlp.down_proj.weight": rand(h, i)}))
    shards.append(("model-head.safetensors", lambda: {"model.norm.weight": norm(), "lm_head.weight": rand(v, h)}))
    weight_map, total = {}, 0
    for fname, make in shards:
        tensors = make()
        save_file(tensors, str(folder / fname), metadata={"format": "pt"})
        for k, t in tensors.items():
            weight_map[k] = fname
            total += t.numel() * t.element_size()
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return total


def write_byte_tokenizer(folder: str, tiny: bool = False) -> int:
    """A byte-level tokenizer (tokenizer.json, tokenizer_config.json): one token per byte (ids
    0-255, no merges) and <s>, </s>, <unk> after them. Built here rather than downloaded: any
    tokenizer whose ids fit the vocabulary serves random weights, and this one needs no network.
    Returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 characters ByteLevel maps bytes to
    vocab = {c: i for i, c in enumerate(byte_chars)}
    specials = ["<s>", "</s>", "<unk>"]
    vocab.update({s: len(byte_chars) + n for n, s in enumerate(specials)})
    assert len(vocab) <= widths(tiny)["vocab_size"]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(Path(folder) / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "model_max_length": widths(tiny)["max_position_embeddings"]}
    (Path(folder) / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return len(vocab)
