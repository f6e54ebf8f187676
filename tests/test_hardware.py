"""GPU names normalize to SMs; the catalogue knows memory; NVML detection degrades to nothing."""

from __future__ import annotations

import pytest

from trtbuild.host import hardware


@pytest.mark.parametrize("name, sm, product", [
    ("sm90", "sm90", "H100"), ("SM_90", "sm90", "H100"), ("sm80", "sm80", "A100-80GB"),
    ("H100", "sm90", "H100"), ("h100-sxm", "sm90", "H100"), ("H200", "sm90", "H200"), ("GH200", "sm90", "GH200"),
    ("A100", "sm80", "A100-80GB"), ("A100-40GB", "sm80", "A100-40GB"), ("A10G", "sm86", "A10G"),
    ("L4", "sm89", "L4"), ("L40S", "sm89", "L40S"), ("RTX 4090", "sm89", "RTX4090"),
    ("B200", "sm100", "B200"), ("GB200", "sm100", "GB200"), ("RTX5090", "sm120", "RTX5090"),
])
def test_names_normalize_to_sm_and_product(name, sm, product):
    choice = hardware.resolve_gpu(name)
    assert (choice.sm, choice.product.name) == (sm, product)
    assert choice.named_product == (not name.lower().replace("_", "").startswith("sm"))


@pytest.mark.parametrize("name, message", [
    ("sm75", "'sm75' is not a supported architecture; use one of sm80, sm86, sm89, sm90, sm100, sm120"),
    ("T4", "'T4' is not a known GPU; use an SM (sm80, sm86, sm89, sm90, sm100, sm120) or a product (A100-80GB,"),
])
def test_unknown_names_list_what_is_known(name, message):
    with pytest.raises(ValueError) as info:
        hardware.resolve_gpu(name)
    assert str(info.value).startswith(message)


def test_every_sm_has_a_default_product_of_that_sm():
    for sm in hardware.SM_ARCHES:
        assert hardware.product(hardware.DEFAULT_PRODUCT[sm]).sm == sm
    for product in hardware.CATALOGUE:
        assert product.sm in hardware.SM_ARCHES and product.memory_bytes > 16 * 2**30


def test_memory_sizes_are_the_boards():
    assert hardware.product("H100").memory_bytes == 81559 * 2**20
    assert hardware.product("H200").memory_bytes // 2**30 == 140
    assert hardware.product("L4").memory_bytes // 2**30 == 22


def test_sm100_plugin_rejections_only_on_sm100():
    flags = {"low_latency_gemm_plugin": "fp8"}
    assert hardware.plugin_unsupported_reason(flags, "sm90") is None
    assert "low_latency_gemm_plugin=fp8 is not supported on SM 100" in hardware.plugin_unsupported_reason(flags, "sm100")
    assert hardware.plugin_unsupported_reason({"low_latency_gemm_plugin": "disable"}, "sm100") is None


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

    from trtbuild.host import hardware

    from trtbuild.host import toolchain

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
        toolchain.torch_has_cuda.cache_clear()
        assert (toolchain.torch_has_cuda(), hardware.resolve_device("auto")) == (expected == "cuda", expected)
        monkeypatch.syspath_prepend(str(tmp_path / "nothing"))  # the next site goes first
    recorded_gpu(None)
    assert hardware.resolve_device("auto") == "cpu"
    toolchain.torch_has_cuda.cache_clear()
