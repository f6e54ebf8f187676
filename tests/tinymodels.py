"""Tiny real models for tests: random weights from transformers configs, with a small real BPE
tokenizer trained offline on Python's own documentation (pydoc_data.topics)."""

from __future__ import annotations

import shutil
from pathlib import Path


def pydoc_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def make_tokenizer(folder: Path, vocab_size: int = 512) -> Path:
    """A byte-level BPE of at most `vocab_size` tokens, saved as a fast Hugging Face tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([pydoc_text()], trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                            eos_token="<|endoftext|>").save_pretrained(folder)
    return folder


def make_model(folder: Path, arch: str = "llama", tokenizer: Path | None = None, seed: int = 1234, **overrides) -> Path:
    """A 2-layer model (hidden 64, 4 heads / 2 KV heads, vocab 512) saved in bf16, with a tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config

    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig, "mixtral": MixtralConfig}
    settings = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
                    initializer_range=0.05, **({"rope_theta": 1e6} if arch == "qwen2" else {}))
    settings.update(overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(classes[arch](**settings)).to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    for path in (tokenizer or make_tokenizer(folder.parent / f"{folder.name}-tokenizer")).iterdir():
        shutil.copy2(path, folder / path.name)
    return folder
