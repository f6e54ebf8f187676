"""The CUDA path, on a machine with an NVIDIA GPU (skipped elsewhere, CI included): ModelOpt
calibration on the GPU (`calibration.device: cuda`), NVFP4 (which needs CUDA: reference/modelopt.md
section 8), the exported checkpoints, and validation on the GPU (`validate.device: cuda`), all
through `trtbuild build` as a user runs it. Run on the lent H200 (see benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)")

RECIPE = """
schema: 1
name: cuda-check
source: {path: model}
dtype: bfloat16
variants:
  fp8: {quant: fp8, kv_cache: fp8}
  int8-sq: {quant: int8_sq}
  nvfp4: {quant: nvfp4}
calibration: {text: calib.txt, samples: 4, seq_len: 32, device: cuda}
parallelism: [{tp: 1}]
gpus: [sm100]
limits: {max_input_len: 128, max_seq_len: 256}
backends: [engine, hf-checkpoint]
validate: {samples: 4, seq_len: 48, device: cuda}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from tinymodels import make_model, make_tokenizer, pydoc_text

    folder = tmp_path_factory.mktemp("cuda")
    make_model(folder / "model", "llama", make_tokenizer(folder / "tokenizer"))
    (folder / "calib.txt").write_text(pydoc_text()[:30000])
    (folder / "recipe.yaml").write_text(RECIPE)
    result = subprocess.run([sys.executable, "-m", "trtbuild", "build", str(folder / "recipe.yaml"), "--json",
                             "--until", "validate"], capture_output=True, text=True, timeout=1200,
                            env={**os.environ, "TRTBUILD_CACHE": str(folder / "store")})
    assert result.returncode in (0, 1), result.stderr[-3000:]
    targets = {t["name"]: t for t in json.loads(result.stdout)["targets"]}
    print(json.dumps({n: {k: t.get(k) for k in ("status", "reason", "metrics")} for n, t in targets.items()}, indent=1))
    return folder, result.returncode, targets


def test_calibration_and_export_run_on_the_gpu(built):
    _, _, targets = built
    for variant in ("fp8", "int8-sq", "nvfp4"):
        assert targets[f"{variant}-quantized"]["status"] == "built", targets[f"{variant}-quantized"]
        assert targets[f"{variant}-tp1"]["status"] == "built", targets[f"{variant}-tp1"]
    # no serving runtime takes W8A8_SQ_PER_CHANNEL (docs/runtimes.md): its hf-checkpoint is impossible
    hf = {"fp8-hf": "built", "int8-sq-hf": "impossible", "nvfp4-hf": "built"}
    assert {name: targets[name]["status"] for name in hf} == hf


def test_nvfp4_hf_checkpoint_declares_nvfp4(built):
    _, _, targets = built
    hf = Path(targets["nvfp4-hf"]["path"])
    quant = json.loads((hf / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "NVFP4"
    trtllm = json.loads((Path(targets["nvfp4-tp1"]["path"]) / "config.json").read_text())
    assert trtllm["quantization"]["quant_algo"] == "NVFP4"


def test_validation_runs_on_the_gpu_with_plausible_numbers(built):
    _, _, targets = built
    # measured on the H200 (benchmarks/RESULTS.md, gpu_check): NVFP4 on this random tiny model fails
    # its top-1 gate (near-flat distributions), the 8-bit formats pass theirs
    expected = {"fp8": "built", "int8-sq": "built", "nvfp4": "failed"}
    for variant, status in expected.items():
        entry = targets[f"{variant}-tp1:validate"]
        assert entry["status"] == status and entry["metrics"], entry
        report = json.loads((Path(entry["path"]) / "report.json").read_text())  # kept for a failed gate too
        assert report["device"] == "cuda" and report["runner"] == "torch"
        m = entry["metrics"]
        assert 0 < m["kld_mean"] < 5 and 0 < m["top1_agreement"] <= 1
