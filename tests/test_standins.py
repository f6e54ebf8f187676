"""The stand-ins refuse what the real tools refuse, with the real tools' errors: trtllm-build
(tests/standin_trtllm/bin/trtllm-build, its RULES cite the TensorRT-LLM source of each), the LLM
API's keyword arguments (tests/standin_trtllm/tensorrt_llm/_llm_args.py) and NVML per handle
(tests/standin_nvml/pynvml.py, after nvidia-ml-py's pynvml.py). Each expected message below is the
real tool's text as read in its source, not the stand-in's output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trtbuild.host import hardware
from trtbuild.host.hardware import DetectedGpu

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "standin_trtllm"
BUILD = STANDIN / "bin" / "trtllm-build"


def checkpoint(tmp_path: Path, **config) -> Path:
    """A checkpoint folder trtllm-build reads up to its checks (the weights are never read by them)."""
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    base = {"architecture": "LlamaForCausalLM", "dtype": "float16", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 128,
            "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}}
    (folder / "config.json").write_text(json.dumps({**base, **config}))
    (folder / "rank0.safetensors").write_bytes(b"")
    return folder


def build(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BUILD), "--output_dir", str(tmp_path / "engine"), *args],
                          capture_output=True, text=True, cwd=tmp_path, env=env)


def refused(result: subprocess.CompletedProcess) -> str:
    """The last line of a refusal: what trtbuild's engine stage shows (stages/engine.py)."""
    assert result.returncode == 1, result.stderr
    assert not (Path(result.args[3]) / "config.json").exists()
    return result.stderr.splitlines()[-1]


# ---- trtllm-build: build.py main() ----

def test_context_logits_with_draft_tokens(tmp_path):
    ckpt = checkpoint(tmp_path)
    for flag in ("--gather_context_logits", "--gather_all_token_logits"):
        assert refused(build(tmp_path, "--checkpoint_dir", str(ckpt), flag, "--max_draft_len", "4")) == (
            "RuntimeError: Gather context logits is not support with draft len > 0. If want to get the accepted "
            "tokens' logits from target model, please just enable gather_generation_logits")


def test_model_cls_file_needs_model_cls_name(tmp_path):
    assert refused(build(tmp_path, "--checkpoint_dir", str(checkpoint(tmp_path)), "--model_cls_file", "m.py")) == \
        "AssertionError"


def test_no_checkpoint_and_no_model_config(tmp_path):
    assert refused(build(tmp_path)) == "AttributeError: 'NoneType' object has no attribute 'lower'"


def test_multiple_profiles_with_opt_num_tokens(tmp_path):
    assert refused(build(tmp_path, "--checkpoint_dir", str(checkpoint(tmp_path)), "--multiple_profiles", "enable",
                         "--opt_num_tokens", "64")) == (
        "RuntimeError: multiple_profiles is enabled, while opt_num_tokens is set. They are not supposed to be "
        "working in the same time for now.")


def test_paged_kv_cache_must_be_a_boolean(tmp_path):
    result = build(tmp_path, "--checkpoint_dir", str(checkpoint(tmp_path)), "--paged_kv_cache", "sometimes")
    assert result.returncode == 1
    assert "1 validation error for PluginConfig\npaged_kv_cache\n  Input should be a valid boolean" in result.stderr


# ---- build_model() and builder.build() ----

def test_streamingllm(tmp_path):
    assert refused(build(tmp_path, "--checkpoint_dir", str(checkpoint(tmp_path)), "--streamingllm", "enable")) == (
        "AssertionError: StreamingLLM is no longer supported because attention sink cannot work with the "
        "non-cyclic kv cache kernel & runtime changes.")


def test_pp_reduce_scatter_is_for_mixtral_only(tmp_path):
    assert refused(build(tmp_path, "--checkpoint_dir", str(checkpoint(tmp_path)), "--pp_reduce_scatter",
                         "enable")) == "AssertionError: PP reduce scatter is only supported in the mixtral model."


def test_an_architecture_outside_model_map(tmp_path):
    ckpt = checkpoint(tmp_path, architecture="LlamaForTokenClassification")
    assert refused(build(tmp_path, "--checkpoint_dir", str(ckpt))) == \
        "AssertionError: Unsupported model architecture: LlamaForTokenClassification"


def test_kv_cache_type_against_paged_kv_cache(tmp_path):
    ckpt = checkpoint(tmp_path)
    assert refused(build(tmp_path, "--checkpoint_dir", str(ckpt), "--kv_cache_type", "continuous",
                         "--paged_kv_cache", "enable")) == "AssertionError"


def test_swiglu_plugins_need_fused_mlp(tmp_path):
    ckpt = checkpoint(tmp_path)
    for plugin in ("--gemm_swiglu_plugin", "--low_latency_gemm_swiglu_plugin"):
        assert refused(build(tmp_path, "--checkpoint_dir", str(ckpt), plugin, "fp8", "--use_fused_mlp",
                             "disable")) == "RuntimeError: GemmSwiGLU plugin requires --use_fused_mlp flag"


def test_fast_build_of_weight_only_without_its_plugin(tmp_path):
    ckpt = checkpoint(tmp_path, quantization={"quant_algo": "W8A16"}, disable_weight_only_quant_plugin=True)
    assert refused(build(tmp_path, "--checkpoint_dir", str(ckpt), "--fast_build")) == \
        "RuntimeError: Manage weights of weight only quant works only with plugin currently."


def test_eagle_needs_an_eagle_checkpoint(tmp_path):
    """builder.build asserts hasattr(model.config, 'num_eagle_layers') before EAGLE's limits."""
    assert refused(build(tmp_path, "--checkpoint_dir", str(checkpoint(tmp_path)), "--speculative_decoding_mode",
                         "eagle")) == "AssertionError"


def test_eagle_limits(tmp_path):
    ckpt = checkpoint(tmp_path, num_eagle_layers=4)
    assert refused(build(tmp_path, "--checkpoint_dir", str(ckpt), "--speculative_decoding_mode", "eagle",
                         "--max_batch_size", "513")) == "AssertionError: Max batch size > 512 is not supported for EAGLE"


@pytest.mark.parametrize("quant, message", [
    ({"quant_algo": "W8A16"}, "RuntimeError: INT8/INT4 quantization is not supported on SM>=100."),
    # QuantMode.from_quant_algo maps W4A8_AWQ to use_weight_only(use_int4_weights=True, per_group=True)
    ({"quant_algo": "W4A8_AWQ"}, "RuntimeError: INT8/INT4 quantization is not supported on SM>=100."),
    ({"quant_algo": None, "kv_cache_quant_algo": "INT8"}, "RuntimeError: INT8/INT4 quantization is not supported on SM>=100."),
    ({"quant_algo": "W8A8_SQ_PER_CHANNEL"}, "RuntimeError: SmoothQuant is not supported on SM>=100."),
])
def test_blackwell_refuses_int8_formats(tmp_path, recorded_gpu, quant, message):
    recorded_gpu("B200")
    assert refused(build(tmp_path, "--checkpoint_dir", str(checkpoint(tmp_path, quantization=quant)))) == message


def test_plugin_validate_on_sm100(tmp_path, recorded_gpu):
    recorded_gpu("B200")
    assert refused(build(tmp_path, "--checkpoint_dir", str(checkpoint(tmp_path)), "--low_latency_gemm_plugin",
                         "fp8")) == "NotImplementedError: low_latency_gemm_plugin=fp8 is not supported on SM 100."


def test_the_same_builds_on_hopper(tmp_path, recorded_gpu):
    """The SM rules read GPU 0 (get_sm_version): on an H100 the W8A16 checkpoint builds."""
    recorded_gpu("H100")
    ckpt = checkpoint(tmp_path, quantization={"quant_algo": "W8A16"})
    write_weights(ckpt)
    result = build(tmp_path, "--checkpoint_dir", str(ckpt))
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "engine" / "config.json").read_text())["version"] == "1.2.0+standin"


# ---- what a stand-in engine computes with: TensorRT-LLM 1.2's load-time weight-only quantization ----
# Hand-computed from symmetric_quantize (cutlass_preprocessors.cpp@b35ac1b): per output channel the step
# is max|w| / 128 (int4: / 8), each value C round(w / step) (half away from zero) clipped to [-128, 127]
# ([-8, 7]), and the engine multiplies value x step. Rows are output channels.
LOADTIME_WEIGHT = [
    [2.0, 0.0078125, 0.0390625, -0.0390625, -0.0078125, -2.0],  # step 1/64: 128, +-0.5, +-2.5, -128 steps
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # max 0: every value 0
    [1.0, 0.01171875, -0.01171875, 0.00390625, 0.0, -0.0029296875],  # step 1/128: 128, 1.5, -1.5, 0.5, -0.375 steps
]
LOADTIME_EXPECTED = {
    # int8: 128 -> 127 (clipped), 0.5 -> 1, 2.5 -> 3 (torch.round and max/127 would give 0 and 2)
    "W8A16": [[127 / 64, 1 / 64, 3 / 64, -3 / 64, -1 / 64, -2.0], [0.0] * 6,
              [127 / 128, 2 / 128, -2 / 128, 1 / 128, 0.0, 0.0]],
    # int4: step 2/8 and 1/8; 8 -> 7 (clipped), 0.03125 steps and the like round to 0
    "W4A16": [[7 / 4, 0.0, 0.0, 0.0, 0.0, -2.0], [0.0] * 6, [7 / 8, 0.0, 0.0, 0.0, 0.0, 0.0]],
}


@pytest.mark.parametrize("algo", ["W8A16", "W4A16"])
def test_a_weight_only_engine_holds_the_per_channel_round_trip(tmp_path, recorded_gpu, algo):
    import torch
    from safetensors.torch import load_file, save_file

    recorded_gpu("H100")
    ckpt = checkpoint(tmp_path, dtype="float32", quantization={"quant_algo": algo})
    weight = torch.tensor(LOADTIME_WEIGHT, dtype=torch.float32)
    untouched = {"lm_head.weight": weight.clone(), "transformer.vocab_embedding.weight": weight.clone(),
                 "transformer.layers.0.input_layernorm.weight": torch.ones(6)}
    save_file({"transformer.layers.0.attention.qkv.weight": weight, "transformer.layers.0.mlp.fc.weight": weight.clone(),
               **untouched}, str(ckpt / "rank0.safetensors"))
    result = build(tmp_path, "--checkpoint_dir", str(ckpt))
    assert result.returncode == 0, result.stderr
    engine = load_file(str(tmp_path / "engine" / "rank0.engine"))
    expected = torch.tensor(LOADTIME_EXPECTED[algo], dtype=torch.float32)
    for name in ("transformer.layers.0.attention.qkv.weight", "transformer.layers.0.mlp.fc.weight"):
        assert torch.equal(engine[name], expected), (name, engine[name])
    for name, tensor in untouched.items():  # not a weight-only linear: kept as it is (weight_only_quantize_dict)
        assert torch.equal(engine[name], tensor)


def test_an_int8_wo_engine_holds_what_the_torch_validation_reads_back(tmp_path, recorded_gpu):
    """Two transcriptions of the same upstream code, each on its own: the stand-in's engine weights
    equal trtbuild's read-back of the W8A16 checkpoint (trtbuild/checkpoint/trtllm_loadtime.py), so
    validating the engine through the stand-in and the checkpoint through torch compute with the
    same weights."""
    import torch
    from safetensors.torch import load_file, save_file

    from trtbuild.checkpoint.trtllm_loadtime import loadtime_weight

    recorded_gpu("H100")
    ckpt = checkpoint(tmp_path, dtype="bfloat16", quantization={"quant_algo": "W8A16", "exclude_modules": None})
    generator = torch.Generator().manual_seed(0)
    names = ["transformer.layers.0.attention.qkv.weight", "transformer.layers.0.attention.dense.weight",
             "transformer.layers.0.mlp.fc.weight", "transformer.layers.0.mlp.gate.weight",
             "transformer.layers.0.mlp.proj.weight", "lm_head.weight", "transformer.vocab_embedding.weight"]
    tensors = {name: (torch.randn(128, 64, generator=generator) * 0.05).to(torch.bfloat16) for name in names}
    save_file(tensors, str(ckpt / "rank0.safetensors"))
    result = build(tmp_path, "--checkpoint_dir", str(ckpt))
    assert result.returncode == 0, result.stderr
    engine = load_file(str(tmp_path / "engine" / "rank0.engine"))
    changed = 0
    for name, tensor in tensors.items():
        read_back = loadtime_weight(name, tensor, "W8A16", None)
        assert torch.equal(engine[name], read_back), name
        changed += not torch.equal(read_back, tensor)
    assert changed == 5  # the five linears; lm_head and the embedding stay float


def test_a_dry_run_checks_everything_and_builds_no_engine(tmp_path, recorded_gpu):
    """build(): with dry_run no engine is serialized, the config and timing cache still are; a format
    the stand-in cannot compute is no reason to refuse then."""
    recorded_gpu("H100")
    ckpt = checkpoint(tmp_path, quantization={"quant_algo": "W4A16_AWQ", "group_size": 128})
    result = build(tmp_path, "--checkpoint_dir", str(ckpt), "--dry_run")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "engine").iterdir()) == ["config.json"]
    assert (tmp_path / "model.cache").is_file()
    again = tmp_path / "again"
    again.mkdir()
    assert refused(build(again, "--checkpoint_dir", str(ckpt), "--dry_run", "--multiple_profiles", "enable",
                         "--opt_num_tokens", "8")).startswith("RuntimeError: multiple_profiles is enabled")


def write_weights(folder: Path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"transformer.vocab_embedding.weight": torch.zeros(8, 64)}, str(folder / "rank0.safetensors"))


def test_max_input_len_above_max_seq_len_is_clipped_not_refused(tmp_path):
    """builder._init_max_seq_len warns and clips: the real tool builds, and so does the stand-in."""
    ckpt = checkpoint(tmp_path)
    write_weights(ckpt)
    result = build(tmp_path, "--checkpoint_dir", str(ckpt), "--max_input_len", "256", "--max_seq_len", "64")
    assert result.returncode == 0, result.stderr
    assert ("[TensorRT-LLM] [W] max_input_len is 256 is larger than max_seq_len 64, clipping it to max_seq_len"
            in result.stdout.splitlines())
    built = json.loads((tmp_path / "engine" / "config.json").read_text())["build_config"]
    assert (built["max_input_len"], built["max_seq_len"]) == (64, 64)


def test_what_only_the_standin_cannot_do_names_the_standin(tmp_path):
    ckpt = checkpoint(tmp_path)
    assert refused(build(tmp_path, "--checkpoint_dir", str(ckpt), "--model_cls_file", "m.py", "--model_cls_name",
                         "M")) == "trtllm-build 1.2.0+standin (a test stand-in): --model_cls_file m.py: the stand-in loads no custom model code"
    assert refused(build(tmp_path, "--model_config", str(ckpt / "config.json"))) == (
        f"trtllm-build 1.2.0+standin (a test stand-in): {ckpt / 'config.json'}: the stand-in builds no engine "
        "without weights (a config-only build)")


# ---- the LLM API's keyword arguments ----

@pytest.fixture
def llm_api(monkeypatch):
    monkeypatch.syspath_prepend(str(STANDIN))
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        monkeypatch.delitem(sys.modules, name)
    import tensorrt_llm
    from tensorrt_llm import _tensorrt_engine

    yield tensorrt_llm.LLM, _tensorrt_engine.LLM
    # The stand-in's modules leave with it: a later test in this process asks whether probing imported them.
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]


def test_llm_refuses_an_unknown_keyword(llm_api, tmp_path):
    torch_llm, engine_llm = llm_api
    with pytest.raises(ValueError) as caught:
        torch_llm(model=str(tmp_path), skip_tokenizer_init=True, max_logprobs=20)
    assert str(caught.value) == "LLM got invalid argument: max_logprobs"
    with pytest.raises(ValueError) as caught:
        engine_llm(model=str(tmp_path), skip_tokenizer_init=True, cuda_graph_config=None)
    assert str(caught.value) == "_TrtLLM got invalid argument: cuda_graph_config"


def test_the_pytorch_llm_refuses_tensorrt_only_keywords(llm_api, tmp_path):
    torch_llm, _ = llm_api
    with pytest.raises(ValueError) as caught:
        torch_llm(model=str(tmp_path), skip_tokenizer_init=True, build_config=None, fast_build=True)
    assert str(caught.value) == (
        "The following arguments are specific to TensorRT backend and cannot be used with PyTorch backend: "
        "['fast_build'].\nPlease use 'from tensorrt_llm._tensorrt_engine import LLM' instead to use the TensorRT "
        "backend.")


def test_a_real_keyword_the_standin_does_not_emulate_names_the_standin(llm_api, tmp_path):
    torch_llm, _ = llm_api
    with pytest.raises(NotImplementedError) as caught:
        torch_llm(model=str(tmp_path), skip_tokenizer_init=True, tensor_parallel_size=2)
    assert str(caught.value) == "tensorrt_llm 1.2.0+standin (a test stand-in): LLM(tensor_parallel_size=2) is not emulated"
    with pytest.raises(ValueError) as caught:
        torch_llm(model="", skip_tokenizer_init=True)
    assert str(caught.value) == "model should be provided."


# ---- NVML per handle ----

def test_each_handle_answers_for_its_gpu_and_trtbuild_reads_each(recorded_gpu):
    recorded_gpu("H100,A100")
    assert hardware.detect_gpus() == (DetectedGpu(0, "NVIDIA H100 80GB HBM3", "sm90", 81559 * 2**20),
                                      DetectedGpu(1, "NVIDIA A100-SXM4-80GB", "sm80", 81920 * 2**20))
    assert hardware.driver_info()["driver"] == "550.90.07"  # GPU 0's recorded driver: one driver per host


def test_an_index_without_a_gpu_and_a_non_handle_are_invalid_arguments(recorded_gpu):
    recorded_gpu("L40S", count=2)
    import pynvml

    pynvml.nvmlInit()
    try:
        for index in (2, -1):
            with pytest.raises(pynvml.NVMLError) as caught:
                pynvml.nvmlDeviceGetHandleByIndex(index)
            assert type(caught.value).__name__ == "NVMLError_InvalidArgument"
            assert (caught.value.value, str(caught.value)) == (pynvml.NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument")
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetName(1)
        assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(1)) == "NVIDIA L40S"
    finally:
        pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


# ---- trtbuild's plan and the stand-in judge the same commands alike ----
# trtbuild's rules (trtbuild/plan/engine_flags.py, quantformats.py) and the stand-in's RULES are separate
# transcriptions of the same upstream checks. Every engine command plan derives for these recipes
# runs through the stand-in (with --dry_run: every check, no engine): a target is ok exactly when
# the stand-in builds all its commands. The recipes leave out what trtllm-build leaves to its
# kernels and trtbuild refuses from the hardware (FP8 below sm89, FP4 below sm100) or from a help text
# (the FP8 GEMM plugins off FP8 on sm90): there the stand-in, like the real tool's Python, accepts.

BOARDS = {"sm80": "A100", "sm89": "L40S", "sm90": "H100", "sm100": "B200"}  # tests/standin_nvml/gpus
# The quant_algo / kv_cache_quant_algo each variant's checkpoint says (docs/checkpoints.md), restated.
QUANT_ALGO = {None: None, "fp8": "FP8", "int8_sq": "W8A8_SQ_PER_CHANNEL", "int4_awq": "W4A16_AWQ",
              "w4a8_awq": "W4A8_AWQ", "int8_wo": "W8A16", "int4_wo": "W4A16_AWQ"}
KV_ALGO = {None: None, "fp8": "FP8", "int8": "INT8"}
TINY_MIXTRAL_CONFIG = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 4,
                       "num_experts_per_tok": 2}
DRIFT_RECIPES = [  # (variants, gpus, engine.flags, validate.engines, config overrides)
    ("{base: {}, wo8: {quant: int8_wo}, sq: {quant: int8_sq}, sqkv: {quant: int8_sq, kv_cache: int8}, "
     "awq: {quant: int4_awq}, wo4: {quant: int4_wo}}", "[sm80, sm90, sm100]", {}, "twin", {}),
    ("{base: {}, fp8: {quant: fp8}, fp8kv: {quant: fp8, kv_cache: fp8}, w4a8: {quant: w4a8_awq}}",
     "[sm89, sm90, sm100]", {}, "twin", {}),
    ("{base: {}, fp8: {quant: fp8}}", "[sm89, sm100]", {"multiple_profiles": "enable", "opt_num_tokens": 64},
     "twin", {}),
    ("{base: {}, fp8: {quant: fp8}}", "[sm90]", {"multiple_profiles": "enable"}, "twin", {}),
    ("{base: {}}", "[sm90]", {"max_draft_len": 4}, "twin", {}),
    ("{base: {}}", "[sm90]", {"max_draft_len": 4}, "published", {}),
    ("{base: {}}", "[sm90]", {"max_draft_len": 4, "speculative_decoding_mode": "draft_tokens_external"}, "none", {}),
    ("{base: {}}", "[sm90]", {"max_draft_len": 4, "gather_all_token_logits": True}, "none", {}),
    ("{base: {}}", "[sm90]", {"speculative_decoding_mode": "eagle"}, "none", {}),
    ("{base: {}}", "[sm80, sm100]", {"pp_reduce_scatter": "enable"}, "twin", {}),
    ("{base: {}}", "[sm80, sm100]", {"pp_reduce_scatter": "enable"}, "twin", TINY_MIXTRAL_CONFIG),
    ("{fp8: {quant: fp8}}", "[sm90, sm100]", {"low_latency_gemm_swiglu_plugin": "fp8"}, "twin", {}),
    ("{fp8: {quant: fp8}}", "[sm90, sm100]", {"gemm_swiglu_plugin": "fp8", "use_fused_mlp": "disable"}, "twin", {}),
    ("{base: {}}", "[sm90, sm100]", {"bert_context_fmha_fp32_acc": "enable"}, "twin", {}),
    ("{wo8: {quant: int8_wo}}", "[sm80, sm100]", {"fast_build": True}, "twin", {}),
]


def standin_checkpoint(folder: Path, plan, quant, kv_cache, tp: int, pp: int) -> None:
    """What trtllm-build reads before its checks: config.json and one rank file per rank."""
    folder.mkdir()
    model = plan.model
    config = {"architecture": model.architecture, "dtype": plan.dtype, "hidden_size": model.hidden_size,
              "num_hidden_layers": model.num_layers, "num_attention_heads": model.num_heads,
              "max_position_embeddings": model.max_seq_len,
              "quantization": {"quant_algo": QUANT_ALGO[quant], "kv_cache_quant_algo": KV_ALGO[kv_cache]},
              "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}}
    (folder / "config.json").write_text(json.dumps(config))
    for rank in range(tp * pp):
        (folder / f"rank{rank}.safetensors").write_bytes(b"")


@pytest.mark.parametrize("case", range(len(DRIFT_RECIPES)))
def test_plan_ok_exactly_when_the_standin_builds_every_derived_command(ws, case):
    import os

    from conftest import STANDIN_NVML, TINY_LLAMA, minimal
    from trtbuild.plan.engine_command import build_argv
    from trtbuild.builder.graph import build_graph, twin_id
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe

    variants, gpus, flags, engines, overrides = DRIFT_RECIPES[case]
    extra = (f"variants: {variants}\nparallelism: [{{tp: 1, pp: 2}}]\nengine: {{flags: {json.dumps(flags)}}}\n"
             f"validate: {{engines: {engines}}}")
    plan = plan_recipe(load_recipe(ws.recipe(minimal(extra, gpus), config={**TINY_LLAMA, **overrides})))
    graph = build_graph(plan)
    env = {**os.environ, "PYTHONPATH": str(STANDIN_NVML), "STANDIN_NVML_COUNT": "1"}
    seen = {True: 0, False: 0}
    for target in (t for t in plan.targets if t.kind == "engine"):
        assert plan.target(target.depends_on[0]).ok, target.reason  # the checkpoints are not what is judged
        variant = plan.recipe.variants[target.variant]
        published = build_argv(graph.node(target.name).param_values(), 1, False)
        # validate.engines builds a twin with --gather_context_logits, or gathers in the published engine;
        # the graph shows those nodes for ok targets only, so the command is restated and checked there
        commands = [published] if engines == "none" else [published + ["--gather_context_logits"]]
        if engines == "twin":
            commands.append(published)
        if target.ok and engines == "twin":
            gathering = build_argv(graph.node(twin_id(target.name)).param_values(), 1, False)
            assert sorted(gathering) == sorted(commands[0])
        work = ws.root / target.name
        work.mkdir()
        standin_checkpoint(work / "checkpoint", plan, variant.quant, variant.kv_cache, target.tp, target.pp)
        verdicts = []
        for argv in commands:
            result = subprocess.run([sys.executable, str(BUILD), *argv[1:], "--dry_run"], capture_output=True,
                                    text=True, cwd=work, env={**env, "STANDIN_NVML_GPU": BOARDS[target.gpu]})
            assert "(a test stand-in)" not in result.stderr, result.stderr  # a limit of the stand-in, not a verdict
            assert result.returncode in (0, 1), result.stderr
            verdicts.append((result.returncode == 0, result.stderr.splitlines()[-1:] if result.returncode else ""))
        assert target.ok == all(ok for ok, _ in verdicts), (target.name, target.reason, verdicts)
        seen[target.ok] += 1
    assert seen[True] + seen[False] > 0
