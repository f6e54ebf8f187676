"""trtllm_to_hf_state, the inverse of the streaming converter: tiny random models (tests/tinymodels.py)
converted with convert_hf_to_trtllm at several tp/pp, read back into the Hugging Face state dict
tensor for tensor, and a model loaded from it giving the original's logits; plus the checks it
makes on the way (duplicated KV heads and replicated tensors must agree, tied lm_head, quantized
checkpoints refused)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tinymodels import make_model, make_tokenizer
from trtbuild.checkpoint.trtllm_convert import convert_hf_to_trtllm
from trtbuild.checkpoint.trtllm_inverse import trtllm_to_hf_state
from trtbuild.errors import TrtbuildError

VOCAB = 1001  # not a multiple of 2 or 4: the converter pads it

MODELS = {
    # name: (arch, overrides); make_model's default is 4 heads / 2 KV heads, 2 layers, untied.
    "llama": ("llama", dict(vocab_size=VOCAB)),
    "tied": ("llama", dict(vocab_size=VOCAB, tie_word_embeddings=True)),
    "mistral": ("mistral", dict(vocab_size=VOCAB)),
    "qwen2": ("qwen2", dict(vocab_size=VOCAB)),  # q/k/v biases
    "qwen2_tied": ("qwen2", dict(vocab_size=VOCAB, tie_word_embeddings=True)),
    "mixtral": ("mixtral", dict(vocab_size=VOCAB, num_local_experts=4, num_experts_per_tok=2)),
}

CASES = [
    ("llama", 1, 1), ("llama", 2, 1), ("llama", 1, 2), ("llama", 2, 2),
    ("llama", 4, 1),  # tp 4 > 2 KV heads: each KV head on two ranks
    ("tied", 1, 1), ("tied", 2, 2), ("tied", 4, 1),
    ("mistral", 2, 1),
    ("qwen2", 1, 1), ("qwen2", 2, 2), ("qwen2", 4, 1),  # the k/v biases are duplicated too
    ("qwen2_tied", 2, 1),
    ("mixtral", 1, 1), ("mixtral", 2, 1), ("mixtral", 1, 2), ("mixtral", 2, 2), ("mixtral", 4, 1),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("trtllm_inverse")


@pytest.fixture(scope="module")
def hf_model(workdir):
    made: dict[str, Path] = {}
    tokenizer = make_tokenizer(workdir / "tokenizer")

    def get(name: str) -> Path:
        if name not in made:
            arch, overrides = MODELS[name]
            made[name] = make_model(workdir / "hf" / name, arch, tokenizer, seed=len(made) + 1, **overrides)
        return made[name]
    return get


@pytest.fixture(scope="module")
def converted(workdir, hf_model):
    done: dict[tuple, Path] = {}

    def get(name: str, tp: int, pp: int) -> Path:
        if (name, tp, pp) not in done:
            out = workdir / "trtllm" / f"{name}_tp{tp}_pp{pp}"
            convert_hf_to_trtllm(hf_model(name), out, tp, pp, "auto")
            done[(name, tp, pp)] = out
        return done[(name, tp, pp)]
    return get


def hf_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def copy_checkpoint(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for path in src.iterdir():
        (dst / path.name).write_bytes(path.read_bytes())
    return dst


@pytest.mark.parametrize("name,tp,pp", CASES, ids=[f"{n}-tp{t}-pp{p}" for n, t, p in CASES])
def test_inverse_equals_original_state_dict(name, tp, pp, hf_model, converted):
    src = hf_model(name)
    original = load_file(src / "model.safetensors")  # what save_pretrained wrote (no lm_head when tied)
    state = trtllm_to_hf_state(converted(name, tp, pp), hf_config(src))
    assert sorted(state) == sorted(original), sorted(set(state) ^ set(original))
    for key, tensor in original.items():
        assert state[key].dtype == tensor.dtype == torch.bfloat16, key
        assert state[key].shape == tensor.shape, (key, state[key].shape, tensor.shape)
        assert torch.equal(state[key], tensor), key
    assert ("lm_head.weight" in state) == (not hf_config(src).get("tie_word_embeddings"))
    assert state["model.embed_tokens.weight"].shape[0] == VOCAB  # padding trimmed


@pytest.mark.parametrize("name,tp,pp", [("llama", 2, 2), ("tied", 4, 1), ("qwen2", 4, 1), ("mixtral", 2, 2)],
                         ids=["llama-tp2-pp2", "tied-tp4", "qwen2-tp4", "mixtral-tp2-pp2"])
def test_model_loaded_from_inverse_gives_original_logits(name, tp, pp, hf_model, converted):
    from transformers import AutoConfig, AutoModelForCausalLM

    src = hf_model(name)
    state = trtllm_to_hf_state(converted(name, tp, pp), hf_config(src))
    original = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    rebuilt = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32).eval()
    if hf_config(src).get("tie_word_embeddings"):
        # lm_head is the embedding table (tied by from_config), so the state dict leaves it out and
        # strict loading may miss exactly that key.
        result = rebuilt.load_state_dict(state, strict=False)
        assert result.missing_keys == ["lm_head.weight"] and result.unexpected_keys == []
        assert rebuilt.lm_head.weight is rebuilt.model.embed_tokens.weight
    else:
        rebuilt.load_state_dict(state, strict=True)
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = original(input_ids=ids).logits, rebuilt(input_ids=ids).logits
    assert want.shape[-1] == VOCAB
    assert torch.equal(want, got)


def test_quantized_checkpoint_refused(hf_model, converted, tmp_path):
    ckpt = copy_checkpoint(converted("llama", 1, 1), tmp_path / "fp8")
    config = hf_config(ckpt)
    config["quantization"] = {"quant_algo": "FP8", "kv_cache_quant_algo": None}
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(TrtbuildError) as err:
        trtllm_to_hf_state(ckpt, hf_config(hf_model("llama")))
    assert len(err.value.messages) == 1
    assert str(err.value) == f"{ckpt}: quant_algo FP8: quantized checkpoints are validated through their ModelOpt state"


def test_differing_kv_duplicates_rejected(hf_model, converted, tmp_path):
    # tp 4, 2 KV heads: ranks 0 and 1 both hold KV head 0. Change rank 1's copy of k.
    ckpt = copy_checkpoint(converted("llama", 4, 1), tmp_path / "bad_kv")
    tensors = load_file(ckpt / "rank1.safetensors")
    qkv = tensors["transformer.layers.1.attention.qkv.weight"].clone()
    q_per = 4 * 16 // 4  # heads * head_dim / tp
    qkv[q_per] += 1
    tensors["transformer.layers.1.attention.qkv.weight"] = qkv
    save_file(tensors, ckpt / "rank1.safetensors")
    with pytest.raises(TrtbuildError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight: KV head 0 is duplicated on "
                                            r"tensor-parallel ranks 0 and 1 .* but the copies differ"):
        trtllm_to_hf_state(ckpt, hf_config(hf_model("llama")))


def test_differing_replicated_tensor_rejected(hf_model, converted, tmp_path):
    ckpt = copy_checkpoint(converted("llama", 2, 1), tmp_path / "bad_norm")
    tensors = load_file(ckpt / "rank1.safetensors")
    tensors["transformer.ln_f.weight"] = tensors["transformer.ln_f.weight"] + 1
    save_file(tensors, ckpt / "rank1.safetensors")
    with pytest.raises(TrtbuildError, match=r"rank1\.safetensors: model\.norm\.weight differs between tensor-parallel "
                                            r"ranks"):
        trtllm_to_hf_state(ckpt, hf_config(hf_model("llama")))


def test_tied_lm_head_must_equal_embedding(hf_model, converted, tmp_path):
    ckpt = copy_checkpoint(converted("tied", 1, 1), tmp_path / "bad_tied")
    tensors = load_file(ckpt / "rank0.safetensors")
    tensors["lm_head.weight"] = tensors["lm_head.weight"] * 2
    save_file(tensors, ckpt / "rank0.safetensors")
    with pytest.raises(TrtbuildError, match="tie_word_embeddings is true but lm_head.weight differs"):
        trtllm_to_hf_state(ckpt, hf_config(hf_model("tied")))


def test_checkpoint_of_another_model_rejected(hf_model, converted):
    # The verifier runs first: a Mixtral checkpoint is not a Llama one.
    with pytest.raises(TrtbuildError, match=r"config.json: architecture expected 'LlamaForCausalLM' "
                                             r"\(the HF architectures\[0\]\), found 'MixtralForCausalLM'"):
        trtllm_to_hf_state(converted("mixtral", 1, 1), hf_config(hf_model("llama")))


@pytest.mark.parametrize("name", ["llama", "tied"])
def test_validation_reads_a_checkpoint_back_as_the_source_is_read_in_a_gpus_compute_dtype(name, hf_model, converted,
                                                                                          monkeypatch):
    """On a GPU validation computes in the recipe's dtype (bfloat16), not float32 as on the CPU.
    The model read back from a TensorRT-LLM checkpoint must then be the model read from the source:
    the same logits, bit for bit. A cast of the whole model cast the rotary embedding's inv_freq
    too, which from_pretrained keeps in float32: on an H200 the demo's unquantized checkpoint
    failed its gates (top-1 agreement about 0.95 where 0.97 is asked)."""
    from trtbuild.validate import torch_runner

    monkeypatch.setattr(torch_runner, "_compute_dtype", lambda device, dtype: getattr(torch, dtype))
    src = hf_model(name)
    source = torch_runner.load_source(src, "cpu", "bfloat16")
    read_back = torch_runner.load_trtllm_checkpoint(converted(name, 2, 1), src, "cpu", "bfloat16")
    assert {n: b.dtype for n, b in read_back.named_buffers()} == {n: b.dtype for n, b in source.named_buffers()}
    ids = torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(source(input_ids=ids).logits, read_back(input_ids=ids).logits)


def test_a_model_cast_for_validation_keeps_the_buffers_transformers_keeps_in_float32(hf_model, monkeypatch):
    """in_compute_dtype casts a float32 model's weights to bfloat16 and leaves its non-persistent
    float32 buffers (the rotary inv_freq) as from_pretrained in bfloat16 would have them."""
    from transformers import AutoModelForCausalLM

    from trtbuild.validate import torch_runner

    monkeypatch.setattr(torch_runner, "_compute_dtype", lambda device, dtype: getattr(torch, dtype))
    wide = AutoModelForCausalLM.from_pretrained(hf_model("llama"), dtype=torch.float32)
    cast = torch_runner.in_compute_dtype(wide, "cpu", "bfloat16")
    loaded = AutoModelForCausalLM.from_pretrained(hf_model("llama"), dtype=torch.bfloat16)
    assert {n: b.dtype for n, b in cast.named_buffers()} == {n: b.dtype for n, b in loaded.named_buffers()}
    assert {n: p.dtype for n, p in cast.named_parameters()} == {n: p.dtype for n, p in loaded.named_parameters()}
    assert next(wide.parameters()).dtype == torch.float32  # the caller's model is not cast
