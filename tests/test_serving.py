"""The runtime table (trtbuild/data/runtime-support.json): complete and cited, the docs page its output,
the facts read from upstream (the expected values here are written from the cited sources, not read
back from the table), explicit versions, and the plan that reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import minimal
from trtbuild.facts import serving
from trtbuild.plan.expand import plan_recipe
from trtbuild.recipe.schema import load_recipe

SMS = ("sm80", "sm86", "sm89", "sm90", "sm100", "sm120")
RUNTIMES = ("trtllm", "vllm", "sglang")
ROOT = Path(__file__).resolve().parents[1]
TABLE = json.loads((ROOT / "trtbuild" / "data" / "runtime-support.json").read_text())
QUANTS = (None, "fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo", "nvfp4")
HF_KVS = ("fp8", "nvfp4")  # the KV formats with a Hugging Face form (an INT8 KV cache has none)


# ------------------------------------------------------------------------------------------------
# The table as data: complete, cited, and the docs page is its output


def test_every_runtime_version_and_format_has_exactly_one_row():
    for section, key, formats in (("weights", "quant", QUANTS), ("kv_cache", "kv_cache", HF_KVS)):
        seen = {}
        for row in TABLE[section]:
            for version in row["versions"]:
                cell = (row["runtime"], version, row[key])
                assert cell not in seen, cell
                seen[cell] = row
        assert set(seen) == {(r, v, f) for r in RUNTIMES for v in TABLE["runtimes"][r]["versions"] for f in formats}


def test_every_cell_cites_sources_that_name_a_file_and_commit_or_a_page_and_version():
    sources = TABLE["sources"]
    for row in TABLE["weights"] + TABLE["kv_cache"] + TABLE["loaders"]:
        assert row["cite"] and all(c in sources for c in row["cite"]), row
        sms = set(row.get("serves", [])) | set(row.get("fallback", [])) | set(row.get("unclaimed", []))
        assert sms <= set(SMS), row
        # an SM outside serves / fallback / unclaimed does not serve: the row must say why
        assert sms == set(SMS) or row.get("reason") or "quant_algos" in row, row
    for sid, src in sources.items():
        if "url" in src:
            assert src["url"].startswith("https://") and src["version"], sid
        elif src["repo"] == "trtbuild":  # no citation points at a file the repository lacks
            assert (ROOT / src["path"]).is_file(), sid
        else:
            assert src["path"] and "commit" in src and (src["commit"] or src["ref"]), sid
        assert src["where"], sid


def test_no_module_or_test_cites_a_reference_file_that_does_not_exist():
    """A cited reference file means ../shared/reference/<name>.md (facts read from upstream, beside
    the checkout); serving.md never existed there (issue #22)."""
    import re

    shared = ROOT.parent / "shared" / "reference"
    cited = {}
    for path in [*(ROOT / "trtbuild").rglob("*.py"), *(ROOT / "tests").glob("*.py")]:
        for name in re.findall(r"reference/([\w.-]+\.md)", path.read_text()):
            cited.setdefault(name, path)
    assert "serving.md" not in cited, cited.get("serving.md")
    if shared.is_dir():  # CI and the developers' machines have it beside the checkout
        assert {name: path for name, path in cited.items() if not (shared / name).is_file()} == {}


def test_the_docs_page_is_the_tables_output():
    from trtbuild.facts.runtimes_doc import render

    assert (ROOT / "docs" / "runtimes.md").read_text() == render()


# ------------------------------------------------------------------------------------------------
# Facts read from upstream (each expectation written from the source the table cites)


def test_vllm_026_refuses_modelopt_fp8_below_sm89_and_033_falls_back_to_marlin():
    # vLLM v0.26.0 modelopt.py ModelOptFp8Config.get_min_capability: 89; v0.33.0: 80, with Marlin
    # FP8 among the CUDA kernels (kernels/linear/__init__.py _POSSIBLE_FP8_KERNELS).
    old = serving.support("vllm", "fp8", None, "sm86", version="0.26.0")
    assert (old.serves, old.reason) == (False, "ModelOptFp8Config needs compute capability 89 ('The quantization "
                                               "method modelopt is not supported for the current GPU. Minimum "
                                               "capability: 89')")
    new = serving.support("vllm", "fp8", None, "sm86", version="0.33.0")
    assert (new.serves, new.note) == (True, "Marlin FP8 fallback: weight-only compute (inferred)")
    assert serving.support("vllm", "fp8", "fp8", "sm90", version="0.26.0").serves  # measured on the H200 too


@pytest.mark.parametrize("version", ["0.26.0", "0.33.0"])
@pytest.mark.parametrize("quant,algo", [("int4_awq", "W4A16_AWQ"), ("int4_wo", "W4A16_AWQ"), ("w4a8_awq", "W4A8_AWQ"),
                                        ("int8_sq", "W8A8_SQ_PER_CHANNEL"), ("int8_wo", "W8A16")])
def test_no_vllm_version_loads_the_awq_or_int8_exports(version, quant, algo):
    # QUANT_ALGOS of both modelopt.py versions (the H200 run of 0.26.0 refused int4-awq-hf with it)
    assert serving.loader_algos("vllm", version)[0] == (
        "FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "MXFP8", "MIXED_PRECISION")
    for sm in SMS:
        cell = serving.support("vllm", quant, None, sm, version=version)
        assert (cell.serves, cell.reason) == (False, f"its ModelOpt loader rejects quant_algo {algo} (it accepts FP8, "
                                                     "FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4, W4A16_NVFP4, MXFP8, "
                                                     "MIXED_PRECISION)")
    assert serving.options("vllm", quant, None, version) == {}  # nothing to say: no command is written


def test_where_trtllm_sources_disagree_the_cell_says_so_and_claims_nothing():
    cell = serving.support("trtllm", "int4_awq", None, "sm100")
    assert not cell.serves and cell.reason.startswith("not claimed: sources disagree: ")
    assert "trtllm-matrix-later" in cell.cite


def test_the_options_each_runtime_needs_come_from_the_table():
    assert serving.options("vllm", "fp8", "fp8") == {"quantization": "modelopt", "kv_cache_dtype": "fp8"}
    assert serving.options("vllm", "nvfp4", None) == {"quantization": "modelopt_fp4"}
    assert serving.options("sglang", "fp8", "fp8") == {"quantization": "modelopt_fp8", "kv_cache_dtype": "fp8_e4m3"}
    assert serving.options("trtllm", "fp8", "fp8") == {"kv_cache_dtype": "fp8"}
    assert serving.options("vllm", None, None) == {}


# ------------------------------------------------------------------------------------------------
# Versions


def test_the_covered_versions_are_explicit_and_any_other_is_one_line():
    from trtbuild.errors import InvalidInput

    assert {r: info.versions for r, info in serving.RUNTIME_INFO.items()} == {
        "trtllm": ("1.3",), "vllm": ("0.26.0", "0.33.0"), "sglang": ("0.5.23",)}
    assert serving.covered_version("trtllm", "1.3.0rc27") == "1.3"
    assert serving.covered_version("vllm", "0.26.0") == "0.26.0"
    assert serving.covered_version("vllm", "0.33.1") is None
    assert serving.covered_version("vllm", "not-a-version") is None
    with pytest.raises(InvalidInput, match=r"^vllm 0\.40 is outside the runtime table \(trtbuild/data/runtime-support"
                                           r"\.json covers vllm 0\.26\.0, 0\.33\.0\)$"):
        serving.parse_runtime("vllm==0.40")
    with pytest.raises(InvalidInput, match=r"^runtime 'tgi': expected one of trtllm, vllm, sglang"):
        serving.parse_runtime("tgi")
    assert serving.parse_runtime("vllm") == ("vllm", "0.33.0")


# ------------------------------------------------------------------------------------------------
# The plan


def hf_plan(ws, quant, kv, gpus: str):
    fields = ", ".join(f"{k}: {v}" for k, v in (("quant", quant), ("kv_cache", kv)) if v)
    body = minimal(f"variants: {{q: {{{fields}}}}}\nbackends: [hf-checkpoint]", gpus)
    return plan_recipe(load_recipe(ws.recipe(body)))


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("kv", (None, *HF_KVS), ids=lambda k: f"kv-{k}")
@pytest.mark.parametrize("quant", QUANTS, ids=lambda q: str(q))
def test_the_plan_says_what_the_table_says_at_each_runtimes_default_version(ws, quant, kv, sm):
    [target] = hf_plan(ws, quant, kv, f"[{sm}]").targets
    cells = {r: serving.support(r, quant, kv, sm) for r in RUNTIMES}
    assert target.serves == {r: (sm,) if cells[r].serves else () for r in RUNTIMES}
    assert target.serve_notes == {r: {sm: c.note} for r, c in cells.items() if c.serves and c.note}
    assert target.ok == any(c.serves for c in cells.values())
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
        "no runtime serves W4A8 AWQ on sm86, sm100: trtllm>=1.3: sm86: the support matrix has W4A8 AWQ on Ada and "
        "Hopper only (sm89, sm90) / sm100: not claimed: sources disagree: the matrix read (TensorRT-LLM 09d4c79) has "
        "no W4A8 AWQ on Blackwell; later copies of the page (1.3.0rc27, not read at a commit here) list it on "
        "sm100/103; vllm: ")
    [nvfp4] = hf_plan(ws, "nvfp4", "nvfp4", "[sm80, sm100]").targets
    assert nvfp4.reason == (
        "no runtime serves NVFP4 with an NVFP4 KV cache on sm80, sm100: "
        "trtllm>=1.3: sm80: the support matrix has NVFP4 on Blackwell only (sm100, sm120) / sm100: not claimed: "
        "sources disagree: the matrix read (TensorRT-LLM 09d4c79) has no NVFP4 KV cache; later copies of the page "
        "(1.3.0rc27, not read at a commit here) list it on sm100/103; "
        "vllm: not claimed: an NVFP4 KV cache in a ModelOpt checkpoint was not verified; "
        "sglang: sm80: not claimed: below sm100 NVFP4 passes ModelOptFp4Config's capability-80 gate, but its kernel "
        "path was not read / sm100: not claimed: an NVFP4 KV cache in a ModelOpt checkpoint was not verified")


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
