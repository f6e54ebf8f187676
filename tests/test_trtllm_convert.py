"""The streaming HF -> TensorRT-LLM converter against ModelOpt's own export, the checkpoint verifier,
fix_trtllm_config, and the converter's peak memory.

ModelOpt 0.47's `export_tensorrt_llm_checkpoint(model, decoder_type, dtype, export_dir,
inference_tensor_parallel, inference_pipeline_parallel)` is the reference: for the same unquantized
tiny model the converter must write the same tensors (names, shapes, dtypes, torch.equal) and the
same config.json, except the fields where we deliberately differ:
- producer: {"name": "trtbuild"} instead of {"name": "modelopt"};
- Qwen: qwen_type "qwen2" and attn_bias true, which ModelOpt's fallback config (no tensorrt_llm
  installed) omits, so TRT-LLM would build the Qwen-1 layout.
rotary_base/rotary_scaling: with transformers 4.57.6 (installed here) ModelOpt gets them right, so
they must compare equal; with transformers 5 ModelOpt drops them (reference/modelopt.md section 6),
which the rope_parameters tests simulate.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config

from trtbuild.checkpoint.safetensors_files import read_safetensors_header
from trtbuild.checkpoint.trtllm_config import fix_trtllm_config
from trtbuild.checkpoint.trtllm_convert import convert_hf_to_trtllm
from trtbuild.checkpoint.verify import CheckpointInvalid, verify_trtllm_checkpoint
from trtbuild.errors import InvalidInput, TrtbuildError

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.filterwarnings("ignore:Cannot export tensorrt_llm checkpoint config")

LLAMA3_SCALING = {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                  "original_max_position_embeddings": 256, "rope_type": "llama3"}
BASE = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=False)
MODELS = {
    # name: (config class, overrides, ModelOpt decoder_type)
    "llama": (LlamaConfig, dict(rope_theta=500000.0, rope_scaling=LLAMA3_SCALING), "llama"),
    "qwen2": (Qwen2Config, dict(rope_theta=1e6), "qwen"),
    "mistral": (MistralConfig, dict(), "llama"),
    "mixtral": (MixtralConfig, dict(num_local_experts=4, num_experts_per_tok=2), "llama"),
    "tied": (LlamaConfig, dict(tie_word_embeddings=True), "llama"),
    "gqa_dup": (LlamaConfig, dict(num_key_value_heads=2), "llama"),  # 8 heads / 2 KV heads, tp 4
    "qwen2_dup": (Qwen2Config, dict(num_key_value_heads=2), "qwen"),  # the k/v biases are duplicated too
    "odd_vocab": (LlamaConfig, dict(vocab_size=1001), "llama"),
}


# ---------------------------------------------------------------------------------------------
# fixtures: models, ModelOpt exports and our conversions, each made once per module
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def export_tensorrt_llm_checkpoint():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from modelopt.torch.export import export_tensorrt_llm_checkpoint as export  # ~2-15 s, once
    return export


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("trtllm_convert")


@pytest.fixture(scope="module")
def hf_model(workdir):
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            cls, overrides, _ = MODELS[name]
            torch.manual_seed(len(made))
            model = AutoModelForCausalLM.from_config(cls(**{**BASE, **overrides}), dtype=torch.bfloat16)
            folder = workdir / "hf" / name
            # llama is saved sharded (model.safetensors.index.json), the others as one file.
            model.save_pretrained(folder, max_shard_size="200KB" if name == "llama" else "1GB")
            made[name] = folder
        return made[name]
    return get


@pytest.fixture(scope="module")
def modelopt_ckpt(workdir, hf_model, export_tensorrt_llm_checkpoint):
    loaded: dict[str, torch.nn.Module] = {}
    done: dict[tuple, Path] = {}

    def get(name: str, tp: int, pp: int, dtype: str = "bfloat16") -> Path:
        key = (name, tp, pp, dtype)
        if key not in done:
            if name not in loaded:
                loaded[name] = AutoModelForCausalLM.from_pretrained(hf_model(name), dtype=torch.bfloat16)
            out = workdir / "modelopt" / f"{name}_tp{tp}_pp{pp}_{dtype}"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                export_tensorrt_llm_checkpoint(loaded[name], MODELS[name][2], dtype=getattr(torch, dtype),
                                               export_dir=out, inference_tensor_parallel=tp,
                                               inference_pipeline_parallel=pp)
            done[key] = out
        return done[key]
    return get


@pytest.fixture(scope="module")
def ours(workdir, hf_model):
    done: dict[tuple, tuple[Path, dict]] = {}

    def get(name: str, tp: int, pp: int, dtype: str = "bfloat16", chunk_bytes: int = 64 << 20):
        key = (name, tp, pp, dtype, chunk_bytes)
        if key not in done:
            out = workdir / "ours" / f"{name}_tp{tp}_pp{pp}_{dtype}_{chunk_bytes}"
            done[key] = (out, convert_hf_to_trtllm(hf_model(name), out, tp, pp, dtype, chunk_bytes=chunk_bytes))
        return done[key][0]
    return get


def hf_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def read_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def assert_same_tensors(a: Path, b: Path, world: int) -> None:
    assert sorted(p.name for p in a.glob("rank*.safetensors")) == sorted(p.name for p in b.glob("rank*.safetensors"))
    assert len(list(a.glob("rank*.safetensors"))) == world
    for rank in range(world):
        x, y = load_file(a / f"rank{rank}.safetensors"), load_file(b / f"rank{rank}.safetensors")
        assert sorted(x) == sorted(y), f"rank{rank}: names differ: {sorted(set(x) ^ set(y))}"
        for name in x:
            assert x[name].shape == y[name].shape, (rank, name, x[name].shape, y[name].shape)
            assert x[name].dtype == y[name].dtype, (rank, name, x[name].dtype, y[name].dtype)
            assert torch.equal(x[name], y[name]), (rank, name)


def assert_config_matches_modelopt(ours_dir: Path, modelopt_dir: Path, model_type: str) -> None:
    a, b = read_config(ours_dir), read_config(modelopt_dir)
    # Deliberate difference 1: who wrote it.
    assert a.pop("producer")["name"] == "trtbuild"
    assert b.pop("producer")["name"] == "modelopt"
    if model_type == "qwen2":
        # Deliberate difference 2: ModelOpt's fallback config has no qwen_type/attn_bias.
        assert "qwen_type" not in b and "attn_bias" not in b
        assert a.pop("qwen_type") == "qwen2"
        assert a.pop("attn_bias") is True
    assert a == b
    assert list(a) == list(b), "same keys in the same order"


# ---------------------------------------------------------------------------------------------
# equality with ModelOpt
# ---------------------------------------------------------------------------------------------

EQUAL_CASES = [
    ("llama", 1, 1), ("llama", 2, 1), ("llama", 1, 2), ("llama", 2, 2),
    ("qwen2", 1, 1), ("qwen2", 2, 1), ("qwen2", 2, 2),
    ("mistral", 1, 1), ("mistral", 2, 2),
    ("mixtral", 1, 1), ("mixtral", 2, 1), ("mixtral", 2, 2),
    ("tied", 1, 1), ("tied", 2, 2),
]


@pytest.mark.parametrize("name,tp,pp", EQUAL_CASES, ids=[f"{n}-tp{t}-pp{p}" for n, t, p in EQUAL_CASES])
def test_equals_modelopt_export(name, tp, pp, ours, modelopt_ckpt, hf_model):
    mine, theirs = ours(name, tp, pp), modelopt_ckpt(name, tp, pp)
    assert_same_tensors(mine, theirs, tp * pp)
    hf = hf_config(hf_model(name))
    assert_config_matches_modelopt(mine, theirs, hf["model_type"])
    verify_trtllm_checkpoint(mine, hf)
    if hf["model_type"] != "qwen2":
        verify_trtllm_checkpoint(theirs, hf)


def test_float16_and_small_blocks_equal_modelopt(ours, modelopt_ckpt, hf_model):
    """bf16 source -> fp16 output, and reads in blocks of a few rows (chunk_bytes=512)."""
    mine = ours("llama", 2, 2, "float16", chunk_bytes=512)
    assert_same_tensors(mine, modelopt_ckpt("llama", 2, 2, "float16"), 4)
    assert_config_matches_modelopt(mine, modelopt_ckpt("llama", 2, 2, "float16"), "llama")
    assert read_config(mine)["logits_dtype"] == "float16"
    verify_trtllm_checkpoint(mine, hf_config(hf_model("llama")))


def test_rope_fields_from_hf_config(ours, modelopt_ckpt):
    llama, qwen = read_config(ours("llama", 2, 1)), read_config(ours("qwen2", 2, 1))
    assert llama["rotary_base"] == 500000.0 and llama["rotary_scaling"] == LLAMA3_SCALING
    assert qwen["rotary_base"] == 1000000.0 and "rotary_scaling" not in qwen
    # transformers 4.57.6: ModelOpt gets these right too (it drops them with transformers 5).
    assert read_config(modelopt_ckpt("llama", 2, 1))["rotary_scaling"] == LLAMA3_SCALING
    assert read_config(modelopt_ckpt("qwen2", 2, 1))["rotary_base"] == 1000000.0


def test_mixtral_layout(ours, hf_model):
    """fc = per expert w3 then w1 (each split on dim 0), proj = w2 split on dim 1, router fp32."""
    src = load_file(hf_model("mixtral") / "model.safetensors")
    rank1 = load_file(ours("mixtral", 2, 1) / "rank1.safetensors")
    p = "model.layers.2.block_sparse_moe."
    assert rank1["transformer.layers.2.mlp.router.weight"].dtype == torch.float32
    assert torch.equal(rank1["transformer.layers.2.mlp.router.weight"], src[p + "gate.weight"].float())
    for e in range(4):
        fc, proj = rank1["transformer.layers.2.mlp.fc.weight"][e], rank1["transformer.layers.2.mlp.proj.weight"][e]
        assert torch.equal(fc, torch.cat([src[f"{p}experts.{e}.w3.weight"][64:], src[f"{p}experts.{e}.w1.weight"][64:]]))
        assert torch.equal(proj, src[f"{p}experts.{e}.w2.weight"][:, 64:])
    cfg = read_config(ours("mixtral", 2, 1))
    assert cfg["moe"] == {"num_experts": 4, "top_k": 2, "normalization_mode": 1}
    assert cfg["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1, "moe_tp_size": 2, "moe_ep_size": 1}
    assert cfg["hidden_act"] == "swiglu"  # as ModelOpt writes it for MoE


def test_tied_embeddings_write_lm_head(ours, hf_model):
    src = load_file(hf_model("tied") / "model.safetensors")
    assert "lm_head.weight" not in src
    ranks = [load_file(ours("tied", 2, 1) / f"rank{r}.safetensors") for r in range(2)]
    assert torch.equal(torch.cat([r["lm_head.weight"] for r in ranks]), src["model.embed_tokens.weight"])
    assert read_config(ours("tied", 2, 1))["share_embedding_table"] is False


# ---------------------------------------------------------------------------------------------
# GQA duplication and vocab padding
# ---------------------------------------------------------------------------------------------

def test_gqa_kv_heads_duplicated_when_tp_exceeds_them(ours, modelopt_ckpt, hf_model):
    """8 heads, 2 KV heads, head_dim 8, tp 4: rank t holds q heads 2t, 2t+1 and KV head t // 2."""
    src = load_file(hf_model("gqa_dup") / "model.safetensors")
    out = ours("gqa_dup", 4, 1)
    for t in range(4):
        rank = load_file(out / f"rank{t}.safetensors")
        for layer in range(4):
            p = f"model.layers.{layer}.self_attn."
            kv = slice((t // 2) * 8, (t // 2 + 1) * 8)
            expected = torch.cat([src[p + "q_proj.weight"][t * 16:(t + 1) * 16],
                                  src[p + "k_proj.weight"][kv], src[p + "v_proj.weight"][kv]])
            assert torch.equal(rank[f"transformer.layers.{layer}.attention.qkv.weight"], expected)
            assert torch.equal(rank[f"transformer.layers.{layer}.attention.dense.weight"],
                               src[p + "o_proj.weight"][:, t * 16:(t + 1) * 16])
    assert read_config(out)["num_key_value_heads"] == 2  # the HF count; duplication is in the weights
    assert_same_tensors(out, modelopt_ckpt("gqa_dup", 4, 1), 4)
    assert_config_matches_modelopt(out, modelopt_ckpt("gqa_dup", 4, 1), "llama")
    verify_trtllm_checkpoint(out, hf_config(hf_model("gqa_dup")))


def test_gqa_duplication_with_qkv_bias(ours, modelopt_ckpt, hf_model):
    out = ours("qwen2_dup", 4, 2)
    assert_same_tensors(out, modelopt_ckpt("qwen2_dup", 4, 2), 8)
    src = load_file(hf_model("qwen2_dup") / "model.safetensors")
    rank3 = load_file(out / "rank3.safetensors")  # tp rank 3 -> KV head 1
    p = "model.layers.0.self_attn."
    assert torch.equal(rank3["transformer.layers.0.attention.qkv.bias"],
                       torch.cat([src[p + "q_proj.bias"][48:64], src[p + "k_proj.bias"][8:16], src[p + "v_proj.bias"][8:16]]))
    verify_trtllm_checkpoint(out, hf_config(hf_model("qwen2_dup")))


@pytest.mark.parametrize("tp", [2, 4])
def test_vocab_padded_to_multiple_of_tp(tp, ours, modelopt_ckpt, hf_model):
    out = ours("odd_vocab", tp, 1, chunk_bytes=1000)  # blocks of a few rows, padding included
    src = load_file(hf_model("odd_vocab") / "model.safetensors")
    per = -(-1001 // tp)
    for key, name in (("lm_head.weight", "lm_head.weight"), ("transformer.vocab_embedding.weight", "model.embed_tokens.weight")):
        parts = [load_file(out / f"rank{r}.safetensors")[key] for r in range(tp)]
        assert all(p.shape == (per, 64) for p in parts)
        full = torch.cat(parts)
        assert torch.equal(full[:1001], src[name])
        assert not full[1001:].any(), "padding rows are zeros"
    assert read_config(out)["vocab_size"] == 1001  # unpadded, like ModelOpt
    assert_same_tensors(out, modelopt_ckpt("odd_vocab", tp, 1), tp)
    verify_trtllm_checkpoint(out, hf_config(hf_model("odd_vocab")))


# ---------------------------------------------------------------------------------------------
# the verifier rejects, one line each
# ---------------------------------------------------------------------------------------------

def _edit_rank(folder: Path, rank: int, edit) -> None:
    path = folder / f"rank{rank}.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def _edit_config(folder: Path, edit) -> None:
    cfg = read_config(folder)
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


BROKEN = {
    "missing_tensor": (
        lambda d: _edit_rank(d, 1, lambda t: t.pop("transformer.layers.1.mlp.gate.weight")),
        ["rank1.safetensors", "transformer.layers.1.mlp.gate.weight", "missing", "BF16 [64, 64]"]),
    "unexpected_tensor": (
        lambda d: _edit_rank(d, 0, lambda t: t.update({"transformer.layers.0.attention.extra.weight": torch.zeros(2)})),
        ["rank0.safetensors", "transformer.layers.0.attention.extra.weight", "unexpected"]),
    "wrong_shape": (
        lambda d: _edit_rank(d, 2, lambda t: t.update({
            "transformer.layers.1.attention.qkv.weight": t["transformer.layers.1.attention.qkv.weight"][:32].clone()})),
        ["rank2.safetensors", "transformer.layers.1.attention.qkv.weight", "shape expected [64, 64], found [32, 64]"]),
    "wrong_dtype": (
        lambda d: _edit_rank(d, 3, lambda t: t.update({"transformer.ln_f.weight": t["transformer.ln_f.weight"].float()})),
        ["rank3.safetensors", "transformer.ln_f.weight", "dtype expected BF16, found F32"]),
    "mapping_disagrees": (
        lambda d: _edit_config(d, lambda c: c["mapping"].update({"tp_size": 4, "world_size": 8})),
        ["mapping", "world_size 8", "tp 4 x pp 2", "missing: rank4.safetensors", "rank7.safetensors"]),
    "rank_file_missing": (
        lambda d: (d / "rank3.safetensors").unlink(),
        ["world_size 4", "missing: rank3.safetensors", "unexpected: none"]),
    "rotary_base_missing": (
        lambda d: _edit_config(d, lambda c: c.pop("rotary_base")),
        ["config.json", "rotary_base missing", "rope_theta 500000.0"]),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_verifier_rejects(case, ours, hf_model, tmp_path):
    broken = tmp_path / "ckpt"
    shutil.copytree(ours("llama", 2, 2), broken)
    hf = hf_config(hf_model("llama"))
    verify_trtllm_checkpoint(broken, hf)
    edit, fragments = BROKEN[case]
    edit(broken)
    with pytest.raises(TrtbuildError) as info:
        verify_trtllm_checkpoint(broken, hf)
    message = str(info.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def _unquantized_in_float16(folder: Path) -> None:
    """What ModelOpt's export wrote when asked for float32 (it falls back to float16), under a
    config.json that says float32."""
    for rank in range(len(list(folder.glob("rank*.safetensors")))):
        _edit_rank(folder, rank, lambda t: t.update({k: v.half() for k, v in t.items()}))
    _edit_config(folder, lambda c: c.update(dtype="float32"))


def test_verifier_failure_is_one_line_with_every_problem_kept(ours, hf_model, tmp_path):
    broken = tmp_path / "ckpt"
    shutil.copytree(ours("llama", 1, 1), broken)
    _unquantized_in_float16(broken)
    with pytest.raises(CheckpointInvalid) as info:
        verify_trtllm_checkpoint(broken, hf_config(hf_model("llama")))
    problems = info.value.problems
    # 4 layers x (2 norms + 5 linears) + embedding, ln_f and lm_head
    assert len(problems) == 4 * 7 + 3 and all(p.endswith("dtype expected F32, found F16") for p in problems)
    assert problems[0] == "rank0.safetensors: lm_head.weight dtype expected F32, found F16"
    assert str(info.value) == f"{problems[0]}; and {len(problems) - 1} more problems"
    assert info.value.messages == [str(info.value)]


def test_checkpoint_stage_logs_every_problem_and_fails_in_one_line(ours, hf_model, tmp_path, capsys):
    """Through the worker, as the runner runs it: the log holds every problem, the failure line
    (to which the runner adds the log's path) holds the first and how many more."""
    from trtbuild.builder.stages import worker

    broken = tmp_path / "ckpt"
    shutil.copytree(ours("llama", 1, 1), broken)
    _unquantized_in_float16(broken)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(hf_config(hf_model("llama"))))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"entry": "test_trtllm_convert:_verify_stage", "out": str(broken),
                                "inputs": {"source": str(tmp_path / "hf")}, "params": {}, "runtime": {}}))
    assert worker.run(str(spec)) == 1
    out, err = capsys.readouterr()
    logged = [line for line in out.splitlines() if line.startswith("verify:")]
    assert logged[0] == "verify: ckpt: 31 problem(s):" and len(logged) == 32
    assert logged[1] == "verify:   rank0.safetensors: lm_head.weight dtype expected F32, found F16"
    assert err.splitlines()[-1] == (f"{worker.ERROR_PREFIX}CheckpointInvalid: rank0.safetensors: lm_head.weight "
                                    "dtype expected F32, found F16; and 30 more problems")


def _verify_stage(ctx) -> None:
    from trtbuild.builder.stages.checkpoint import _hf_config, verify

    verify(ctx.out, _hf_config(ctx.inputs["source"]))


_NVFP4_LINEARS = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")


def _as_nvfp4(folder: Path, kv_cache: bool) -> None:
    """Rewrite an unquantized checkpoint into the NVFP4 layout ModelOpt 0.47 exported on an H200
    (trtbuild/checkpoint/verify.py's docstring): FP4 pairs in U8 [out, in/2], FP8 block scales
    [out, in/16], scalar second-level and activation scales; scalar KV-cache scales."""
    def edit(tensors: dict) -> None:
        for name in [n for n in tensors if n.endswith(".weight") and any(f".{m}." in n for m in _NVFP4_LINEARS)]:
            module = name[: -len(".weight")]
            n_out, n_in = tensors[name].shape
            tensors[name] = torch.zeros(n_out, n_in // 2, dtype=torch.uint8)
            tensors[module + ".weights_scaling_factor"] = torch.zeros(n_out, n_in // 16, dtype=torch.float8_e4m3fn)
            tensors[module + ".weights_scaling_factor_2"] = torch.tensor(1.0)
            tensors[module + ".activation_scaling_factor"] = torch.tensor(1.0)
            if kv_cache and module.endswith("attention.qkv"):
                layer = module[: -len("qkv")]
                for scale in ("kv_cache_scaling_factor", "k_cache_scaling_factor", "v_cache_scaling_factor"):
                    tensors[layer + scale] = torch.tensor(1.0)

    for rank in range(len(list(folder.glob("rank*.safetensors")))):
        _edit_rank(folder, rank, edit)
    _edit_config(folder, lambda c: c.update(quantization={
        "quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4" if kv_cache else None, "group_size": 16,
        "exclude_modules": ["lm_head"]}))


@pytest.mark.parametrize("kv_cache", [False, True], ids=["nvfp4", "nvfp4-kv-nvfp4"])
def test_verifier_knows_the_measured_nvfp4_layout(kv_cache, ours, hf_model, tmp_path):
    nvfp4 = tmp_path / "ckpt"
    shutil.copytree(ours("llama", 2, 2), nvfp4)
    _as_nvfp4(nvfp4, kv_cache)
    hf = hf_config(hf_model("llama"))
    verify_trtllm_checkpoint(nvfp4, hf)
    # int4 packed the AWQ way (along the output dimension) is not NVFP4's layout
    name = "transformer.layers.1.mlp.proj.weight"
    _edit_rank(nvfp4, 2, lambda t: t.update({name: torch.zeros(t[name].shape[0] // 2, t[name].shape[1] * 2,
                                                                  dtype=torch.uint8)}))
    with pytest.raises(TrtbuildError, match=r"rank2.safetensors: transformer.layers.1.mlp.proj.weight shape expected"):
        verify_trtllm_checkpoint(nvfp4, hf)


def test_verifier_rejects_modelopt_qwen_until_fixed(modelopt_ckpt, hf_model, tmp_path):
    """ModelOpt's Qwen2 config lacks qwen_type/attn_bias; fix_trtllm_config adds them."""
    folder = tmp_path / "qwen"
    shutil.copytree(modelopt_ckpt("qwen2", 2, 1), folder)
    hf = hf_config(hf_model("qwen2"))
    with pytest.raises(TrtbuildError, match="qwen_type expected 'qwen2', found None"):
        verify_trtllm_checkpoint(folder, hf)
    changes = fix_trtllm_config(folder, hf, {"dtype": "bfloat16", "tp": 2, "pp": 1})
    assert changes == ["qwen_type: missing -> 'qwen2'", "attn_bias: missing -> True"]
    verify_trtllm_checkpoint(folder, hf)
    assert fix_trtllm_config(folder, hf, {"dtype": "bfloat16", "tp": 2, "pp": 1}) == []


# ---------------------------------------------------------------------------------------------
# fix_trtllm_config, and transformers-5 style rope_parameters
# ---------------------------------------------------------------------------------------------

def _transformers5_config(hf: dict) -> dict:
    """The same HF config as transformers >= 5 writes it: rope settings only in rope_parameters."""
    hf = dict(hf)
    theta, scaling = hf.pop("rope_theta"), hf.pop("rope_scaling", None)
    hf["rope_parameters"] = {"rope_theta": theta, **(scaling or {"rope_type": "default"})}
    return hf


@pytest.mark.parametrize("transformers5", [False, True], ids=["rope_theta", "rope_parameters"])
def test_fix_restores_rope_fields_modelopt_drops(transformers5, modelopt_ckpt, hf_model, tmp_path):
    folder = tmp_path / "llama"
    shutil.copytree(modelopt_ckpt("llama", 2, 1), folder)
    original = read_config(folder)
    assert original["rotary_base"] == 500000.0  # transformers 4.57.6: ModelOpt writes them ...
    _edit_config(folder, lambda c: (c.pop("rotary_base"), c.pop("rotary_scaling")))  # ... 5.x does not
    hf = hf_config(hf_model("llama"))
    if transformers5:
        hf = _transformers5_config(hf)
    with pytest.raises(CheckpointInvalid) as info:
        verify_trtllm_checkpoint(folder, hf)
    assert info.value.problems == [
        "config.json: rotary_base missing; the HF config has rope_theta 500000.0 (TensorRT-LLM would use 10000.0)",
        f"config.json: rotary_scaling missing; the HF config has rope_scaling {LLAMA3_SCALING}",
    ]
    assert str(info.value) == info.value.problems[0] + "; and 1 more problem"
    changes = fix_trtllm_config(folder, hf, {})
    assert changes == ["rotary_base: missing -> 500000.0", f"rotary_scaling: missing -> {LLAMA3_SCALING!r}"]
    fixed = read_config(folder)
    assert fixed["rotary_base"] == original["rotary_base"] and fixed["rotary_scaling"] == original["rotary_scaling"]
    verify_trtllm_checkpoint(folder, hf)


def test_fix_applies_requested_mapping_and_dtype(modelopt_ckpt, hf_model, tmp_path):
    folder = tmp_path / "mixtral"
    shutil.copytree(modelopt_ckpt("mixtral", 2, 1), folder)
    hf = hf_config(hf_model("mixtral"))
    changes = fix_trtllm_config(folder, hf, {"dtype": "float16", "tp": 1, "pp": 1})
    assert changes == ["dtype: 'bfloat16' -> 'float16'", "mapping.world_size: 2 -> 1", "mapping.tp_size: 2 -> 1",
                       "mapping.moe_tp_size: 2 -> 1", "rank: 1 -> 0"]
    # The rank files were not rewritten, so the verifier now (rightly) disagrees with the config.
    with pytest.raises(TrtbuildError, match="unexpected: rank1.safetensors"):
        verify_trtllm_checkpoint(folder, hf)


def test_converter_reads_transformers5_rope_parameters(hf_model, tmp_path):
    src = tmp_path / "llama5"
    shutil.copytree(hf_model("llama"), src)
    hf5 = _transformers5_config(hf_config(src))
    (src / "config.json").write_text(json.dumps(hf5))
    out = tmp_path / "out"
    report = convert_hf_to_trtllm(src, out, 2, 1, "bfloat16")
    cfg = read_config(out)
    assert cfg["rotary_base"] == 500000.0 and cfg["rotary_scaling"] == LLAMA3_SCALING
    verify_trtllm_checkpoint(out, hf5)
    assert report["tensors_per_rank"] == [31, 31] and report["bytes"] > 0 and report["peak_rss_bytes"] > 0


# ---------------------------------------------------------------------------------------------
# peak memory
# ---------------------------------------------------------------------------------------------

MEMORY_CHILD = textwrap.dedent("""
    import json, resource, sys
    import torch, safetensors.torch  # imported before the "before" reading: not the converter's cost
    from trtbuild.checkpoint.trtllm_convert import convert_hf_to_trtllm

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

    before = hwm()
    report = convert_hf_to_trtllm(sys.argv[1], sys.argv[2], 2, 1, "bfloat16")
    print(json.dumps({"before": before, "after": hwm(),
                      "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "bytes": report["bytes"]}))
""")


def test_streaming_peak_memory_is_far_below_model_size(tmp_path):
    """64 layers of small tensors (~250 MB of bf16, largest tensor 8 MB), TP2, sharded source.

    Loading the model would cost >= 1x its size in RSS, and holding one rank's tensors before
    writing its file >= 0.5x (TP2); streaming costs about one source block plus its converted copy
    (here whole tensors, <= 8 MB) plus allocator noise: measured ~10-20 MB, i.e. < 0.1x. The bound
    0.25x leaves room for that noise and still fails both non-streaming designs."""
    config = LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=768, num_hidden_layers=64,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    src = tmp_path / "hf"
    model.save_pretrained(src, max_shard_size="40MB")
    state = {k: v.clone() for k, v in model.state_dict().items() if "layers.63." in k}
    del model
    assert (src / "model.safetensors.index.json").is_file()

    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(src), str(out)], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    growth = measured["after"] - measured["before"]
    print(f"model {model_bytes / 2**20:.0f} MiB, largest tensor {largest / 2**20:.1f} MiB, "
          f"peak RSS growth {growth / 2**20:.1f} MiB ({growth / model_bytes:.3f}x)")
    assert 200 << 20 < model_bytes < 300 << 20 and largest < 10 << 20
    assert growth < 0.25 * model_bytes, (growth, model_bytes)

    # ... and what it wrote is right.
    verify_trtllm_checkpoint(out, hf_config(src))
    rank1 = load_file(out / "rank1.safetensors")
    assert torch.equal(rank1["transformer.layers.63.attention.dense.weight"],
                       state["model.layers.63.self_attn.o_proj.weight"][:, 256:])
    assert torch.equal(rank1["transformer.layers.63.mlp.fc.weight"], state["model.layers.63.mlp.gate_proj.weight"][384:])


def test_hf_cast_reads_the_index_shards_only(tmp_path):
    """Mistral repositories ship consolidated.safetensors beside the indexed shards: casting must not
    copy the weights twice nor put foreign names into the weight map."""
    from trtbuild.checkpoint.hf_cast import cast_checkpoint

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    save_file({"model.embed_tokens.weight": torch.ones(4, 2)}, src / "model-00001-of-00001.safetensors")
    save_file({"tok_embeddings.weight": torch.ones(4, 2)}, src / "consolidated.safetensors")
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}))
    (src / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    report = cast_checkpoint(src, out, "bfloat16")
    assert report["shards"] == 1 and not (out / "consolidated.safetensors").exists()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}
    assert load_file(out / "model-00001-of-00001.safetensors")["model.embed_tokens.weight"].dtype == torch.bfloat16


def test_progress_counts_every_byte_of_tensor_data(hf_model, tmp_path):
    seen = []
    report = convert_hf_to_trtllm(hf_model("llama"), tmp_path / "out", 2, 1, "bfloat16",
                                  lambda written, total: seen.append((written, total)), chunk_bytes=512)
    totals = {total for _, total in seen}
    assert len(seen) > 10 and len(totals) == 1  # many blocks, one total
    written = [w for w, _ in seen]
    assert written == sorted(written) and written[-1] == totals.pop()
    data = sum(end - start for r in range(2)
               for start, end in (info["data_offsets"] for info in
                                  read_safetensors_header(tmp_path / "out" / f"rank{r}.safetensors").values()))
    assert written[-1] == data and report["bytes"] > data  # the files add their headers


def test_int8_wo_is_the_unquantized_layout_with_quant_algo_w8a16(ours, hf_model, tmp_path):
    """TensorRT-LLM quantizes W8A16 itself at load: the converter writes int8_wo as the unquantized
    checkpoint, tensor for tensor, and only config.json (and quant_cfg.json) name the algorithm."""
    plain = ours("llama", 2, 1)
    report = convert_hf_to_trtllm(hf_model("llama"), tmp_path / "w8", 2, 1, "bfloat16", quant="int8_wo")
    assert report["quant_algo"] == "W8A16"
    for rank in (0, 1):
        mine, base = load_file(tmp_path / "w8" / f"rank{rank}.safetensors"), load_file(plain / f"rank{rank}.safetensors")
        assert mine.keys() == base.keys() and all(torch.equal(mine[k], base[k]) for k in base)
    config, base_config = (json.loads((d / "config.json").read_text()) for d in (tmp_path / "w8", plain))
    assert config.pop("quantization") == {"quant_algo": "W8A16", "kv_cache_quant_algo": None,
                                          "has_zero_point": False, "pre_quant_scale": False}
    base_config.pop("quantization")
    assert config == base_config
    assert json.loads((tmp_path / "w8" / "quant_cfg.json").read_text())["quant_algo"] == "W8A16"


@pytest.mark.parametrize("quant", ["fp8", "int4_wo", "bogus"])
def test_converter_refuses_formats_it_cannot_write(quant, hf_model, tmp_path):
    with pytest.raises(InvalidInput) as caught:
        convert_hf_to_trtllm(hf_model("llama"), tmp_path / "out", 1, 1, "bfloat16", quant=quant)
    assert str(caught.value) == (f"quant {quant!r}: the streaming converter writes only the formats TensorRT-LLM "
                                 "quantizes at load (int8_wo); others are exported by ModelOpt")
    assert not (tmp_path / "out").exists()  # nothing half-written
