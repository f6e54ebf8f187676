"""The checkpoint stages through `trtbuild build`, on tiny real models (tests/tinymodels.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import needs_no_gpu, stage_log
from tinymodels import make_model, make_tokenizer
from trtbuild.checkpoint.verify import verify_trtllm_checkpoint


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def run(recipe: Path, store: Path, *args) -> dict:
    result = subprocess.run([sys.executable, "-m", "trtbuild", "build", str(recipe), "--until", "checkpoint", "--json", *args],
                            capture_output=True, text=True, env={**os.environ, "TRTBUILD_CACHE": str(store)}, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return {t["name"]: t for t in json.loads(result.stdout)["targets"]}


def write(folder: Path, body: str) -> Path:
    recipe = folder / "recipe.yaml"
    recipe.write_text(body)
    return recipe


LLAMA_RECIPE = """
schema: 1
name: tiny-llama
source: {{path: model}}
dtype: bfloat16
variants:
  bf16: {{}}
  fp8: {{quant: fp8, kv_cache: fp8}}
  awq: {{quant: int4_awq, group_size: 32}}
  fp4: {{quant: nvfp4}}
calibration: {{text: {text}, samples: 4, seq_len: 32}}
parallelism: [{{tp: 1}}, {{tp: 2}}, {{tp: 1, pp: 2}}]
gpus: [sm100]
limits: {{max_input_len: 128, max_seq_len: 256}}
backends: [engine, hf-checkpoint]
exclude:
  - {{variant: awq, pp: 2}}
"""


@pytest.fixture(scope="module")
def llama(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("llama")
    make_model(folder / "model", "llama", tokenizer, rope_theta=500000.0,
               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64})
    (folder / "texts" / "a").mkdir(parents=True)
    from tinymodels import pydoc_text

    (folder / "texts" / "a" / "calibration.txt").write_text(pydoc_text()[:20000])
    store = folder / "store"
    first = run(write(folder, LLAMA_RECIPE.format(text="texts/a")), store)
    return folder, store, first


def test_every_checkpoint_is_built_verified_and_quantized_once(llama):
    folder, store, first = llama
    hf_config = json.loads((folder / "model" / "config.json").read_text())
    for name in ("bf16-tp1", "bf16-tp2", "bf16-tp1-pp2", "fp8-tp1", "fp8-tp2", "fp8-tp1-pp2", "awq-tp1", "awq-tp2"):
        assert first[name]["status"] == "built", (name, first[name]["reason"])
        ckpt = Path(first[name]["path"])
        verify_trtllm_checkpoint(ckpt, hf_config)  # names, shapes and dtypes per rank
        config = json.loads((ckpt / "config.json").read_text())
        assert config["rotary_base"] == 500000.0 and config["rotary_scaling"]["rope_type"] == "llama3"
        assert not (ckpt / "logs").exists()  # the log is the action record's, not the artifact's
        if name.startswith("bf16"):  # the streaming converter logs its progress
            assert "MiB written" in stage_log(store, first[name]["key"], "checkpoint.log")
    fp8 = json.loads((Path(first["fp8-tp2"]["path"]) / "config.json").read_text())
    assert (fp8["quantization"]["quant_algo"], fp8["quantization"]["kv_cache_quant_algo"]) == ("FP8", "FP8")
    assert fp8["mapping"]["tp_size"] == 2 and fp8["dtype"] == "bfloat16"
    awq = json.loads((Path(first["awq-tp1"]["path"]) / "config.json").read_text())["quantization"]
    assert awq["quant_algo"] == "W4A16_AWQ" and awq["group_size"] == 32
    # one calibration set and one quantized model per variant, shared by every parallelism and the HF form
    assert first["calibration"]["status"] == "built"
    assert first["fp8-quantized"]["status"] == first["awq-quantized"]["status"] == "built"
    hf = Path(first["fp8-hf"]["path"])
    assert json.loads((hf / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == "FP8"
    assert (hf / "tokenizer.json").exists() and json.loads((hf / "config.json").read_text())["quantization_config"]
    assert json.loads((Path(first["bf16-hf"]["path"]) / "config.json").read_text())["torch_dtype"] == "bfloat16"


@needs_no_gpu
def test_nvfp4_is_skipped_on_a_cpu_host(llama):
    _, _, first = llama
    assert first["fp4-quantized"]["status"] == "skipped"
    assert first["fp4-quantized"]["reason"].startswith("needs a CUDA GPU: quantization nvfp4: NVFP4 uses dynamic block quantization")
    assert first["fp4-tp1"]["reason"] == "needs fp4-quantized, which was skipped"


def test_tp_shards_are_slices_of_the_same_quantized_weights(llama):
    _, _, first = llama
    one = load_file(Path(first["fp8-tp1"]["path"]) / "rank0.safetensors")
    halves = [load_file(Path(first["fp8-tp2"]["path"]) / f"rank{r}.safetensors") for r in (0, 1)]
    for layer in (0, 1):
        prefix = f"transformer.layers.{layer}."
        for name, dim in (("attention.dense.weight", 1), ("mlp.proj.weight", 1), ("mlp.fc.weight", 0), ("mlp.gate.weight", 0)):
            whole = one[prefix + name].view(torch.uint8)
            joined = torch.cat([h[prefix + name].view(torch.uint8) for h in halves], dim=dim)
            assert torch.equal(whole, joined), prefix + name
            scale = prefix + name.replace(".weight", ".weights_scaling_factor")
            assert all(torch.equal(one[scale], h[scale]) for h in halves)
    # and the stage-1/stage-2 split of pp2 holds the same layers as tp1
    stages = [load_file(Path(first["fp8-tp1-pp2"]["path"]) / f"rank{r}.safetensors") for r in (0, 1)]
    assert torch.equal(stages[1]["transformer.layers.0.mlp.fc.weight"].view(torch.uint8),
                       one["transformer.layers.1.mlp.fc.weight"].view(torch.uint8))


def test_second_run_and_moved_calibration_text_rebuild_nothing(llama):
    folder, store, first = llama
    (folder / "texts" / "a").rename(folder / "texts" / "b")  # the same text in another folder
    again = run(write(folder, LLAMA_RECIPE.format(text="texts/b")), store)
    built = [name for name, t in again.items() if t["status"] == "built"]
    assert built == []
    assert again["calibration"]["key"] == first["calibration"]["key"]
    (folder / "texts" / "b").rename(folder / "texts" / "a")


def test_changed_calibration_text_rebuilds_only_quantized_variants(llama):
    folder, store, first = llama
    (folder / "texts" / "c").mkdir()
    (folder / "texts" / "c" / "calibration.txt").write_text((folder / "texts" / "a" / "calibration.txt").read_text()[::-1])
    changed = run(write(folder, LLAMA_RECIPE.format(text="texts/c")), store)
    assert changed["calibration"]["status"] == "built" and changed["calibration"]["digest"] != first["calibration"]["digest"]
    assert changed["fp8-quantized"]["status"] == "built" and changed["fp8-tp1"]["status"] == "built"
    assert changed["bf16-tp1"]["status"] == "cached" and changed["bf16-hf"]["status"] == "cached"
    assert changed["source"]["status"] == "cached"


@pytest.mark.parametrize("arch, extra", [("qwen2", {}), ("mistral", {}), ("mixtral", {"num_local_experts": 4})])
def test_other_families(tmp_path, tokenizer, arch, extra):
    make_model(tmp_path / "model", arch, tokenizer, **extra)
    variants = "{bf16: {}}" if arch == "mixtral" else "{bf16: {}, fp8: {quant: fp8}}"
    recipe = write(tmp_path, f"""
schema: 1
name: tiny-{arch}
source: {{path: model}}
variants: {variants}
calibration: {{samples: 2, seq_len: 32}}
parallelism: [{{tp: 2}}]
gpus: [sm90]
limits: {{max_input_len: 128, max_seq_len: 256}}
""")
    built = run(recipe, tmp_path / "store")
    hf_config = json.loads((tmp_path / "model" / "config.json").read_text())
    checkpoints = {name for name, target in built.items() if target["stage"] == "checkpoint"}
    assert checkpoints == ({"bf16-tp2"} if arch == "mixtral" else {"bf16-tp2", "fp8-tp2"})
    for name, target in built.items():
        if target["stage"] == "checkpoint":
            assert target["status"] == "built", (name, target["reason"])
            verify_trtllm_checkpoint(Path(target["path"]), hf_config)
            config = json.loads((Path(target["path"]) / "config.json").read_text())
            if arch == "qwen2":
                assert config["qwen_type"] == "qwen2" and config["rotary_base"] == 1e6


def test_int8_wo_builds_its_float_w8a16_checkpoint_and_int4_wo_its_hf_checkpoint(tmp_path, tokenizer):
    """TensorRT-LLM 1.2 quantizes W8A16 itself at load: int8_wo's TensorRT-LLM checkpoint is the
    source's float weights converted, with `quant_algo: W8A16`, and no calibration runs for it. No
    serving runtime claims its Hugging Face checkpoint (trtbuild/facts/serving.py): impossible. int4_wo
    (exported as W4A16_AWQ, which TensorRT-LLM's PyTorch backend serves) is built."""
    make_model(tmp_path / "model", "llama", tokenizer)
    recipe = write(tmp_path, """
schema: 1
name: tiny-weight-only
source: {path: model}
variants: {w8: {quant: int8_wo}, w4: {quant: int4_wo, group_size: 32}}
calibration: {samples: 2, seq_len: 32}
gpus: [sm90]
limits: {max_input_len: 128, max_seq_len: 256}
backends: [engine, hf-checkpoint]
exclude: [{variant: w4, backend: engine}]
""")
    built = run(recipe, tmp_path / "store")
    assert built["w8-tp1"]["status"] == "built", built["w8-tp1"]["reason"]
    ckpt = Path(built["w8-tp1"]["path"])
    hf_config = json.loads((tmp_path / "model" / "config.json").read_text())
    verify_trtllm_checkpoint(ckpt, hf_config)
    assert json.loads((ckpt / "config.json").read_text())["quantization"]["quant_algo"] == "W8A16"
    tensors, source = load_file(ckpt / "rank0.safetensors"), load_file(tmp_path / "model" / "model.safetensors")
    assert torch.equal(tensors["transformer.layers.0.attention.dense.weight"],
                       source["model.layers.0.self_attn.o_proj.weight"])
    assert built["w8-hf"]["status"] == "impossible"
    assert built["w8-hf"]["reason"].startswith("no runtime serves INT8 weight-only on sm90: trtllm>=1.3: not claimed: ")
    assert not [name for name in built if name.startswith("w8-") and built[name]["stage"] in ("quantize", "calibration")]
    # validated through the checkpoint read back as TensorRT-LLM quantizes it at load
    validated = run(recipe, tmp_path / "store", "--until", "validate", "--target", "w8-tp1")["w8-tp1:validate"]
    assert validated["status"] == "built", validated["reason"]
    report = json.loads((Path(validated["path"]) / "report.json").read_text())
    assert report["runner"] == "torch" and 0 < report["metrics"]["kld_mean"] < 0.01
    assert built["w4-hf"]["status"] == "built"
    config = json.loads((Path(built["w4-hf"]["path"]) / "config.json").read_text())
    assert config["quantization_config"]["quant_algo"] == "W4A16_AWQ"
