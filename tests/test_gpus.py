"""GPU names normalize to SMs; the catalogue (trtbuild/data/gpus.json) knows memory and which SMs
have FP8 and FP4 tensor cores; the table is checked when read."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trtbuild.facts import gpus, trtllm


@pytest.mark.parametrize("name, sm, product", [
    ("sm90", "sm90", "H100"), ("SM_90", "sm90", "H100"), ("sm80", "sm80", "A100-80GB"),
    ("H100", "sm90", "H100"), ("h100-sxm", "sm90", "H100"), ("H200", "sm90", "H200"), ("GH200", "sm90", "GH200"),
    ("A100", "sm80", "A100-80GB"), ("A100-40GB", "sm80", "A100-40GB"), ("A10G", "sm86", "A10G"),
    ("L4", "sm89", "L4"), ("L40S", "sm89", "L40S"), ("RTX 4090", "sm89", "RTX4090"),
    ("B200", "sm100", "B200"), ("GB200", "sm100", "GB200"), ("RTX5090", "sm120", "RTX5090"),
])
def test_names_normalize_to_sm_and_product(name, sm, product):
    choice = gpus.resolve_gpu(name)
    assert (choice.sm, choice.product.name) == (sm, product)
    assert choice.named_product == (not name.lower().replace("_", "").startswith("sm"))


@pytest.mark.parametrize("name, message", [
    ("sm75", "'sm75' is not a supported architecture; use one of sm80, sm86, sm89, sm90, sm100, sm120"),
    ("T4", "'T4' is not a known GPU; use an SM (sm80, sm86, sm89, sm90, sm100, sm120) or a product (A100-80GB,"),
])
def test_unknown_names_list_what_is_known(name, message):
    with pytest.raises(ValueError) as info:
        gpus.resolve_gpu(name)
    assert str(info.value).startswith(message)


def test_every_sm_has_a_default_product_of_that_sm():
    for sm in gpus.SM_ARCHES:
        assert gpus.product(gpus.DEFAULT_PRODUCT[sm]).sm == sm
    for product in gpus.CATALOGUE:
        assert product.sm in gpus.SM_ARCHES and product.memory_bytes > 16 * 2**30


def test_memory_sizes_are_the_boards():
    assert gpus.product("H100").memory_bytes == 81559 * 2**20
    assert gpus.product("H200").memory_bytes // 2**30 == 140
    assert gpus.product("L4").memory_bytes // 2**30 == 22


def test_sm100_plugin_rejections_only_on_sm100():
    flags = {"low_latency_gemm_plugin": "fp8"}
    assert trtllm.plugin_unsupported_reason(flags, "sm90") is None
    assert "low_latency_gemm_plugin=fp8 is not supported on SM 100" in trtllm.plugin_unsupported_reason(flags, "sm100")
    assert trtllm.plugin_unsupported_reason({"low_latency_gemm_plugin": "disable"}, "sm100") is None


def test_tensor_cores_fp8_from_ada_and_fp4_from_blackwell():
    # written from the architectures (Ada sm89 brought FP8 tensor cores, Blackwell sm100 FP4), not read back
    assert [sm for sm in gpus.SM_ARCHES if gpus.has_fp8_tensor_cores(sm)] == ["sm89", "sm90", "sm100", "sm120"]
    assert [sm for sm in gpus.SM_ARCHES if gpus.has_fp4_tensor_cores(sm)] == ["sm100", "sm120"]


def test_the_sm_rules_of_the_formats_read_the_tensor_cores_of_the_gpu_table():
    from trtbuild.facts import quantformats

    for sm in gpus.SM_ARCHES:
        fp8 = quantformats.quant_unsupported_reason("fp8", None, sm)
        assert (fp8 is None) == gpus.has_fp8_tensor_cores(sm), sm
        nvfp4 = quantformats.quant_unsupported_reason("nvfp4", None, sm)
        assert (nvfp4 is None) == gpus.has_fp4_tensor_cores(sm), sm


@pytest.mark.parametrize("change, message", [
    (lambda t: t["sms"]["sm90"].update(default_product="H999"), "sms.sm90.default_product 'H999' is not a product"),
    (lambda t: t["products"][0].update(sm="sm75"), "products.A100-80GB.sm 'sm75' is not one of the table's SMs"),
    (lambda t: t["tensor_cores"]["fp8"].update({"from": "sm87"}), "tensor_cores.fp8.from 'sm87' is not one of"),
    (lambda t: t["products"][0].update(memory="80GB"), "Extra inputs are not permitted"),
])
def test_a_wrong_gpu_table_is_refused_when_read(change, message):
    import json
    from importlib import resources

    data = json.loads(resources.files("trtbuild").joinpath("data", gpus.TABLE_FILE).read_text())
    change(data)
    with pytest.raises(ValidationError) as info:
        gpus.GpuTable.model_validate(data)
    assert message in str(info.value)
