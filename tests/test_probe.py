"""The GPU and toolchain probe, against NVML answers recorded from real boards
(tests/standin_nvml, each board's source in its file) and against no NVML at all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trtbuild.host import hardware

from trtbuild.host import toolchain
from trtbuild.facts import gpus
from trtbuild.errors import TrtbuildError
from trtbuild.host.hardware import DetectedGpu

ROOT = Path(__file__).resolve().parent.parent

# (recorded file, NVML name, SM, catalogue product whose nvidia-smi MiB total the board reports)
BOARDS = [
    ("A100", "NVIDIA A100-SXM4-80GB", "sm80", "A100-80GB"),
    ("L40S", "NVIDIA L40S", "sm89", "L40S"),
    ("H100", "NVIDIA H100 80GB HBM3", "sm90", "H100"),
    ("H200", "NVIDIA H200", "sm90", "H200"),
    ("B200", "NVIDIA B200", "sm100", "B200"),
]
DRIVERS = {"A100": ("535.104.05", "12.2"), "L40S": ("550.163.01", "12.4"), "H100": ("550.90.07", "12.4"),
           "H200": ("570.158.01", "12.8"), "B200": ("580.95.05", "13.0")}


@pytest.mark.parametrize("board, name, sm, product", BOARDS)
def test_each_recorded_board_is_detected_with_its_name_sm_and_memory(recorded_gpu, board, name, sm, product):
    recorded_gpu(board)
    memory = gpus.product(product).memory_bytes  # the catalogue's MiB total, as NVML reports it
    assert hardware.detect_gpus() == (DetectedGpu(0, name, sm, memory),)


def test_the_h100s_memory_is_the_byte_total_nvml_reports():
    # 85520809984 bytes (modal-labs/modal-client#2797), i.e. 81559 MiB: tests/standin_nvml/gpus/H100.json's source
    recorded = json.loads((ROOT / "tests/standin_nvml/gpus/H100.json").read_text())
    assert recorded["nvmlDeviceGetMemoryInfo"]["total"] == 85520809984


def test_two_recorded_gpus_are_two_devices(recorded_gpu):
    recorded_gpu("H200", count=2)
    memory = 143771 * 2**20
    assert hardware.detect_gpus() == (DetectedGpu(0, "NVIDIA H200", "sm90", memory),
                                      DetectedGpu(1, "NVIDIA H200", "sm90", memory))


def test_no_driver_means_no_gpus_and_no_driver_versions(recorded_gpu):
    recorded_gpu(None)
    assert hardware.detect_gpus() == ()
    assert hardware.driver_info() == {"driver": None, "cuda_driver": None}


def test_no_nvml_module_means_no_gpus(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    hardware.clear_probe_cache()
    try:
        assert hardware.detect_gpus() == ()
        assert hardware.driver_info() == {"driver": None, "cuda_driver": None}
    finally:
        monkeypatch.undo()
        hardware.clear_probe_cache()


@pytest.mark.parametrize("board", sorted(DRIVERS))
def test_driver_info_reads_the_driver_and_cuda_driver_versions(recorded_gpu, board):
    recorded_gpu(board)
    driver, cuda = DRIVERS[board]
    assert hardware.driver_info() == {"driver": driver, "cuda_driver": cuda}


def test_a_subprocess_sees_the_recorded_gpu_too(recorded_gpu):
    recorded_gpu("B200")
    out = subprocess.run([sys.executable, "-c", "from trtbuild.host import hardware; g = hardware.detect_gpus(); "
                          "print(len(g), g[0].name, g[0].sm, g[0].memory_bytes)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout == f"1 NVIDIA B200 sm100 {183359 * 2**20}\n"


def test_trtbuild_has_no_switch_that_claims_a_gpu(monkeypatch):
    # Only the test stand-in reads STANDIN_NVML_*: set without it on the path, the real probe answers.
    sources = "\n".join(p.read_text() for p in (ROOT / "trtbuild").rglob("*.py"))
    assert "STANDIN_NVML" not in sources and "standin_nvml" not in sources
    real = hardware.detect_gpus()
    monkeypatch.setenv("STANDIN_NVML_GPU", "H100")
    hardware.clear_probe_cache()
    assert hardware.detect_gpus() == real
    hardware.clear_probe_cache()


@pytest.mark.parametrize("versions, standin", [
    ({"tensorrt_llm": "1.2.0", "tensorrt": "10.13.3.9"}, False),
    ({"tensorrt_llm": "1.2.0+standin", "tensorrt": "10.13.3.9"}, True),
    ({"tensorrt_llm": "1.2.0", "tensorrt": "0+standin"}, True),
    ({"tensorrt_llm": "1.2.0+cu128", "tensorrt": None}, False),
    ({"tensorrt_llm": None, "tensorrt": None}, False),
])
def test_engine_toolchain_is_standin_when_a_version_is_labelled_standin(versions, standin):
    found = toolchain.EngineToolchain(cuda=None, image=None, **versions)
    assert found.standin is standin
    assert (found.tensorrt_llm, found.tensorrt) == (versions["tensorrt_llm"], versions["tensorrt"])


def test_probe_without_an_image_reads_package_metadata(installed_packages, monkeypatch):
    # Whatever an earlier test in this process imported is set aside: the question is whether probing imports.
    for name in [m for m in sys.modules if m.split(".")[0] in ("tensorrt", "tensorrt_llm")]:
        monkeypatch.delitem(sys.modules, name)
    installed_packages(tensorrt_llm="1.2.0", tensorrt="10.13.3.9")
    found = toolchain.probe_engine_toolchain()
    assert (found.tensorrt_llm, found.tensorrt, found.image, found.standin) == ("1.2.0", "10.13.3.9", None, False)
    assert "tensorrt" not in sys.modules and "tensorrt_llm" not in sys.modules


def _fake_docker(tmp_path: Path, monkeypatch, script: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\n" + script)
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


def test_probe_in_an_image_runs_python_there_and_reads_its_answer(tmp_path, monkeypatch, installed_packages):
    # A stand-in `docker` that records its argv and runs the probe script in a bare Python (-S: no
    # site-packages) that sees only the image's package metadata and NVIDIA's CUDA_VERSION variable:
    # the script must need nothing but the standard library.
    image = "nvcr.io/nvidia/tensorrt-llm/release@sha256:" + "ab" * 32
    site = installed_packages(tensorrt_llm="1.2.0", tensorrt="10.13.3.9")
    _fake_docker(tmp_path, monkeypatch, f'echo "$@" > {tmp_path}/argv\nshift 5\n'
                                        f'PYTHONPATH={site} CUDA_VERSION=12.9.1 exec {sys.executable} -S "$@"\n')
    found = toolchain.probe_engine_toolchain(image)
    assert (tmp_path / "argv").read_text().split()[:6] == ["run", "--rm", "--entrypoint", "python3", image, "-c"]
    assert found == toolchain.EngineToolchain(tensorrt_llm="1.2.0", tensorrt="10.13.3.9", cuda="12.9", image=image)
    assert found.standin is False


def test_probe_in_an_image_without_docker_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(TrtbuildError) as info:
        toolchain.probe_engine_toolchain("example/trtllm:1.2")
    assert info.value.messages == ["toolchain probe of image example/trtllm:1.2: docker is not installed on this host"]


def test_a_failing_probe_in_an_image_is_one_line_with_its_reason(tmp_path, monkeypatch):
    _fake_docker(tmp_path, monkeypatch, "echo 'Unable to find image' >&2\necho 'pull access denied for example/trtllm' >&2\nexit 125\n")
    with pytest.raises(TrtbuildError) as info:
        toolchain.probe_engine_toolchain("example/trtllm:1.2")
    assert info.value.messages == ["toolchain probe of image example/trtllm:1.2 failed (exit 125): "
                                   "pull access denied for example/trtllm"]
