"""NVML detection degrades to nothing; `auto` is cuda only where torch can use the GPU (the catalogue:
tests/test_gpus.py)."""

from __future__ import annotations

from trtbuild.host import hardware


def test_detect_gpus_reports_what_nvml_sees():
    # On a machine without an NVIDIA driver NVML fails to initialize and nothing is detected; on a
    # GPU host every device is reported with an `smXY` name and its memory.
    found = hardware.detect_gpus()
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception:
        count = 0
    assert len(found) == count
    for gpu in found:
        assert gpu.sm.startswith("sm") and gpu.memory_bytes > 0


def test_device_auto_is_cuda_only_where_torch_is_a_cuda_build(tmp_path, monkeypatch, recorded_gpu):
    """NVML may see a GPU that the installed torch cannot use (a CPU wheel): `auto` is then cpu.
    torch's own version.py says which build it is, read without importing torch."""
    import importlib

    recorded_gpu("H100")
    for build, cuda_line, expected in (("cuda", "cuda: Optional[str] = '12.9'", "cuda"),
                                       ("cpu", "cuda: Optional[str] = None", "cpu")):
        site = tmp_path / build
        (site / "torch").mkdir(parents=True)
        (site / "torch" / "__init__.py").write_text("raise ImportError('never imported')\n")
        (site / "torch" / "version.py").write_text(f"from typing import Optional\n{cuda_line}\n")
        monkeypatch.syspath_prepend(str(site))
        monkeypatch.delitem(__import__("sys").modules, "torch", raising=False)
        importlib.invalidate_caches()
        hardware.torch_built_cuda.cache_clear()
        assert (hardware.torch_has_cuda(), hardware.resolve_device("auto")) == (expected == "cuda", expected)
        monkeypatch.syspath_prepend(str(tmp_path / "nothing"))  # the next site goes first
    recorded_gpu(None)
    assert hardware.resolve_device("auto") == "cpu"
    hardware.torch_built_cuda.cache_clear()
