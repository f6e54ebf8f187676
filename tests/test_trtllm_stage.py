"""The TensorRT-LLM validation stage end to end through a stand-in tensorrt_llm (tests/standin_trtllm:
LLM API objects computed with transformers on the CPU, version 1.2.0+standin; installed as
1.3.0+standin for Hugging Face checkpoints, which TensorRT-LLM serves on its PyTorch backend from
1.3 on): the windows and reference reach the LLM API as token ids, its outputs come back aligned, KL divergence, top-1 and
perplexity match the torch runner's on the same model, and the report names the stand-in as its
toolchain. On this machine without it, the stage's nodes are skipped with the reason."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import needs_no_gpu_with_trtllm
from tinymodels import make_model, make_tokenizer
from trtbuild.host import hardware
from trtbuild.host import toolchain
from trtbuild.errors import TrtbuildError
from trtbuild.builder.stages.base import StageContext
from trtbuild.validate import metrics, torch_runner, trtllm_runner
from trtbuild.validate.gates import default_gates

STANDIN = Path(__file__).resolve().parent / "standin_trtllm"


@pytest.fixture
def standin(monkeypatch):
    """tensorrt_llm 1.2.0+standin importable, and a GPU reported visible, for this test only."""
    yield from _standin_on_path(monkeypatch, STANDIN)


@pytest.fixture
def standin_pytorch(monkeypatch, tmp_path):
    """The same stand-in installed as tensorrt_llm 1.3.0+standin: Hugging Face checkpoints are
    served (and validated) on TensorRT-LLM's PyTorch backend from 1.3 on (the runtime table's
    trtllm row), so a 1.2 install is refused for them (tests/test_trtllm_runner.py)."""
    site = tmp_path / "site-1.3"
    (site / "tensorrt_llm-1.3.0+standin.dist-info").mkdir(parents=True)
    metadata = (STANDIN / "tensorrt_llm-1.2.0+standin.dist-info" / "METADATA").read_text()
    (site / "tensorrt_llm-1.3.0+standin.dist-info" / "METADATA").write_text(
        metadata.replace("Version: 1.2.0+standin", "Version: 1.3.0+standin"))
    (site / "tensorrt_llm").symlink_to(STANDIN / "tensorrt_llm")
    yield from _standin_on_path(monkeypatch, site)


def _standin_on_path(monkeypatch, site: Path):
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setattr(trtllm_runner, "_gpu_visible", lambda: True)
    toolchain.package_version.cache_clear()
    yield
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]
    toolchain.package_version.cache_clear()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trtllm-stage")
    tokenizer = make_tokenizer(folder / "tokenizer")
    source = make_model(folder / "source", "llama", tokenizer)
    other = make_model(folder / "other", "llama", tokenizer, seed=99)  # a different model: large KL
    g = torch.Generator().manual_seed(3)
    windows = torch.randint(0, 512, (3, 24), generator=g).numpy().astype(np.int32)
    model = torch_runner.load_source(source, "cpu", "float32")
    ref = torch_runner.reference(model, windows, "cpu", metrics.TOP_K)
    return folder, source, other, windows, ref, model


def engine_dir(folder: Path, hf: Path, gather: bool, vocab_pad: int = 2) -> Path:
    """What the engine stand-in reads: an engine config.json and the weights it stands for."""
    engine = folder / f"engine-{gather}"
    shutil.rmtree(engine, ignore_errors=True)
    shutil.copytree(hf, engine / "hf")
    config = {"pretrained_config": {"architecture": "LlamaForCausalLM", "vocab_size": 512},
              "build_config": {"gather_context_logits": gather}, "standin": {"vocab_pad": vocab_pad}}
    (engine / "config.json").write_text(json.dumps(config))
    return engine


def test_hf_backend_agrees_with_the_torch_runner(standin_pytorch, models):
    _, source, _, windows, ref, _ = models
    for path in ("context_logits", "prompt_logprobs"):
        candidate = trtllm_runner.run(source, windows, ref["topk_ids"], "hf", path=path)
        assert candidate["path"] == path
        # 1.2.0rc2 returns top-k only: windows whose actual next token ranks below k are re-run exactly
        assert candidate["target_found"].all()
        np.testing.assert_allclose(candidate["target_logp"], ref["target_logp"], atol=1e-4)
        result = metrics.summarize(trtllm_runner.compare(candidate, ref))
        assert result.kld_mean < 1e-6 and result.top1_agreement == 1.0 and abs(result.ppl_delta_pct) < 1e-3


def test_engine_backend_needs_gathered_logits_and_cuts_vocab_padding(standin, models):
    folder, source, other, windows, ref, model = models
    with pytest.raises(TrtbuildError, match="the engine was built without --gather_context_logits"):
        trtllm_runner.run(engine_dir(folder, source, gather=False), windows, ref["topk_ids"], "engine")
    with pytest.raises(TrtbuildError, match="engines use context_logits"):
        trtllm_runner.run(engine_dir(folder, source, gather=True), windows, ref["topk_ids"], "engine", "prompt_logprobs")
    candidate = trtllm_runner.run(engine_dir(folder, other, gather=True), windows, ref["topk_ids"], "engine")
    assert candidate["path"] == "context_logits" and not np.isnan(candidate["logp_at_reference"]).any()
    # the same numbers as the torch runner on that model (up to the engine's float16 logits)
    expected = torch_runner.compare(torch_runner.load_source(other, "cpu", "float32"), windows, ref, "cpu")
    got = trtllm_runner.compare(candidate, ref)
    np.testing.assert_allclose(got.kl, expected.kl, rtol=2e-2, atol=2e-3)
    np.testing.assert_allclose(got.cand_nll, expected.cand_nll, atol=2e-2)
    assert metrics.summarize(got).kld_mean > 0.1  # a different model is far from the reference


def test_prompt_logprobs_kl_is_a_lower_bound_of_the_exact_one(standin, models):
    """A candidate's top-k misses some of the reference's top-k tokens: those are lumped into the tail,
    which can only lower the KL divergence (loosely on a flat random model: why the stage takes
    context logits)."""
    from tensorrt_llm import LLM

    _, _, other, windows, ref, _ = models
    llm = LLM(model=str(other), skip_tokenizer_init=True)
    inputs, params = trtllm_runner.to_llm_api(trtllm_runner.build_requests(windows, 64))
    parsed = trtllm_runner.parse_prompt_logprobs(llm.generate(inputs, params), windows, 64, ref["topk_ids"])
    lumped = np.isnan(parsed["logp_at_reference"])
    assert 0.5 < lumped.mean() < 1  # 64 returned, 256 asked for by the reference
    exact = torch_runner.compare(torch_runner.load_source(other, "cpu", "float32"), windows, ref, "cpu").kl
    bound = metrics.kl_lumped(ref["topk_logp"], parsed["logp_at_reference"])
    assert (bound <= exact + 1e-4).all() and (bound > 0).all()


def test_the_stage_writes_a_report_that_names_its_toolchain(standin_pytorch, models, tmp_path):
    from trtbuild.builder.stages.validate import REFERENCE_NPZ, WINDOWS, validate_trtllm

    _, source, _, windows, ref, _ = models
    reference = tmp_path / "reference"
    reference.mkdir()
    np.save(reference / WINDOWS, windows)
    np.savez(reference / REFERENCE_NPZ, **ref)
    out = tmp_path / "out"
    out.mkdir()
    gates = default_gates(None, None)
    ctx = StageContext(out=out, inputs={"reference": reference, "hf_checkpoint": source},
                       params={"gates": gates, "runner": "tensorrt_llm", "backend": "hf"}, runtime={"target": "base-hf"})
    validate_trtllm(ctx)
    report = json.loads((out / "report.json").read_text())
    assert report["runner"] == "tensorrt_llm 1.3.0+standin" and report["backend"] == "hf"
    assert report["metrics"]["kld_mean"] < 1e-6 and all(g["passed"] for g in report["gates"].values())
    assert report["tests"]["top1_agreement"]["n"] <= report["metrics"]["tokens"]
    assert "tensorrt_llm 1.3.0+standin runner" in (out / "report.md").read_text()


H200 = hardware.DetectedGpu(0, "NVIDIA H200", "sm90", 150_000_000_000)
L40S = hardware.DetectedGpu(1, "NVIDIA L40S", "sm89", 48_000_000_000)


def test_the_report_names_the_gpu_tensorrt_llm_ran_on(standin_pytorch, models, tmp_path, monkeypatch):
    """Not a hard-coded "cuda": the devices TensorRT-LLM ran on, and the GPUs the probe names (issue 10)."""
    from trtbuild.builder.stages.validate import REFERENCE_NPZ, WINDOWS, validate_trtllm

    monkeypatch.setattr(hardware, "detect_gpus", lambda: (H200, L40S))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # TensorRT-LLM's cuda:0 is NVML's GPU 1 here
    _, source, _, windows, ref, _ = models
    reference = tmp_path / "reference"
    reference.mkdir()
    np.save(reference / WINDOWS, windows)
    np.savez(reference / REFERENCE_NPZ, **ref)
    out = tmp_path / "out"
    out.mkdir()
    ctx = StageContext(out=out, inputs={"reference": reference, "hf_checkpoint": source},
                       params={"gates": default_gates(None, None), "runner": "tensorrt_llm", "backend": "hf"},
                       runtime={"target": "base-hf"})
    validate_trtllm(ctx)
    # the stand-in computed on the CPU, and the report says so (a real run names its CUDA devices by
    # rank, and the action record which products they were: test_devices_used_...)
    assert json.loads((out / "report.json").read_text())["device"] == "cpu"
    assert "tensorrt_llm 1.3.0+standin runner on cpu." in (out / "report.md").read_text()
    assert ctx.figures["gpus"] is None


@pytest.mark.parametrize("visible, world_size, expected", [
    (None, 1, "cuda:0 (NVIDIA H200, sm90)"),
    (None, 2, "cuda:0 (NVIDIA H200, sm90), cuda:1 (NVIDIA L40S, sm89)"),
    ("1,0", 2, "cuda:0 (NVIDIA L40S, sm89), cuda:1 (NVIDIA H200, sm90)"),
    ("GPU-5e1a", 1, "cuda:0"),  # a UUID the probe cannot map: the device without a name
])
def test_devices_used_follow_cuda_visible_devices_and_the_world_size(monkeypatch, visible, world_size, expected):
    monkeypatch.setattr(hardware, "detect_gpus", lambda: (H200, L40S))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert trtllm_runner.devices_used(world_size) == expected


def test_an_engine_runs_on_as_many_gpus_as_its_mapping_has_ranks(standin, models, monkeypatch):
    folder, source, _, windows, ref, _ = models
    monkeypatch.setattr(hardware, "detect_gpus", lambda: (H200, L40S))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    engine = engine_dir(folder, source, gather=True)
    config = json.loads((engine / "config.json").read_text())
    ran = trtllm_runner.run(engine, windows, ref["topk_ids"], "engine")
    assert (ran["device"], ran["gpus"]) == ("cpu", None)  # the stand-in computes on the CPU and says so
    assert trtllm_runner.cuda_devices(1) == "cuda:0"
    assert trtllm_runner.cuda_devices(2) == "cuda:0, cuda:1"
    config["pretrained_config"]["mapping"] = {"world_size": 2, "tp_size": 2, "pp_size": 1}
    (engine / "config.json").write_text(json.dumps(config))
    assert trtllm_runner.engine_world_size(engine) == 2


@needs_no_gpu_with_trtllm
def test_without_tensorrt_llm_the_runner_refuses():
    with pytest.raises(TrtbuildError, match=r"needs tensorrt_llm \(PyTorch backend, 1.3 or later\)"):
        trtllm_runner.run("folder", np.zeros((1, 4), np.int32), np.zeros((1, 3, 2), np.int32), "hf")
