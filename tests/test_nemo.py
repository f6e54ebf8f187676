"""The NeMo reader: real nemo-toolkit checkpoints and layouts built here from the documented rules
(reference/nemo.md) must all convert to their Hugging Face twin, bit for bit; bad archives are refused."""

from __future__ import annotations

import io
import json
import pickle
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import NEMO_DATA
from trtbuild.errors import InvalidInput
from trtbuild.nemo import convert
from trtbuild.nemo.archive import Limits

DATA = NEMO_DATA
NEMO1 = DATA / "nemo1_tiny_llama_gqa_fp32_torch_dist.nemo"
NEMO2 = DATA / "nemo2_tiny_llama_tied_bf16"
HF_GQA = DATA / "hf_tiny_llama_gqa_fp32"
HF_TIED = DATA / "hf_tiny_llama_tied_bf16"


NH, NG, D, H, FFN, L = 4, 2, 16, 64, 160, 2  # the tiny model (nemo.md section 4)
CONFIG_KEYS = ("architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps",
               "rope_theta", "tie_word_embeddings", "torch_dtype")


# --- comparing with the twin -------------------------------------------------------------------

def assert_tensors_equal(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert (g.dtype, tuple(g.shape)) == (w.dtype, tuple(w.shape)), name
        assert torch.equal(g, w), name


def assert_like_twin(out: Path, twin: Path, *, tensors: dict | None = None, config: dict | None = None) -> None:
    assert_tensors_equal(load_file(out / "model.safetensors"), tensors or load_file(twin / "model.safetensors"))
    got = json.loads((out / "config.json").read_text())
    want = {**json.loads((twin / "config.json").read_text()), **(config or {})}
    for key in CONFIG_KEYS:
        assert got.get(key) == want.get(key), key


# --- builders: HF tensors -> NeMo layouts, written from the rules in nemo.md section 2 ------------

def hf_twin(twin: Path = HF_GQA) -> dict:
    return load_file(twin / "model.safetensors")


def to_mcore(hf: dict, *, nh: int = NH, ng: int = NG, te_norms: bool = True) -> dict:
    """Per-layer mcore names (no prefix): grouped QKV interleave, fc1 = cat(gate, up)."""
    out = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"]}
    for i in range(L):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        q = hf[p + "self_attn.q_proj.weight"].reshape(ng, nh // ng, D, H)
        k = hf[p + "self_attn.k_proj.weight"].reshape(ng, 1, D, H)
        v = hf[p + "self_attn.v_proj.weight"].reshape(ng, 1, D, H)
        out[m + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, H)
        out[m + "self_attention.linear_proj.weight"] = hf[p + "self_attn.o_proj.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]])
        out[m + "mlp.linear_fc2.weight"] = hf[p + "mlp.down_proj.weight"]
        n1, n2 = (("self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight") if te_norms
                  else ("input_layernorm.weight", "pre_mlp_layernorm.weight"))
        out[m + n1] = hf[p + "input_layernorm.weight"]
        out[m + n2] = hf[p + "post_attention_layernorm.weight"]
        if p + "self_attn.q_proj.bias" in hf:
            qb, kb, vb = (hf[p + f"self_attn.{x}_proj.bias"].reshape(ng, -1, D) for x in "qkv")
            out[m + "self_attention.linear_qkv.bias"] = torch.cat([qb, kb, vb], dim=1).reshape(-1)
            out[m + "self_attention.linear_proj.bias"] = hf[p + "self_attn.o_proj.bias"]
        if p + "mlp.gate_proj.bias" in hf:
            out[m + "mlp.linear_fc1.bias"] = torch.cat([hf[p + "mlp.gate_proj.bias"], hf[p + "mlp.up_proj.bias"]])
            out[m + "mlp.linear_fc2.bias"] = hf[p + "mlp.down_proj.bias"]
    out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
    if "lm_head.weight" in hf:
        out["output_layer.weight"] = hf["lm_head.weight"]
    return out


def to_mha(hf: dict) -> dict:
    """The same function as an MHA model: each KV head repeated for its query heads (legacy is MHA only)."""
    out = dict(hf)
    for i in range(L):
        for part in ("k", "v"):
            name = f"model.layers.{i}.self_attn.{part}_proj.weight"
            out[name] = hf[name].reshape(NG, D, H).repeat_interleave(NH // NG, dim=0).reshape(NH * D, H)
    return out


def to_legacy(hf_mha: dict, *, fast: bool) -> dict:
    """model.language_model.* names: per-head [q;k;v]; fast-* keeps [gate; up] in dense_h_to_4h."""
    lm = "language_model."
    out = {lm + "embedding.word_embeddings.weight": hf_mha["model.embed_tokens.weight"],
           lm + "rotary_pos_emb.inv_freq": 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))}
    for i in range(L):
        p, m = f"model.layers.{i}.", f"{lm}encoder.layers.{i}."
        qkv = torch.cat([hf_mha[p + f"self_attn.{x}_proj.weight"].reshape(NH, 1, D, H) for x in "qkv"], dim=1)
        out[m + "self_attention.query_key_value.weight"] = qkv.reshape(-1, H)
        out[m + "self_attention.dense.weight"] = hf_mha[p + "self_attn.o_proj.weight"]
        gate, up = hf_mha[p + "mlp.gate_proj.weight"], hf_mha[p + "mlp.up_proj.weight"]
        if fast:
            out[m + "mlp.dense_h_to_4h.weight"] = torch.cat([gate, up])
        else:
            out[m + "mlp.dense_h_to_4h.weight"], out[m + "mlp.dense_h_to_4h_2.weight"] = gate, up
        out[m + "mlp.dense_4h_to_h.weight"] = hf_mha[p + "mlp.down_proj.weight"]
        out[m + "input_layernorm.weight"] = hf_mha[p + "input_layernorm.weight"]
        out[m + "post_attention_layernorm.weight"] = hf_mha[p + "post_attention_layernorm.weight"]
    out[lm + "encoder.final_layernorm.weight"] = hf_mha["model.norm.weight"]
    out[lm + "output_layer.weight"] = hf_mha["lm_head.weight"]
    return out


def split_tp(sd: dict, tp: int, *, glu: bool = True) -> list[dict]:
    """TP shards (megatron_change_num_partitions compute_tp_splits): column dim 0, row dim -1,
    fast-glu fc1 as per-rank [gate_r; up_r], norms replicated."""
    ranks: list[dict] = [{} for _ in range(tp)]
    for k, t in sd.items():
        if "norm" in k or k.endswith(("inv_freq", "linear_proj.bias", "linear_fc2.bias")):
            parts = [t] * tp  # row-parallel biases are added after the all-reduce: replicated
        elif k.endswith(("linear_proj.weight", "linear_fc2.weight", "dense.weight", "dense_4h_to_h.weight")):
            parts = list(t.chunk(tp, dim=-1))
        elif glu and k.endswith(("linear_fc1.weight", "linear_fc1.bias", "dense_h_to_4h.weight")):
            gate, up = t.chunk(2)
            parts = [torch.cat([g, u]) for g, u in zip(gate.chunk(tp), up.chunk(tp))]
        else:
            parts = list(t.chunk(tp, dim=0))
        for r in range(tp):
            ranks[r][k] = parts[r].clone()
    return ranks


def split_pp(sd: dict, pp: int) -> list[dict]:
    """PP stages: layers renumbered from 0 per stage; embedding first, final norm and head last."""
    per = L // pp
    stages: list[dict] = [{} for _ in range(pp)]
    for k, t in sd.items():
        if ".layers." in k:
            head, rest = k.split(".layers.", 1)
            idx, tail = rest.split(".", 1)
            s = int(idx) // per
            stages[s][f"{head}.layers.{int(idx) - s * per}.{tail}"] = t
        elif "embedding" in k:
            stages[0][k] = t
        else:
            stages[-1][k] = t
    return stages


def stack_layers(sd: dict) -> dict:
    """Dist-checkpoint global tensors: layers stacked on dim 0, no index in the key (nemo.md section 0)."""
    out, stacked = {}, {}
    for k, t in sd.items():
        if k.startswith("decoder.layers."):
            idx, tail = k[len("decoder.layers."):].split(".", 1)
            stacked.setdefault("decoder.layers." + tail, {})[int(idx)] = t
        else:
            out[k] = t
    for k, per in stacked.items():
        out[k] = torch.stack([per[i] for i in range(len(per))])
    return out


def write_zarr(folder: Path, sd: dict, prefix: str) -> None:
    """A zarr v2 dist checkpoint as mcore writes it: one folder per key, .zarray + raw C-order chunks."""
    folder.mkdir(parents=True)
    (folder / "metadata.json").write_text(json.dumps({"sharded_backend": "zarr", "sharded_backend_version": 1,
                                                      "common_backend": "torch", "common_backend_version": 1}))
    for key, t in sd.items():
        d = folder / (prefix + key)
        d.mkdir()
        if key.startswith("decoder.layers."):
            chunks = [1, *t.shape[1:]]
            if "linear_fc1.weight" in key:
                chunks[1] = FFN  # two chunks per layer, like apply_swiglu_sharded_factory
        else:
            chunks = [600, *t.shape[1:]] if t.dim() == 2 else list(t.shape)  # 1000 rows: a padded edge chunk
        bf16 = t.dtype == torch.bfloat16
        arr = (t.view(torch.int16) if bf16 else t).numpy()
        (d / ".zarray").write_text(json.dumps({
            "chunks": chunks, "compressor": None, "dtype": "bfloat16" if bf16 else arr.dtype.str,
            "fill_value": None, "filters": None, "order": "C", "shape": list(t.shape), "zarr_format": 2}))
        grid = [-(-s // c) for s, c in zip(t.shape, chunks)]
        for index in torch.cartesian_prod(*[torch.arange(g) for g in grid]).reshape(-1, len(grid)).tolist():
            block = arr[tuple(slice(i * c, (i + 1) * c) for i, c in zip(index, chunks))]
            pad = [(0, c - s) for s, c in zip(block.shape, chunks)]
            (d / ".".join(map(str, index))).write_bytes(np.pad(block, pad).tobytes())
    extra = folder / f"{prefix}decoder.layers.mlp.linear_fc1._extra_state"
    extra.mkdir()
    (extra / "shard_0_2.pt").write_bytes(pickle.dumps(_Boom(str(folder / "BOOM"))))  # never loaded


class _Boom:
    """Unpickling this runs code (writes a marker file): loaders must refuse or never touch it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


# --- .nemo helpers -------------------------------------------------------------------------------

def nemo_parts() -> tuple[dict, str, bytes]:
    """The real checkpoint's model_config.yaml (as a dict) and its tokenizer artifact."""
    with tarfile.open(NEMO1) as tar:
        cfg = yaml.safe_load(tar.extractfile("./model_config.yaml").read())
        name = cfg["tokenizer"]["model"][len("nemo:"):]
        return cfg, name, tar.extractfile("./" + name).read()


def nemo_folder(tmp: Path, weights: dict[str, dict] | None = None, **overrides) -> Path:
    """An extracted .nemo: model_config.yaml (+ overrides), the tokenizer, weights {relative path: state dict}."""
    cfg, tok_name, tok = nemo_parts()
    cfg.update(overrides)
    folder = tmp / "nemo"
    folder.mkdir()
    (folder / "model_config.yaml").write_text(yaml.safe_dump(cfg))
    (folder / tok_name).write_bytes(tok)
    for rel, sd in (weights or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        torch.save(sd, folder / rel)
    return folder


def pack(folder: Path, path: Path, mode: str = "w:") -> Path:
    with tarfile.open(path, mode) as tar:  # what NeMo's _make_nemo_file_from_folder does
        tar.add(folder, arcname=".")
    return path


def prefixed(sd: dict, prefix: str = "model.") -> dict:
    return {prefix + k: v for k, v in sd.items()}


# --- real checkpoints ----------------------------------------------------------------------------

def test_real_nemo1_tar_matches_hf_twin(tmp_path):
    report = convert(NEMO1, tmp_path / "out")
    assert_like_twin(tmp_path / "out", HF_GQA)
    assert (report["form"], report["weights"], report["key_style"], report["tensors"]) == \
        ("nemo-tar", "torch_dist", "mcore", 21)
    assert (report["dtype"], report["vocab_size"], report["vocab_rows_trimmed"]) == ("float32", 1000, 0)
    # The file itself is what save_pretrained wrote, and the tokenizer files equal the twin's.
    for name in ("model.safetensors", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / "out" / name).read_bytes() == (HF_GQA / name).read_bytes(), name
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # scratch space removed


def test_real_nemo1_extracted_folder_matches_hf_twin(tmp_path):
    with tarfile.open(NEMO1) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    report = convert(tmp_path / "x", tmp_path / "out", work=tmp_path / "work")
    assert report["form"] == "nemo-dir"
    assert_like_twin(tmp_path / "out", HF_GQA)
    assert list((tmp_path / "work").iterdir()) == []  # scratch removed, the folder itself left alone


def test_real_nemo2_folder_matches_hf_twin(tmp_path):
    report = convert(NEMO2, tmp_path / "out")
    assert_like_twin(tmp_path / "out", HF_TIED)
    assert (report["form"], report["nemo_version"], report["dtype"], report["tied_embeddings"]) == \
        ("nemo2-dir", 2, "bfloat16", True)
    for name in ("model.safetensors", "generation_config.json", "tokenizer.model", "tokenizer_config.json",
                 "special_tokens_map.json"):
        assert (tmp_path / "out" / name).read_bytes() == (HF_TIED / name).read_bytes(), name
    assert "lm_head.weight" not in load_file(tmp_path / "out" / "model.safetensors")


def test_gzip_nemo(tmp_path):
    with tarfile.open(NEMO1) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    report = convert(pack(tmp_path / "x", tmp_path / "old.nemo", "w:gz"), tmp_path / "out")
    assert report["compressed"] is True
    assert_like_twin(tmp_path / "out", HF_GQA)


# --- layouts built from the rules ---------------------------------------------------------------

def test_zarr_nemo1(tmp_path):
    folder = nemo_folder(tmp_path)
    write_zarr(folder / "model_weights", stack_layers(to_mcore(hf_twin())), "model.")
    report = convert(pack(folder, tmp_path / "z.nemo"), tmp_path / "out")
    assert report["weights"] == "zarr"
    assert_like_twin(tmp_path / "out", HF_GQA)
    assert not (folder / "model_weights" / "BOOM").exists()


def test_zarr_nemo2_bf16(tmp_path):
    folder = tmp_path / "n2"
    shutil.copytree(NEMO2 / "context", folder / "context")
    write_zarr(folder / "weights", stack_layers(to_mcore(hf_twin(HF_TIED))), "module.")
    assert json.loads((folder / "weights" / "module.embedding.word_embeddings.weight" / ".zarray").read_text())[
        "dtype"] == "bfloat16"
    report = convert(folder, tmp_path / "out")
    assert (report["weights"], report["dtype"]) == ("zarr", "bfloat16")
    assert_like_twin(tmp_path / "out", HF_TIED)
    assert not (folder / "weights" / "BOOM").exists()  # the planted pickle was never unpickled


@pytest.mark.parametrize("te_norms", [True, False], ids=["te-names", "local-spec-names"])
def test_nondist_ckpt_mcore_names(tmp_path, te_norms):
    sd = prefixed(to_mcore(hf_twin(), te_norms=te_norms))
    sd["model.decoder.layers.0.self_attention.linear_qkv._extra_state"] = io.BytesIO(b"te fp8 meta")
    sd["model.decoder.layers.1.mlp.linear_fc1._extra_state"] = None
    folder = nemo_folder(tmp_path, {"model_weights.ckpt": sd}, transformer_engine=te_norms)
    report = convert(pack(folder, tmp_path / "c.nemo"), tmp_path / "out")
    assert (report["weights"], report["key_style"]) == ("ckpt", "mcore")
    assert_like_twin(tmp_path / "out", HF_GQA)


@pytest.mark.parametrize("activation", ["fast-swiglu", "swiglu"])
def test_nondist_ckpt_legacy_names(tmp_path, activation):
    mha = to_mha(hf_twin())
    sd = prefixed(to_legacy(mha, fast=activation.startswith("fast-")))
    folder = nemo_folder(tmp_path, {"model_weights.ckpt": sd}, mcore_gpt=False, num_query_groups=None,
                         activation=activation)
    report = convert(folder, tmp_path / "out")
    assert report["key_style"] == "legacy"
    assert_like_twin(tmp_path / "out", HF_GQA, tensors=mha, config={"num_key_value_heads": NH})


def test_megatron_amp_o2_prefix(tmp_path):
    sd = prefixed(to_mcore(hf_twin()), "model.module.")
    folder = nemo_folder(tmp_path, {"model_weights.ckpt": sd}, megatron_amp_O2=True)
    convert(folder, tmp_path / "out")
    assert_like_twin(tmp_path / "out", HF_GQA)


def test_tp2_mp_rank_shards_merge_back(tmp_path):
    shards = split_tp(prefixed(to_mcore(hf_twin())), 2)
    assert shards[0]["model.decoder.layers.0.mlp.linear_fc1.weight"].shape == (FFN, H)  # [gate_0; up_0]
    folder = nemo_folder(tmp_path, {f"mp_rank_{r:02d}/model_weights.ckpt": s for r, s in enumerate(shards)},
                         tensor_model_parallel_size=2)
    report = convert(pack(folder, tmp_path / "tp.nemo"), tmp_path / "out")
    assert report["weights_details"]["tp"] == 2
    assert_like_twin(tmp_path / "out", HF_GQA)


def test_tp2_pp2_shards_merge_back(tmp_path):
    stages = split_pp(prefixed(to_mcore(hf_twin()), ""), 2)
    weights = {}
    for pp, stage in enumerate(stages):
        for tp, shard in enumerate(split_tp(prefixed(stage), 2)):
            weights[f"tp_rank_{tp:02d}_pp_rank_{pp:03d}/model_weights.ckpt"] = shard
    folder = nemo_folder(tmp_path, weights, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    report = convert(folder, tmp_path / "out")
    assert (report["weights_details"]["tp"], report["weights_details"]["pp"]) == (2, 2)
    assert_like_twin(tmp_path / "out", HF_GQA)


def test_legacy_tp2_fast_glu_merge(tmp_path):
    mha = to_mha(hf_twin())
    shards = split_tp(prefixed(to_legacy(mha, fast=True)), 2)
    folder = nemo_folder(tmp_path, {f"mp_rank_{r:02d}/model_weights.ckpt": s for r, s in enumerate(shards)},
                         mcore_gpt=False, num_query_groups=None, tensor_model_parallel_size=2)
    convert(folder, tmp_path / "out")
    assert_like_twin(tmp_path / "out", HF_GQA, tensors=mha, config={"num_key_value_heads": NH})


def test_vocab_padding_is_trimmed(tmp_path):
    sd = to_mcore(hf_twin())
    gen = torch.Generator().manual_seed(0)
    for key in ("embedding.word_embeddings.weight", "output_layer.weight"):  # 1000 -> 1024 rows (128 x tp 2)
        sd[key] = torch.cat([sd[key], torch.randn(24, H, generator=gen)])
    shards = split_tp(prefixed(sd), 2)
    folder = nemo_folder(tmp_path, {f"mp_rank_{r:02d}/model_weights.ckpt": s for r, s in enumerate(shards)},
                         tensor_model_parallel_size=2, make_vocab_size_divisible_by=128)
    report = convert(folder, tmp_path / "out")
    assert (report["vocab_size"], report["padded_vocab_size"], report["vocab_rows_trimmed"]) == (1000, 1024, 24)
    assert_like_twin(tmp_path / "out", HF_GQA)


def test_zero_centered_gamma_adds_one(tmp_path):
    hf = hf_twin()
    sd = to_mcore(hf)
    for k in sd:
        if "norm" in k:
            assert bool(((sd[k] >= 0.5) & (sd[k] <= 2)).all())  # so w - 1 and (w - 1) + 1 are exact in fp32
            sd[k] = sd[k] - 1
    folder = nemo_folder(tmp_path, {"model_weights.ckpt": prefixed(sd)}, layernorm_zero_centered_gamma=True)
    report = convert(folder, tmp_path / "out")
    assert report["zero_centered_gamma"] is True
    assert_like_twin(tmp_path / "out", HF_GQA)


def test_layernorm1p_is_refused_naming_it(tmp_path):
    folder = nemo_folder(tmp_path, {"model_weights.ckpt": prefixed(to_mcore(hf_twin()))}, normalization="layernorm1p")
    with pytest.raises(InvalidInput, match="normalization: layernorm1p"):
        convert(folder, tmp_path / "out")


def with_biases(hf: dict) -> dict:
    """The twin plus random q/k/v/o and MLP biases (add_bias_linear: true)."""
    gen = torch.Generator().manual_seed(1)
    out = dict(hf)
    for i in range(L):
        p = f"model.layers.{i}."
        for name, n in (("self_attn.q_proj", NH * D), ("self_attn.k_proj", NG * D), ("self_attn.v_proj", NG * D),
                        ("self_attn.o_proj", H), ("mlp.gate_proj", FFN), ("mlp.up_proj", FFN), ("mlp.down_proj", H)):
            out[p + name + ".bias"] = torch.randn(n, generator=gen)
    return out


def assert_loads_in_transformers(out: Path) -> None:
    from transformers import LlamaForCausalLM

    model, info = LlamaForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


@pytest.mark.parametrize("tp", [1, 2])
def test_linear_biases(tmp_path, tp):
    hf = with_biases(hf_twin())
    shards = split_tp(prefixed(to_mcore(hf)), tp)
    files = ({"model_weights.ckpt": shards[0]} if tp == 1 else
             {f"mp_rank_{r:02d}/model_weights.ckpt": s for r, s in enumerate(shards)})
    folder = nemo_folder(tmp_path, files, bias=True, tensor_model_parallel_size=tp)
    convert(folder, tmp_path / "out")
    assert_like_twin(tmp_path / "out", HF_GQA, tensors=hf)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["attention_bias"], config["mlp_bias"]) == (True, True)
    if tp == 1:
        assert_loads_in_transformers(tmp_path / "out")


def test_qkv_bias_only_gets_zero_o_bias(tmp_path):
    hf = with_biases(hf_twin())
    sd = to_mcore(hf)
    for k in [k for k in sd if k.endswith(("linear_proj.bias", "linear_fc1.bias", "linear_fc2.bias"))]:
        del sd[k]
    folder = nemo_folder(tmp_path, {"model_weights.ckpt": prefixed(sd)}, bias=False, qkv_bias=True)
    convert(folder, tmp_path / "out")
    got = load_file(tmp_path / "out" / "model.safetensors")
    assert torch.equal(got["model.layers.1.self_attn.k_proj.bias"], hf["model.layers.1.self_attn.k_proj.bias"])
    assert torch.equal(got["model.layers.1.self_attn.o_proj.bias"], torch.zeros(H))
    assert "model.layers.1.mlp.up_proj.bias" not in got
    assert_loads_in_transformers(tmp_path / "out")


def test_nemo2_tied_output_loads_in_transformers(tmp_path):
    convert(NEMO2, tmp_path / "out")
    assert_loads_in_transformers(tmp_path / "out")


def test_nemo2_weights_at_top_level_and_sentencepiece_tokenizer(tmp_path):
    """Early 2.0 checkpoints had the dist-ckpt beside context/; a SentencePieceTokenizer context."""
    folder = tmp_path / "n2"
    shutil.copytree(NEMO2 / "context", folder / "context")
    for f in (NEMO2 / "weights").iterdir():
        shutil.copyfile(f, folder / f.name)
    doc = yaml.safe_load((folder / "context" / "model.yaml").read_text())
    doc["tokenizer"] = {"_target_": "nemo.collections.common.tokenizers.sentencepiece_tokenizer."
                                    "SentencePieceTokenizer", "model_path": "nemo_tokenizer/tokenizer.model"}
    (folder / "context" / "model.yaml").write_text(yaml.safe_dump(doc))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / "context" / "nemo_tokenizer" / name).unlink()
    report = convert(folder, tmp_path / "out")
    assert report["tokenizer"]["kind"] == "sentencepiece"
    assert_like_twin(tmp_path / "out", HF_TIED)
    for name in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / "out" / name).read_bytes() == (HF_TIED / name).read_bytes(), name


@pytest.mark.parametrize("nemo2,override,scaling", [
    (False, {"scale_positional_embedding": True},
     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}),
    (False, {"seq_len_interpolation_factor": 4}, {"rope_type": "linear", "factor": 4.0}),
    (True, {"_target_": "nemo.collections.llm.gpt.model.llama.Llama31Config", "scale_factor": 32,
            "low_freq_factor": 1, "high_freq_factor": 4, "old_context_len": 8192},
     {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}),
], ids=["nemo1-llama31", "nemo1-linear", "nemo2-llama32"])
def test_rope_scaling(tmp_path, nemo2, override, scaling):
    if nemo2:
        folder = tmp_path / "n2"
        shutil.copytree(NEMO2, folder)
        doc = yaml.safe_load((folder / "context" / "model.yaml").read_text())
        doc["config"].update(override)
        (folder / "context" / "model.yaml").chmod(0o644)
        (folder / "context" / "model.yaml").write_text(yaml.safe_dump(doc))
    else:
        folder = nemo_folder(tmp_path, {"model_weights.ckpt": prefixed(to_mcore(hf_twin()))}, **override)
    convert(folder, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["rope_scaling"] == scaling


# --- unsupported models --------------------------------------------------------------------------

@pytest.mark.parametrize("override,needle", [
    ({"num_moe_experts": 8}, "num_moe_experts: 8"),
    ({"activation": "gelu"}, "activation 'gelu'"),
    ({"position_embedding_type": "learned_absolute"}, "position_embedding_type: learned_absolute"),
])
def test_unsupported_model_is_named(tmp_path, override, needle):
    folder = nemo_folder(tmp_path, {"model_weights.ckpt": prefixed(to_mcore(hf_twin()))}, **override)
    with pytest.raises(InvalidInput, match=needle) as err:
        convert(folder, tmp_path / "out")
    assert "model_config.yaml" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_unknown_key_is_named(tmp_path):
    sd = prefixed(to_mcore(hf_twin()))
    sd["model.decoder.layers.0.self_attention.q_layernorm.weight"] = torch.ones(D)
    folder = nemo_folder(tmp_path, {"model_weights.ckpt": sd})
    with pytest.raises(InvalidInput, match="unknown key 'model.decoder.layers.0.self_attention.q_layernorm.weight'"):
        convert(folder, tmp_path / "out")


# --- security ------------------------------------------------------------------------------------

def _evil_tar(path: Path, member: tarfile.TarInfo, data: bytes = b"x") -> Path:
    cfg, tok_name, tok = nemo_parts()
    with tarfile.open(path, "w:") as tar:
        raw = yaml.safe_dump(cfg).encode()
        info = tarfile.TarInfo("./model_config.yaml")
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
        if member.isreg():
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        else:
            tar.addfile(member)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("member,needle", [
    (_member("./../evil"), "unsafe member name './../evil'"),
    (_member("/tmp/abs_evil_nemo"), "unsafe member name '/tmp/abs_evil_nemo'"),
    (_member("./link", tarfile.SYMTYPE, "/etc/passwd"), "links outside the archive ('/etc/passwd')"),
    (_member("./up", tarfile.SYMTYPE, "../../x"), "links outside the archive"),
    (_member("./hard", tarfile.LNKTYPE, "../../etc/passwd"), "hard-links outside"),
    (_member("./fifo", tarfile.FIFOTYPE), "device, fifo"),
    (_member("./dev", tarfile.CHRTYPE), "device, fifo"),
], ids=["dotdot", "absolute", "symlink-abs", "symlink-rel", "hardlink", "fifo", "chardev"])
def test_unsafe_archive_members_are_refused(tmp_path, member, needle):
    nemo = _evil_tar(tmp_path / "evil.nemo", member)
    with pytest.raises(InvalidInput, match=needle.replace("(", r"\(").replace(")", r"\)")) as err:
        convert(nemo, tmp_path / "out" / "model")
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.nemo", "out"]  # no evil, work dir removed
    assert list((tmp_path / "out").iterdir()) == []
    assert not Path("/tmp/abs_evil_nemo").exists()


def test_oversize_archive_is_refused_before_writing(tmp_path):
    nemo = _evil_tar(tmp_path / "big.nemo", _member("./big.bin"), b"\0" * 5000)
    for limits, needle in ((Limits(max_member_bytes=4096), "'./big.bin' is 5000 bytes"),
                           (Limits(max_total_bytes=4096), "total more than 4096 bytes"),
                           (Limits(max_members=1), "more than 1 members")):
        work = tmp_path / "work"
        with pytest.raises(InvalidInput, match=needle):
            convert(nemo, tmp_path / "out", work=work, limits=limits)
        assert not any(work.rglob("*.bin")) and not any(work.rglob("*.yaml"))


def test_pickled_object_in_ckpt_is_refused(tmp_path):
    marker = tmp_path / "ran"
    folder = nemo_folder(tmp_path)
    torch.save({"model.x": _Boom(str(marker))}, folder / "model_weights.ckpt")
    with pytest.raises(InvalidInput, match="weights_only=True load: exec is not allowed") as err:
        convert(folder, tmp_path / "out")
    assert "\n" not in str(err.value)
    assert not marker.exists()


def test_pickled_object_in_dcp_metadata_is_refused(tmp_path):
    marker = tmp_path / "ran"
    with tarfile.open(NEMO1) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    (tmp_path / "x" / "model_weights" / ".metadata").write_bytes(pickle.dumps(_Boom(str(marker))))
    with pytest.raises(InvalidInput, match="refusing to load builtins.exec"):
        convert(tmp_path / "x", tmp_path / "out")
    assert not marker.exists()
