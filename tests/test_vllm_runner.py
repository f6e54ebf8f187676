"""The vLLM smoke load (`{variant}-hf:validate-vllm`): the runner turns vLLM's prompt log-probs
into the gates' inputs (exactly), takes its load options from the artifact's serving/vllm_args.json
or derives them from the recipe, and `trtbuild build` runs it through a stand-in vllm
(tests/standin_vllm, version 0.33.0+standin) on a recorded GPU, gated and marked stand-in; without
vllm the node is skipped with the reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from conftest import needs_no_trtllm, needs_no_vllm, standin_toolchain_env
from tinymodels import make_model, make_tokenizer
from trtbuild.errors import TrtbuildError
from trtbuild.store.local import LocalStore
from trtbuild.validate import vllm_runner


def lp(logprob: float, rank: int) -> SimpleNamespace:
    return SimpleNamespace(logprob=logprob, rank=rank, decoded_token=None)


# ---- the runner on plain data ---------------------------------------------------------------

def known_output():
    """One window [5, 7, 9] and what vLLM returns for it with prompt_logprobs=2: None for token 0;
    entry 1 scores token 7 (inside the top 2); entry 2 scores token 9 (outside: added with rank 4)."""
    windows = np.array([[5, 7, 9]], dtype=np.int32)
    entries = [None,
               {7: lp(-0.5, 1), 3: lp(-1.5, 2)},
               {2: lp(-0.25, 1), 4: lp(-2.0, 2), 9: lp(-3.0, 4)}]
    return windows, [SimpleNamespace(prompt_token_ids=[5, 7, 9], prompt_logprobs=entries, outputs=[])]


def test_prompt_logprobs_become_the_exact_gate_inputs():
    windows, outputs = known_output()
    ref_ids = np.array([[[7, 8], [2, 9]]], dtype=np.int32)
    ref = {"topk_ids": ref_ids, "topk_logp": np.log(np.array([[[0.5, 0.25], [0.75, 0.125]]])),
           "target_logp": np.array([[-0.75, -2.5]], dtype=np.float32)}
    got = vllm_runner.parse_prompt_logprobs(outputs, windows, 2, ref_ids)
    assert got["topk_ids"].tolist() == [[[7, 3], [2, 4]]]
    assert got["topk_logp"].tolist() == [[[-0.5, -1.5], [-0.25, -2.0]]]
    assert got["target_logp"].tolist() == [[-0.5, -3.0]]
    assert got["target_found"].tolist() == [[True, True]]
    at = got["logp_at_reference"]
    assert at[0, 0, 0] == -0.5 and np.isnan(at[0, 0, 1]) and at[0, 1].tolist() == [-0.25, -3.0]

    comparison = vllm_runner.compare(got, ref)
    assert comparison.top1.tolist() == [[1.0, 1.0]]
    assert comparison.ref_nll.tolist() == [[0.75, 2.5]]
    assert comparison.cand_nll.tolist() == [[0.5, 3.0]]
    # position 0: token 8 unknown, lumped with the tail; position 1: both known, tail lumped
    p0_head = 0.5 * (np.log(0.5) + 0.5)
    p0_tail = 0.5 * (np.log(0.5) - np.log(1 - np.exp(-0.5)))
    p1_head = 0.75 * (np.log(0.75) + 0.25) + 0.125 * (np.log(0.125) + 3.0)
    p1_tail = 0.125 * (np.log(0.125) - np.log(1 - np.exp(-0.25) - np.exp(-3.0)))
    assert comparison.kl[0].tolist() == pytest.approx([p0_head + p0_tail, p1_head + p1_tail], rel=1e-12)


def test_an_output_in_tensorrt_llm_alignment_is_refused():
    windows, outputs = known_output()
    outputs[0].prompt_logprobs = outputs[0].prompt_logprobs[1:] + [{}]
    with pytest.raises(TrtbuildError) as err:
        vllm_runner.parse_prompt_logprobs(outputs, windows, 2)
    assert str(err.value) == ("vLLM prompt_logprobs: output 0 does not start with None (vLLM's entry t scores prompt "
                              "token t, so the first has no distribution)")


def test_requests_are_token_ids_with_one_generated_token():
    assert vllm_runner.prompts(np.array([[1, 2, 3]])) == [{"prompt_token_ids": [1, 2, 3]}]
    assert vllm_runner.sampling(20) == {"max_tokens": 1, "prompt_logprobs": 20, "detokenize": False}


def test_load_options_come_from_the_artifact_or_the_recipe(tmp_path):
    params = {"quant": "fp8", "kv_cache": "fp8", "dtype": "bfloat16", "max_seq_len": 128}
    assert vllm_runner.load_options(tmp_path, params) == (
        {"quantization": "modelopt", "kv_cache_dtype": "fp8", "tensor_parallel_size": 1, "max_model_len": 128,
         "dtype": "bfloat16"}, "derived from the recipe (the artifact has no serving/vllm_args.json)")
    assert vllm_runner.load_options(tmp_path, {**params, "quant": None, "kv_cache": None})[0] == {
        "kv_cache_dtype": "auto", "tensor_parallel_size": 1, "max_model_len": 128, "dtype": "bfloat16"}
    (tmp_path / "serving").mkdir()
    (tmp_path / "serving" / "vllm_args.json").write_text(json.dumps(
        {"--quantization": "modelopt", "--kv-cache-dtype": "auto", "--tensor-parallel-size": 2,
         "--max-model-len": 64, "--port": 8000, "max_num_seqs": 4}))
    assert vllm_runner.load_options(tmp_path, params) == (
        {"quantization": "modelopt", "kv_cache_dtype": "auto", "tensor_parallel_size": 2, "max_model_len": 64,
         "max_num_seqs": 4}, "serving/vllm_args.json")
    (tmp_path / "serving" / "vllm_args.json").write_text("[]")
    with pytest.raises(TrtbuildError) as err:
        vllm_runner.load_options(tmp_path, params)
    assert str(err.value) == f"{tmp_path / 'serving' / 'vllm_args.json'}: expected a JSON object of vllm serve options, got list"


def test_availability_reads_metadata_and_nvml(recorded_gpu, installed_packages):
    recorded_gpu(None)
    if vllm_runner.vllm_version() is None:
        assert vllm_runner.available() == "needs vllm on a CUDA GPU: this machine has no vllm and no NVIDIA GPU visible"
    recorded_gpu("H100")
    installed_packages(vllm="0.33.0")
    assert vllm_runner.available() is None


def test_the_llm_gets_max_logprobs_of_the_k_the_metric_needs():
    options = {"quantization": "modelopt", "max_model_len": 128}
    assert vllm_runner.llm_arguments(options, 256) == {"quantization": "modelopt", "max_model_len": 128,
                                                       "skip_tokenizer_init": True, "max_logprobs": 256}


def test_the_device_is_what_the_engine_config_says(monkeypatch):
    assert vllm_runner.devices("cpu", 1) == "cpu"
    assert vllm_runner.devices("cpu", 2) == "cpu"  # vLLM's CPU worker: one torch.device("cpu") for every rank
    assert vllm_runner.devices("cuda", 2) == "cuda:0, cuda:1"
    # by rank on every host, whatever CUDA_VISIBLE_DEVICES maps them to: the report is in the artifact
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert vllm_runner.devices("cuda", 2) == "cuda:0, cuda:1"


# ---- the stand-in refuses what vLLM 0.33.0 refuses, in its words -------------------------------

STANDIN = Path(__file__).resolve().parent / "standin_vllm" / "vllm"


@pytest.fixture(scope="module")
def standin():
    """tests/standin_vllm's vllm package, loaded under a private name: `vllm` stays uninstalled for
    the rest of this process (its dist-info is not put on sys.path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_standin_vllm", STANDIN / "__init__.py",
                                                  submodule_search_locations=[str(STANDIN)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    for name in [n for n in sys.modules if n.split(".")[0] in ("_standin_vllm", "_standin_trtllm_for_vllm")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("standin-vllm") / "model", "llama")  # vocab 512


def quantized_config(folder: Path, quantization_config: dict) -> Path:
    """A folder whose config.json is `tiny`'s with a quantization_config (what vLLM's checks read)."""
    folder.mkdir()
    config = {"vocab_size": 512, "quantization_config": quantization_config}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_standin_refuses_prompt_logprobs_above_max_logprobs(standin, tiny):
    windows = [{"prompt_token_ids": [5, 7, 9]}]
    llm = standin.LLM(model=str(tiny), skip_tokenizer_init=True)
    with pytest.raises(standin.exceptions.VLLMValidationError) as err:
        llm.generate(windows, standin.SamplingParams(max_tokens=1, prompt_logprobs=256), use_tqdm=False)
    assert str(err.value) == ("Requested prompt logprobs of 256, which is greater than max allowed: 20 "
                              "(parameter=prompt_logprobs, value=256)")
    assert not isinstance(err.value, ValueError)  # 0.33.0: a VLLMClientError
    with pytest.raises(standin.exceptions.VLLMValidationError) as err:  # -1: the whole vocabulary
        llm.generate(windows, standin.SamplingParams(max_tokens=1, prompt_logprobs=-1), use_tqdm=False)
    assert str(err.value) == ("Requested prompt logprobs of 512, which is greater than max allowed: 20 "
                              "(parameter=prompt_logprobs, value=512)")
    (out,) = llm.generate(windows, standin.SamplingParams(max_tokens=1, prompt_logprobs=20), use_tqdm=False)
    assert [len(e) if e else e for e in out.prompt_logprobs][0] is None and len(out.prompt_logprobs) == 3

    llm = standin.LLM(model=str(tiny), skip_tokenizer_init=True, max_logprobs=256)
    (out,) = llm.generate(windows, standin.SamplingParams(max_tokens=1, prompt_logprobs=256), use_tqdm=False)
    assert [len(entry) for entry in out.prompt_logprobs[1:]] in ([256, 256], [256, 257], [257, 256], [257, 257])
    llm = standin.LLM(model=str(tiny), skip_tokenizer_init=True, max_logprobs=-1)  # -1: no cap but the vocabulary
    (out,) = llm.generate(windows, standin.SamplingParams(max_tokens=1, prompt_logprobs=-1), use_tqdm=False)
    assert [len(entry) for entry in out.prompt_logprobs[1:]] == [512, 512]


def test_the_standin_refuses_bad_logprob_settings_where_vllm_does(standin, tiny):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:  # ModelConfig.max_logprobs: Field(default=20, ge=-1)
        standin.LLM(model=str(tiny), max_logprobs=-2)
    assert err.value.errors()[0]["loc"] == ("max_logprobs",) and err.value.errors()[0]["type"] == "greater_than_equal"
    with pytest.raises(standin.exceptions.VLLMValidationError) as err:
        standin.SamplingParams(prompt_logprobs=-2)
    assert str(err.value) == "prompt_logprobs must be non-negative or -1, got -2. (parameter=prompt_logprobs, value=-2)"
    with pytest.raises(standin.exceptions.VLLMValidationError) as err:
        standin.SamplingParams(max_tokens=0)
    assert str(err.value) == "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"


def test_the_standin_refuses_an_unknown_engine_argument_as_enginargs_does(standin, tiny):
    with pytest.raises(TypeError) as err:
        standin.LLM(model=str(tiny), skip_tokenizer_init=True, max_logprob=256)
    assert str(err.value) == "EngineArgs.__init__() got an unexpected keyword argument 'max_logprob'"


def test_the_standin_refuses_what_vllms_modelopt_loader_refuses(standin, tmp_path):
    awq = quantized_config(tmp_path / "awq", {"quant_method": "modelopt", "quant_algo": "W4A16_AWQ", "group_size": 128})
    for quantization in (None, "modelopt"):
        with pytest.raises(ValueError) as err:
            standin.LLM(model=str(awq), quantization=quantization)
        assert str(err.value) == (
            "ModelOpt currently only supports: ['FP8', 'FP8_PER_CHANNEL_PER_TOKEN', 'FP8_PB_WO', 'NVFP4', 'W4A16_NVFP4', "
            "'MXFP8', 'MIXED_PRECISION'] quantizations in vLLM. Please check the `hf_quant_config.json` file for your "
            "model's quant configuration.")
    (tmp_path / "w8a16").mkdir()
    (tmp_path / "w8a16" / "config.json").write_text(json.dumps({"vocab_size": 512}))  # the older layout: a file of its own
    (tmp_path / "w8a16" / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quant_method": "modelopt", "quantization": {"quant_algo": "W8A16"}}))
    with pytest.raises(ValueError) as err:
        standin.LLM(model=str(tmp_path / "w8a16"))
    assert str(err.value).startswith("ModelOpt currently only supports: ['FP8', ")
    no_algo = quantized_config(tmp_path / "no-algo", {"quant_method": "modelopt"})
    with pytest.raises(ValueError) as err:
        standin.LLM(model=str(no_algo))
    assert str(err.value) == "Missing 'quant_algo' in quantization config"
    per_channel = quantized_config(tmp_path / "pc", {"quant_method": "modelopt", "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"})
    with pytest.raises(ValueError) as err:  # no override for this algorithm: the argument must match
        standin.LLM(model=str(per_channel), quantization="fp8")
    assert str(err.value) == ("Quantization method specified in the model config (modelopt) does not match the "
                              "quantization method specified in the `quantization` argument (fp8).")


def test_the_standin_refuses_modelopt_for_an_unquantized_checkpoint(standin, tiny):
    with pytest.raises(ValueError) as err:
        standin.LLM(model=str(tiny), quantization="modelopt")
    assert str(err.value) == "Cannot find the config file for modelopt"


def test_the_standin_says_it_ran_on_the_cpu(standin, tiny):
    llm = standin.LLM(model=str(tiny), skip_tokenizer_init=True, tensor_parallel_size=1)
    config = llm.llm_engine.vllm_config
    assert (config.device_config.device_type, config.parallel_config.world_size) == ("cpu", 1)


def test_a_call_vllm_refuses_is_one_line_naming_the_checkpoint(tiny):
    """vllm_runner.run through the stand-in (importable only in a child process): an unquantized
    checkpoint loaded with quantization=modelopt."""
    code = ("import numpy as np, sys\n"
            "from trtbuild.errors import TrtbuildError\n"
            "from trtbuild.validate import vllm_runner\n"
            "try:\n"
            "    vllm_runner.run(sys.argv[1], np.array([[5, 7, 9]]), np.zeros((1, 2, 4), np.int32), "
            "{'quantization': 'modelopt'})\n"
            "except TrtbuildError as exc:\n"
            "    print(exc)\n")
    env = standin_toolchain_env(dict(os.environ), "H100", vllm=True)
    result = subprocess.run([sys.executable, "-c", code, str(tiny)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (f"vLLM 0.33.0+standin refused to load {tiny} with {{'quantization': 'modelopt', "
                             "'skip_tokenizer_init': True, 'max_logprobs': 4}: ValueError: Cannot find the config "
                             "file for modelopt\n")


# ---- trtbuild build ---------------------------------------------------------------------------

RECIPE = """
schema: 1
name: tiny-vllm
source: {path: model}
backends: [hf-checkpoint]
variants: {bf16: {}, fp8: {quant: fp8}}
calibration: {samples: 4, seq_len: 32}
gpus: [sm90]
limits: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}
validate: {samples: 2, seq_len: 32}
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm-build")
    make_model(folder / "model", "llama", make_tokenizer(folder / "tokenizer"))
    (folder / "recipe.yaml").write_text(RECIPE)
    return folder


def build(env: dict, folder: Path, *args: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "trtbuild", "build", "recipe.yaml", "--json", *args],
                            capture_output=True, text=True, env=env, cwd=folder, timeout=900)
    assert result.returncode in (0, 1), result.stderr
    return {t["name"]: t for t in json.loads(result.stdout)["targets"]}


def trtbuild(env: dict, folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtbuild", *args], capture_output=True, text=True, env=env,
                          cwd=folder, timeout=300)


def listed(env: dict, folder: Path) -> tuple[dict, dict]:
    """`ls --json` of the workspace's store: target -> its validations; and the table's MEASURED BY per target."""
    data = json.loads(trtbuild(env, folder, "ls", "--store", str(folder / "store"), "--json").stdout)
    table = trtbuild(env, folder, "ls", "--store", str(folder / "store")).stdout.splitlines()
    at = table[0].index("MEASURED BY")
    width = table[0].index(" AGE ") + 1 - at
    return ({p["target"]: p["validations"] for p in data["published"]},
            {line.split()[1]: line[at:at + width].strip() for line in table[1:]})


@needs_no_vllm
@needs_no_trtllm
def test_without_vllm_validate_vllm_is_skipped_and_torchs_figures_decide(workspace):
    """A host with a GPU but neither serving runtime: their validations are skipped with the reason,
    and torch's figures alone decide the refs, as the build, the lock and ls say."""
    env = standin_toolchain_env({**os.environ, "TRTBUILD_CACHE": str(workspace / "store")}, "H100", trtllm=False)
    targets = build(env, workspace)
    lock = yaml.safe_load((workspace / "recipe.lock").read_text())
    validations, measured_by = listed(env, workspace)
    for variant in ("bf16", "fp8"):
        node = targets[f"{variant}-hf:validate-vllm"]
        assert (node["stage"], node["status"], node["reason"]) == (
            "validate", "skipped", "needs vllm on a CUDA GPU: this machine has no vllm")
        assert "metrics" not in node
        assert targets[f"{variant}-hf:validate-trtllm"]["status"] == "skipped"
        assert targets[f"{variant}-hf:validate-trtllm"]["reason"].endswith("(this machine: no tensorrt_llm)")
        target = targets[f"{variant}-hf"]
        assert (target["status"], target["ref"]) == ("built", None)
        assert target["decided_by"] == [{"validation": f"{variant}-hf:validate", "runner": "torch", "device": "cpu"}]
        assert {k: lock["targets"][f"{variant}-hf:validate"][k] for k in ("runner", "device", "gates_passed")} == {
            "runner": "torch", "device": "cpu", "gates_passed": True}
        assert f"{variant}-hf:validate-vllm" not in lock["targets"]
        assert [(v["id"], v["runner"], v["device"]) for v in validations[f"{variant}-hf"]] == [
            (f"{variant}-hf:validate", "torch", "cpu")]
        assert measured_by[f"{variant}-hf"] == "torch on cpu"


def test_build_runs_validate_vllm_through_the_standin_and_marks_it(workspace, tmp_path):
    """A host with vLLM (the stand-in) and no TensorRT-LLM: vLLM's figures decide first."""
    env = standin_toolchain_env({**os.environ, "TRTBUILD_CACHE": str(workspace / "store")}, "H100", vllm=True,
                                trtllm=False)
    targets = build(env, workspace)
    for variant in ("bf16", "fp8"):
        node = targets[f"{variant}-hf:validate-vllm"]
        assert (node["stage"], node["status"]) == ("validate", "built"), node["reason"]
        assert node["gates"] and all(gate["passed"] for gate in node["gates"].values())
        assert node["standin"] == ["vllm"]
        report = json.loads((Path(node["path"]) / "report.json").read_text())
        # the stand-in computes on the CPU and its engine config says so; no GPU product is recorded
        assert report["runner"] == "vllm 0.33.0+standin" and report["device"] == "cpu"
        assert report["scoring_options"] == {"skip_tokenizer_init": True, "max_logprobs": 256}  # the reference's top k
        record = LocalStore(workspace / "store").get_record(node["key"])
        assert "gpus" not in record.execution.figures and "validation_seconds" in record.execution.figures
        assert report["load_options_from"] == "serving/vllm_args.json"  # the packaged options, as `vllm serve` gets them
        assert report["load_options"] == {  # RECIPE's limits, dtype and serving.memory_fraction's default
            **({"quantization": "modelopt"} if variant == "fp8" else {}), "kv_cache_dtype": "auto",
            "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "max_model_len": 128, "max_num_seqs": 4,
            "max_num_batched_tokens": 256, "gpu_memory_utilization": 0.9, "dtype": "bfloat16"}
        # vLLM's figures ran and passed, but a stand-in's figures never publish: the ref is held back,
        # saying why (trtbuild.lock.publication)
        assert targets[f"{variant}-hf"]["ref"] == (f"its validation {variant}-hf:validate-vllm was made by a "
                                                   "stand-in toolchain (vllm)")
        assert targets[f"{variant}-hf"]["decided_by"] == []  # nothing decides what is not published
    lock = yaml.safe_load((workspace / "recipe.lock").read_text())
    assert lock["toolchain"]["validate:vllm"]["vllm"] == "0.33.0+standin"
    assert lock["targets"]["fp8-hf:validate-vllm"]["gates_passed"] is True
    # which runner each figure came from, and on what
    assert {k: v for k, v in lock["targets"]["fp8-hf:validate-vllm"].items() if k in ("runner", "device")} == {
        "runner": "vllm 0.33.0+standin", "device": "cpu"}
    assert {k: v for k, v in lock["targets"]["fp8-hf:validate"].items() if k in ("runner", "device")} == {
        "runner": "torch", "device": "cpu"}
    assert "runner" not in lock["targets"]["fp8-hf"]
    # nothing a stand-in made passes for real: the checkpoint it validated is never pushed
    pushed = trtbuild(env, workspace, "push", "recipe.yaml", "--store", str(tmp_path / "published"),
                      "--target", "fp8-hf")
    assert (pushed.returncode, pushed.stderr) == (
        1, "fp8-hf: held back: its validation fp8-hf:validate-vllm was made by a stand-in toolchain (vllm); "
           "not pushed\n")


def test_a_runtime_validation_that_fails_its_gates_holds_the_ref_back_though_torch_passed(workspace, tmp_path):
    """vLLM's figures fail the gates torch's pass (the stand-in's logits scaled: another distribution
    than the checkpoint's): the ref does not move, and the build says which validation failed."""
    copy = tmp_path / "workspace"
    shutil.copytree(workspace, copy, symlinks=True)
    (copy / "store" / "refs" / "tiny-vllm" / ".recipe.json").unlink()  # the copy's recipe takes the name over
    env = standin_toolchain_env({**os.environ, "TRTBUILD_CACHE": str(copy / "store"), "STANDIN_VLLM_LOGIT_SCALE": "3"},
                                "H100", vllm=True, trtllm=False)
    targets = build(env, copy, "--rebuild", "fp8-hf:validate-vllm")
    node = targets["fp8-hf:validate-vllm"]
    assert node["status"] == "failed" and node["reason"].startswith("failed its gates: kld_mean ")
    assert targets["fp8-hf:validate"]["status"] == "cached" and targets["fp8-hf:validate"]["gates"]
    assert (targets["fp8-hf"]["ref"], targets["fp8-hf"]["decided_by"]) == ("fp8-hf:validate-vllm failed its gates", [])
    human = trtbuild(env, copy, "build", "recipe.yaml")
    assert human.returncode == 1
    # the table's notes say it (wrapped in the column), and so does the folder list below the table
    row = next(line for line in human.stdout.splitlines() if line.strip("│ ").split(" ")[:1] == ["fp8-hf"])
    assert row.rstrip("│ ").endswith("│ held back: fp8-hf:validate-vllm failed its")
    folder = next(line for line in human.stdout.splitlines() if line.startswith("  fp8-hf "))
    assert folder.endswith(f"{targets['fp8-hf']['path']}  (held back: fp8-hf:validate-vllm failed its gates)")


def test_a_format_the_serving_table_rules_out_is_not_loaded(recorded_gpu, installed_packages):
    recorded_gpu("H100")
    installed_packages(vllm="0.33.0")
    assert vllm_runner.available("int4_awq", None) == (
        "vllm does not serve this checkpoint on this machine's sm90 GPU: its ModelOpt loader rejects quant_algo "
        "W4A16_AWQ (it accepts FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4, W4A16_NVFP4, MXFP8, MIXED_PRECISION)")
    assert vllm_runner.available("fp8", "fp8") is None


def test_every_hf_checkpoint_gets_a_vllm_validation_after_its_torch_one(tmp_path):
    from conftest import TINY_LLAMA
    from trtbuild.builder.graph import build_graph
    from trtbuild.builder.stages.needs import VllmRunner
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(TINY_LLAMA))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("schema: 1\nname: r\nsource: {path: model}\ngpus: [sm90]\nbackends: [hf-checkpoint]\n"
                      "variants: {bf16: {}, fp8: {quant: fp8, kv_cache: fp8}}\n"
                      "limits: {max_input_len: 64, max_seq_len: 128}\n")
    graph = build_graph(plan_recipe(load_recipe(recipe)))
    node = graph.node("fp8-hf:validate-vllm")
    assert (node.kind, node.stage.id, node.serves, node.after) == ("validate", "validate:vllm", "fp8-hf", ["fp8-hf:validate"])
    assert node.inputs == {"reference": "reference", "hf_checkpoint": "fp8-hf", "calibration": "calibration"}
    assert {k: p.value for k, p in node.params.items() if k != "gates"} == {
        "runner": "vllm", "dtype": "bfloat16", "quant": "fp8", "kv_cache": "fp8", "max_seq_len": 128}
    assert node.host == VllmRunner("fp8", "fp8")
    # the runner moves a ref only once every validation serving the node is done (runner._move_refs;
    # a failed gate fails the node): vLLM's is one of them
    assert [n.id for n in graph.validations_of("fp8-hf")] == ["fp8-hf:validate", "fp8-hf:validate-trtllm",
                                                               "fp8-hf:validate-vllm"]
    assert graph.node("bf16-hf:validate-vllm").inputs == {"reference": "reference", "hf_checkpoint": "bf16-hf"}
    assert not any(n.id.endswith(":validate-vllm") for n in build_graph(plan_recipe(load_recipe(recipe)), validate=False).nodes)
