"""Who serves each hf-checkpoint, on which SM: the plan against the support table as reference/serving.md
states it (section 0's table, with its conservative rule: `Y*` serves with a note, what the sources
leave unread is not claimed). The expected table is written here from serving.md, not read from
trtbuild/serving.py."""

from __future__ import annotations

import json

import pytest

from conftest import minimal
from trtbuild import serving
from trtbuild.plan import plan_recipe
from trtbuild.recipe import load_recipe

SMS = ("sm80", "sm86", "sm89", "sm90", "sm100", "sm120")
RUNTIMES = ("trtllm", "vllm", "sglang")


def row(cells: str) -> dict[str, str]:
    """'Y Y* - ?' per SM in SMS order: serves, serves on a fallback, does not, not claimed."""
    values = cells.split()
    assert len(values) == len(SMS)
    return dict(zip(SMS, values))


ALL_Y, NONE, UNCLAIMED = row("Y Y Y Y Y Y"), row("- - - - - -"), row("? ? ? ? ? ?")
# serving.md section 0 (weights), per runtime. int4_wo is exported as W4A16_AWQ: as int4_awq.
WEIGHTS = {
    "trtllm": {None: ALL_Y, "fp8": row("- - Y Y Y Y"), "int8_sq": NONE, "int4_awq": row("Y Y Y Y - -"),
               "int4_wo": row("Y Y Y Y - -"), "w4a8_awq": row("- - Y Y - -"), "int8_wo": UNCLAIMED,
               "nvfp4": row("- - - - Y Y")},
    "vllm": {None: ALL_Y, "fp8": row("Y* Y* Y Y Y Y"), "int8_sq": NONE, "int4_awq": NONE, "int4_wo": NONE,
             "w4a8_awq": NONE, "int8_wo": NONE, "nvfp4": row("Y* Y* Y* Y* Y Y")},
    "sglang": {None: ALL_Y, "fp8": row("- - Y Y Y Y"), "int8_sq": NONE, "int4_awq": NONE, "int4_wo": NONE,
               "w4a8_awq": NONE, "int8_wo": NONE, "nvfp4": row("? ? ? ? Y Y")},
}
# The KV cache of a checkpoint with quantized weights: FP8 KV is in TRT-LLM's matrix everywhere; vLLM's
# on sm80/86 is "not verified" and SGLang's there not read; an NVFP4 KV cache is in no table.
KV = {"trtllm": {"fp8": ALL_Y, "nvfp4": UNCLAIMED},
      "vllm": {"fp8": row("? ? Y Y Y Y"), "nvfp4": UNCLAIMED},
      "sglang": {"fp8": row("? ? Y Y Y Y"), "nvfp4": UNCLAIMED}}
FALLBACK_NOTES = {("vllm", "fp8"): "Marlin FP8 fallback: weight-only compute (inferred)",
                  ("vllm", "nvfp4"): "Marlin NVFP4 fallback: weight-only W4A16 compute (inferred)"}
QUANTS = (None, "fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo", "nvfp4")
KVS = (None, "fp8", "nvfp4")


def expected_cell(runtime: str, quant, kv, sm: str) -> str:
    if quant is None and kv is not None:
        return "?"  # a KV-cache-only export is in no runtime's table
    weights = WEIGHTS[runtime][quant][sm]
    if weights not in ("Y", "Y*") or kv is None:
        return weights
    return KV[runtime][kv][sm] if KV[runtime][kv][sm] != "Y" else weights


def hf_plan(ws, quant, kv, gpus: str):
    fields = ", ".join(f"{k}: {v}" for k, v in (("quant", quant), ("kv_cache", kv)) if v)
    body = minimal(f"variants: {{q: {{{fields}}}}}\nbackends: [hf-checkpoint]", gpus)
    return plan_recipe(load_recipe(ws.recipe(body)))


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("kv", KVS, ids=lambda k: f"kv-{k}")
@pytest.mark.parametrize("quant", QUANTS, ids=lambda q: str(q))
def test_the_plan_says_who_serves_each_format_on_each_sm(ws, quant, kv, sm):
    [target] = hf_plan(ws, quant, kv, f"[{sm}]").targets
    cells = {r: expected_cell(r, quant, kv, sm) for r in RUNTIMES}
    assert target.serves == {r: (sm,) if cells[r] in ("Y", "Y*") else () for r in RUNTIMES}
    notes = {r: {sm: FALLBACK_NOTES[(r, quant)]} for r in RUNTIMES if cells[r] == "Y*"}
    assert target.serve_notes == notes
    assert target.ok == any(c in ("Y", "Y*") for c in cells.values())
    for r in RUNTIMES:
        fact = serving.support(r, quant, kv, sm)
        assert fact.cite.startswith("serving.md") or fact.cite.startswith("modelopt.md")
        assert (fact.reason or "").startswith("not claimed: ") == (cells[r] == "?"), (r, fact.reason)
        assert (fact.reason is None) == fact.serves
    if not target.ok:
        assert target.reason.startswith(f"no runtime serves {serving.format_label(quant, kv)} on {sm}: trtllm>=1.3: ")


def test_int8_smoothquant_is_impossible_with_each_runtimes_reason(ws):
    [target] = hf_plan(ws, "int8_sq", None, "[sm89, H100]").targets
    assert target.status == "impossible"
    assert target.reason == (
        "no runtime serves INT8 SmoothQuant on sm89, sm90: "
        "trtllm>=1.3: no linear method for INT8 SmoothQuant (W8A8_SQ_PER_CHANNEL): 'unsupported quant mode'; "
        "vllm: its ModelOpt loader rejects quant_algo W8A8_SQ_PER_CHANNEL (it accepts FP8, FP8_PER_CHANNEL_PER_TOKEN, "
        "FP8_PB_WO, NVFP4, W4A16_NVFP4, MXFP8, MIXED_PRECISION); "
        "sglang: quant_algo W8A8_SQ_PER_CHANNEL maps to no ModelOpt method ('ModelOptFp8Config only supports "
        "regular FP8 quantization')")


def test_int8_weight_only_is_not_claimed_for_tensorrt_llm(ws):
    [target] = hf_plan(ws, "int8_wo", None, "[sm90]").targets
    assert target.reason == (
        "no runtime serves INT8 weight-only on sm90: trtllm>=1.3: not claimed: the loader reads W8A16 "
        "(WeightOnlyQuantLinearMethod), but INT8 weight-only is outside the support matrix and its SM range was "
        "not read; vllm: its ModelOpt loader rejects quant_algo W8A16 (it accepts FP8, FP8_PER_CHANNEL_PER_TOKEN, "
        "FP8_PB_WO, NVFP4, W4A16_NVFP4, MXFP8, MIXED_PRECISION); sglang: quant_algo W8A16 maps to no ModelOpt "
        "method ('ModelOptFp8Config only supports regular FP8 quantization')")


def test_a_runtime_whose_reason_differs_by_sm_lists_each(ws):
    [target] = hf_plan(ws, "w4a8_awq", None, "[sm86, sm100]").targets
    assert target.reason.startswith(
        "no runtime serves W4A8 AWQ on sm86, sm100: trtllm>=1.3: the support matrix has W4A8 AWQ on Ada and Hopper "
        "only (sm89, sm90); vllm: ")
    [nvfp4] = hf_plan(ws, "nvfp4", "nvfp4", "[sm80, sm100]").targets
    assert nvfp4.reason == (
        "no runtime serves NVFP4 with an NVFP4 KV cache on sm80, sm100: "
        "trtllm>=1.3: sm80: the support matrix has NVFP4 on Blackwell only (sm100, sm120) / sm100: not claimed: an "
        "NVFP4 KV cache in a ModelOpt checkpoint is not in serving.md's table; "
        "vllm: not claimed: an NVFP4 KV cache in a ModelOpt checkpoint is not in serving.md's table; "
        "sglang: sm80: not claimed: below sm100 NVFP4 passes ModelOptFp4Config's capability-80 gate, but its kernel "
        "path was not read / sm100: not claimed: an NVFP4 KV cache in a ModelOpt checkpoint is not in serving.md's "
        "table")


def test_serves_lists_only_the_recipes_gpus_and_a_served_sm_keeps_the_variant(ws):
    [target] = hf_plan(ws, "fp8", None, "[A10G, L40S, sm100]").targets
    assert target.ok
    assert target.serves == {"trtllm": ("sm89", "sm100"), "vllm": ("sm86", "sm89", "sm100"),
                             "sglang": ("sm89", "sm100")}
    assert target.serves_line() == ("trtllm>=1.3 sm89 sm100; vllm sm86 sm89 sm100; sglang sm89 sm100 "
                                    "(vllm sm86: Marlin FP8 fallback: weight-only compute (inferred))")


def test_a_recipe_without_gpus_counts_every_sm(ws):
    body = minimal("variants: {awq: {quant: int4_awq}}\nbackends: [hf-checkpoint]", "[]")
    [target] = plan_recipe(load_recipe(ws.recipe(body))).targets
    assert target.serves == {"trtllm": ("sm80", "sm86", "sm89", "sm90"), "vllm": (), "sglang": ()}


def test_gpu_filter_does_not_change_who_serves_an_hf_checkpoint(ws):
    body = minimal("variants: {awq: {quant: int4_awq}}\nbackends: [engine, hf-checkpoint]", "[sm80, sm100]")
    plan = plan_recipe(load_recipe(ws.recipe(body)), gpu_filter={"sm100"})
    assert plan.target("awq-hf").serves == {"trtllm": ("sm80",), "vllm": (), "sglang": ()}


def test_the_demo_plan_shows_who_serves_each_hf_checkpoint(run):
    text = run("plan")
    assert text.exit_code == 0, text.stderr
    lines = [line for line in text.stdout.splitlines() if line.startswith("- ")]
    assert lines == ["- base-hf serves: trtllm>=1.3 sm89 sm90; vllm sm89 sm90; sglang sm89 sm90",
                     "- int4-wo-hf serves: trtllm>=1.3 sm89 sm90",
                     "- fp8-hf serves: trtllm>=1.3 sm89 sm90; vllm sm89 sm90; sglang sm89 sm90"]
    data = json.loads(run("plan", "--format", "json").stdout)
    hf = {t["name"]: (t["status"], t["serves"], t["serve_notes"]) for t in data["targets"] if t["kind"] == "hf-checkpoint"}
    assert hf == {"base-hf": ("ok", {"trtllm": ["sm89", "sm90"], "vllm": ["sm89", "sm90"], "sglang": ["sm89", "sm90"]}, {}),
                  "int4-wo-hf": ("ok", {"trtllm": ["sm89", "sm90"], "vllm": [], "sglang": []}, {}),
                  "fp8-hf": ("ok", {"trtllm": ["sm89", "sm90"], "vllm": ["sm89", "sm90"], "sglang": ["sm89", "sm90"]}, {})}
    assert all(t["serves"] is None for t in data["targets"] if t["kind"] != "hf-checkpoint")
