"""The trtllm-build command, derived in one place: flags from the recipe and the rules, the argv,
its check against the pinned flag table, `explain`'s line, and what the build host needs."""

from __future__ import annotations

import json
import shlex

import pytest

from conftest import TINY_LLAMA, minimal
from trtbuild.plan import engine_command
from trtbuild.plan import engine_flags
from trtbuild.plan import estimate
from trtbuild.host import hardware
from trtbuild.facts import gpus, quantformats
from trtbuild.plan.engine_command import FlagTableError, build_argv, parse_with_flag_table, shell_line, workers_for
from trtbuild.builder.graph import build_graph, twin_id
from trtbuild.plan.expand import plan_recipe
from trtbuild.recipe.schema import load_recipe

# Every quantization a recipe can ask for, as (quant, kv_cache).
FORMATS = {
    "base": (None, None), "fp8": ("fp8", None), "fp8kv": ("fp8", "fp8"), "sq": ("int8_sq", None),
    "sqkv": ("int8_sq", "int8"), "awq": ("int4_awq", None), "w4a8": ("w4a8_awq", None), "wo8": ("int8_wo", None),
    "wo4": ("int4_wo", None), "fp4": ("nvfp4", None),
}
SMS = list(gpus.SM_ARCHES)
FLAG_SETS = [
    {},
    {"gemm_plugin": "auto"},
    {"use_fp8_context_fmha": "enable"},
    {"multiple_profiles": "enable", "weight_sparsity": True, "log_level": "verbose"},
    {"use_paged_context_fmha": "enable", "use_fused_mlp": "enable"},
    {"gemm_plugin": "fp8", "gemm_swiglu_plugin": "fp8"},
    {"gemm_plugin": "nvfp4"},
]
REFUSING = {2, 4, 5, 6}  # the flag sets some target cannot take
LIMITS = "limits: {max_batch_size: 8, max_input_len: 1024, max_seq_len: 2048, max_num_tokens: 2048}"


def variants_yaml(names) -> str:
    body = ", ".join(f"{name}: {{{', '.join(f'{k}: {v}' for k, v in zip(('quant', 'kv_cache'), FORMATS[name]) if v)}}}"
                     for name in names)
    return f"variants: {{{body}}}"


def graph_of(ws, extra: str, gpus: str = "[sm90]", name: str = "recipe.yaml"):
    path = ws.recipe(minimal(extra, gpus), name=name)
    plan = plan_recipe(load_recipe(path))
    return plan, build_graph(plan)


def head(limits=(8, 1024, 2048, 2048, 1)) -> list[str]:
    names = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width")
    words = ["trtllm-build", "--checkpoint_dir", "checkpoint", "--output_dir", "engine"]
    for name, value in zip(names, limits):
        words += [f"--{name}", str(value)]
    return words


# ---- argv written out by hand from the rules ---------------------------------------------------------

def test_unquantized_twin_and_published_engine_argv(ws):
    _, graph = graph_of(ws, f"variants: {{base: {{}}}}\n{LIMITS}")
    twin = graph.node(twin_id("base-tp1-sm90")).param_values()
    engine = graph.node("base-tp1-sm90").param_values()
    tail = ["--workers", "1", "--output_timing_cache", "timing.cache"]
    # gemm_plugin: the checkpoint dtype (bfloat16, the tiny config's); FP8 context FMHA off without FP8
    assert build_argv(twin, 1, False) == head() + [
        "--gather_context_logits", "--gemm_plugin", "bfloat16", "--use_fp8_context_fmha", "disable", *tail]
    assert build_argv(engine, 1, False) == head() + [
        "--gemm_plugin", "bfloat16", "--use_fp8_context_fmha", "disable", *tail]


def test_smoothquant_with_an_int8_kv_cache_on_ampere_argv(ws):
    _, graph = graph_of(ws, f"{variants_yaml(['sqkv'])}\n{LIMITS}\nengine: {{flags: {{max_lora_rank: 32}}}}",
                        gpus="[sm80]")
    params = graph.node("sqkv-tp1-sm80").param_values()
    assert build_argv(params, 2, True) == head() + [
        "--gemm_plugin", "bfloat16", "--max_lora_rank", "32", "--use_fp8_context_fmha", "disable",
        "--use_fused_mlp", "disable", "--use_paged_context_fmha", "disable",
        "--workers", "2", "--input_timing_cache", "timing-in.cache", "--output_timing_cache", "timing.cache"]


def test_fp8_with_fp8_kv_on_ada_and_recipe_flags_argv(ws):
    extra = (f"{variants_yaml(['fp8kv'])}\n{LIMITS}\n"
             "engine: {flags: {multiple_profiles: enable, weight_sparsity: true, tokens_per_block: 64}}")
    _, graph = graph_of(ws, extra, gpus="[L40S]")
    params = graph.node("fp8kv-tp1-sm89").param_values()
    assert build_argv(params, 1, False) == head() + [
        "--gemm_plugin", "fp8", "--multiple_profiles", "enable", "--tokens_per_block", "64",
        "--use_fp8_context_fmha", "enable", "--weight_sparsity", "--workers", "1",
        "--output_timing_cache", "timing.cache"]


def test_nvfp4_on_blackwell_recipe_gemm_plugin_wins(ws):
    _, graph = graph_of(ws, f"{variants_yaml(['fp4'])}\n{LIMITS}\nengine: {{flags: {{gemm_plugin: disable}}}}",
                        gpus="[sm100]")
    node = graph.node("fp4-tp1-sm100")
    assert build_argv(node.param_values(), 4, False) == head() + [
        "--gemm_plugin", "disable", "--use_fp8_context_fmha", "enable", "--use_fused_mlp", "disable",
        "--workers", "4", "--output_timing_cache", "timing.cache"]
    parts = node.params["flags"].parts
    assert parts["gemm_plugin"] == "recipe: engine.flags.gemm_plugin"
    assert parts["use_fp8_context_fmha"].startswith("rule: ") and "reference/trtllm.md" in parts["use_fp8_context_fmha"]


# ---- every recipe x quantization x SM x flag set -------------------------------------------------------

def expected_derived(quant, kv_cache, sm: int, dtype: str) -> dict:
    """The rules, restated: what the derived flags must be when the recipe sets none of them."""
    algo = quantformats.FORMATS[quant].quant_algo if quant else None
    gemm = "fp8" if algo == "FP8" and sm >= 89 else "nvfp4" if algo == "NVFP4" and sm >= 100 else dtype
    flags = {"gemm_plugin": gemm,
             "use_fp8_context_fmha": "enable" if algo in ("FP8", "W4A8_AWQ", "NVFP4") and sm >= 89 else "disable"}
    if kv_cache == "int8" or (kv_cache == "fp8" and sm < 89):
        flags["use_paged_context_fmha"] = "disable"
    if algo not in (None, "FP8"):
        flags["use_fused_mlp"] = "disable"
    return flags


@pytest.mark.parametrize("flag_set", range(len(FLAG_SETS)))
def test_every_quantization_sm_and_flag_set_derives_a_command_the_flag_table_parses(ws, flag_set):
    recipe_flags = FLAG_SETS[flag_set]
    extra = f"{variants_yaml(FORMATS)}\n{LIMITS}\nengine: {{flags: {json.dumps(recipe_flags)}}}"
    plan, graph = graph_of(ws, extra, gpus=json.dumps(SMS))
    seen_ok = seen_refused = 0
    for vname, (quant, kv_cache) in FORMATS.items():
        for sm in SMS:
            target = plan.target(f"{vname}-tp1-{sm}")
            fmt = engine_flags.EngineFormat(quant, kv_cache, plan.dtype, sm)
            unsupported = quantformats.quant_unsupported_reason(quant, kv_cache, sm)
            problem = engine_flags.recipe_flag_problem(recipe_flags, fmt)
            checkpoint = plan.target(f"{vname}-tp1")  # an impossible checkpoint makes its engines impossible
            if not checkpoint.ok:
                assert target.reason == f"needs checkpoint {checkpoint.name}, which is impossible: {checkpoint.reason}"
                continue
            assert target.reason == (unsupported or problem)
            if problem and not unsupported:  # a recipe flag the target cannot take: named by its YAML path
                seen_refused += 1
                assert any(problem.startswith(f"engine.flags.{name}={value}") for name, value in recipe_flags.items())
            if not target.ok:
                continue
            seen_ok += 1
            derived = expected_derived(quant, kv_cache, int(sm[2:]), plan.dtype)
            for node_id, gathers in ((target.name, False), (twin_id(target.name), True)):
                node = graph.node(node_id)
                flags = node.param_values()["flags"]
                want = {**derived, **recipe_flags, **({"gather_context_logits": True} if gathers else {})}
                assert flags == dict(sorted(want.items()))
                for name, origin in node.params["flags"].parts.items():
                    if name in recipe_flags:
                        assert origin == f"recipe: engine.flags.{name}"
                    else:
                        assert origin.startswith("rule: ") and ("reference/trtllm.md" in origin or "help" in origin
                                                                 or "validate.engines" in origin)
                for workers, timing in ((1, False), (3, True)):
                    argv = build_argv(node.param_values(), workers, timing)
                    parsed = parse_with_flag_table(argv)
                    assert (parsed.checkpoint_dir, parsed.output_dir) == ("checkpoint", "engine")
                    assert (parsed.max_batch_size, parsed.max_input_len, parsed.max_seq_len, parsed.max_num_tokens,
                            parsed.max_beam_width) == (8, 1024, 2048, 2048, 1)
                    assert parsed.workers == workers and parsed.output_timing_cache == "timing.cache"
                    assert parsed.input_timing_cache == ("timing-in.cache" if timing else None)
                    assert parsed.gather_context_logits is gathers
                    for name, value in want.items():
                        assert getattr(parsed, name) == value
                    assert shlex.split(shell_line(argv)) == argv
    assert seen_ok > 0
    assert (seen_refused > 0) == (flag_set in REFUSING)


def test_a_recipe_flag_the_target_cannot_take_makes_it_impossible_naming_the_yaml_path(ws):
    plan, _ = graph_of(ws, f"{variants_yaml(['base', 'fp8', 'sqkv'])}\n"
                       "engine: {flags: {use_fp8_context_fmha: enable, use_paged_context_fmha: enable}}",
                       gpus="[sm89, sm90]")
    statuses = {t.name: (t.status, t.reason) for t in plan.targets if t.kind == "engine"}
    assert statuses == {
        "base-tp1-sm89": ("impossible", "engine.flags.use_fp8_context_fmha=enable needs FP8, W4A8 AWQ or NVFP4 "
                          "quantization on sm89 or newer (trtllm-build turns it off otherwise); the target has "
                          "unquantized weights on sm89"),
        "base-tp1-sm90": ("impossible", "engine.flags.use_fp8_context_fmha=enable needs FP8, W4A8 AWQ or NVFP4 "
                          "quantization on sm89 or newer (trtllm-build turns it off otherwise); the target has "
                          "unquantized weights on sm90"),
        "fp8-tp1-sm89": ("ok", None),
        "fp8-tp1-sm90": ("ok", None),
        "sqkv-tp1-sm89": ("impossible", "engine.flags.use_fp8_context_fmha=enable needs FP8, W4A8 AWQ or NVFP4 "
                          "quantization on sm89 or newer (trtllm-build turns it off otherwise); the target has "
                          "INT8 SmoothQuant with an INT8 KV cache on sm89"),
        "sqkv-tp1-sm90": ("impossible", "engine.flags.use_fp8_context_fmha=enable needs FP8, W4A8 AWQ or NVFP4 "
                          "quantization on sm89 or newer (trtllm-build turns it off otherwise); the target has "
                          "INT8 SmoothQuant with an INT8 KV cache on sm90"),
    }


def test_the_fp8_gemm_plugin_needs_fp8_weights(ws):
    plan, _ = graph_of(ws, f"{variants_yaml(['awq', 'fp8'])}\nengine: {{flags: {{gemm_plugin: fp8}}}}")
    assert plan.target("fp8-tp1-sm90").ok
    assert plan.target("awq-tp1-sm90").reason == (
        "engine.flags.gemm_plugin=fp8 needs FP8 weights (quant: fp8) on sm89 or newer; the target has INT4 AWQ "
        "(W4A16) on sm90")


def test_a_bad_flag_value_is_refused_by_plan_in_one_line(ws, run):
    path = ws.recipe(minimal("engine:\n  flags: {gemm_plugin: fp16}"))
    result = run("plan", path)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (f"{path}:8:24: engine.flags.gemm_plugin: 'fp16' is not one of auto, float16, float32, "
                             "bfloat16, int32, fp8, nvfp4, disable\n")


def test_a_switch_given_a_string_is_refused_by_plan_in_one_line(ws, run):
    path = ws.recipe(minimal("engine:\n  flags: {weight_sparsity: enable}"))
    result = run("plan", path)
    assert result.exit_code == 2
    assert result.stderr == f"{path}:8:28: engine.flags.weight_sparsity: 'enable' is not true or false (weight_sparsity is a switch)\n"


# ---- the parser built from the flag table ------------------------------------------------------------

@pytest.mark.parametrize("words, complaint", [
    (["--max_seq_length", "8"], "unrecognized arguments: --max_seq_length 8"),
    (["--gemm_plugin", "fp16"], "argument --gemm_plugin: invalid choice: 'fp16'"),
    (["--use_fused_mlp", "true"], "argument --use_fused_mlp: invalid choice: 'true'"),
    (["--max_batch_size", "eight"], "argument --max_batch_size: invalid int value: 'eight'"),
])
def test_the_flag_table_parser_refuses_what_trtllm_build_refuses(words, complaint):
    with pytest.raises(FlagTableError) as caught:
        parse_with_flag_table(["trtllm-build", "--checkpoint_dir", "checkpoint", *words])
    assert str(caught.value).startswith(complaint)


def test_the_parser_knows_aliases():
    assert parse_with_flag_table(["--max_decoder_seq_len", "64"]).max_seq_len == 64


# ---- workers, tactic options ---------------------------------------------------------------------------

@pytest.mark.parametrize("world, local, workers", [(1, 0, 1), (1, 8, 1), (4, 2, 2), (2, 8, 2), (8, 8, 8), (3, 0, 1)])
def test_workers_are_local_gpus_capped_by_the_world_size(world, local, workers):
    assert workers_for(world, local) == workers


def test_the_twin_and_its_engine_share_tactic_options(ws):
    _, graph = graph_of(ws, f"{variants_yaml(['fp8'])}\nengine: {{flags: {{log_level: verbose}}}}")
    engine = graph.node("fp8-tp1-sm90").param_values()
    twin = graph.node(twin_id("fp8-tp1-sm90")).param_values()
    assert twin["flags"] != engine["flags"]
    assert engine_command.tactic_options(twin) == engine_command.tactic_options(engine) == {
        "gemm_plugin": "fp8", "use_fp8_context_fmha": "enable"}


# ---- explain -----------------------------------------------------------------------------------------

DEMO_LIKE = """
    dtype: bfloat16
    variants:
      base: {}
      int4-wo: {quant: int4_wo}
      fp8: {quant: fp8, kv_cache: fp8}
    parallelism:
      - {tp: 1}
      - {tp: 2}
    limits: {max_batch_size: 8, max_input_len: 1024, max_seq_len: 2048, max_num_tokens: 2048}
    backends: [engine, hf-checkpoint]
"""


@pytest.fixture
def gpus(monkeypatch):
    """This host's GPUs as explain counts them (NVML is not asked)."""

    def use(count: int):
        found = tuple(hardware.DetectedGpu(i, "NVIDIA H100 80GB HBM3", "sm90", 85899345920) for i in range(count))
        monkeypatch.setattr(hardware, "detect_gpus", lambda: found)

    return use


def demo_like(ws, gpus: str):
    """The demo recipe's shape on the tiny model, whose folder explain hashes as the source."""
    (ws.root / "model").mkdir()
    (ws.root / "model" / "config.json").write_text(json.dumps(TINY_LLAMA))
    return ws.recipe(minimal(DEMO_LIKE, gpus=gpus))


def command_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("trtllm-build")]


def test_explain_prints_the_exact_command_of_an_engine_and_its_twin(ws, run, gpus, tmp_path):
    gpus(0)
    path = demo_like(ws, "[sm89, sm90]")
    result = run("explain", path, "fp8-tp1-sm90", "--store", tmp_path / "store")
    assert result.exit_code == 0, result.output
    line = ("trtllm-build --checkpoint_dir checkpoint --output_dir engine --max_batch_size 8 --max_input_len 1024 "
            "--max_seq_len 2048 --max_num_tokens 2048 --max_beam_width 1 {gather}--gemm_plugin fp8 "
            "--use_fp8_context_fmha enable --workers 1 --output_timing_cache timing.cache")
    assert command_lines(result.stdout) == [line.format(gather="--gather_context_logits "), line.format(gather="")]
    assert ("    run in a work folder holding checkpoint/; --workers 1: this host's 0 GPUs, capped by the world "
            "size 1 (at least 1); --input_timing_cache timing-in.cache is added once a timing cache for this SM, "
            "TensorRT version and these tactic options is stored (shown as the first build runs)") in result.stdout
    assert "    flag gemm_plugin             = fp8                  rule: FP8 weights use the fp8 GEMM plugin" in result.stdout


def test_explain_json_has_the_command_with_this_hosts_workers(ws, run, gpus, tmp_path):
    gpus(4)
    path = demo_like(ws, "[sm89, sm90]")
    result = run("explain", path, "base-tp2-sm89", "--store", tmp_path / "store", "--json")
    assert result.exit_code == 0, result.output
    nodes = {n["name"]: n for n in json.loads(result.stdout)}
    engine = nodes["base-tp2-sm89"]
    assert engine["command"] == (
        "trtllm-build --checkpoint_dir checkpoint --output_dir engine --max_batch_size 8 --max_input_len 1024 "
        "--max_seq_len 2048 --max_num_tokens 2048 --max_beam_width 1 --gemm_plugin bfloat16 "
        "--use_fp8_context_fmha disable --workers 2 --output_timing_cache timing.cache")
    assert {f["flag"]: f["value"] for f in engine["flags"]} == {"gemm_plugin": "bfloat16", "use_fp8_context_fmha": "disable"}
    assert all(f["origin"].startswith("rule: ") for f in engine["flags"])
    assert nodes["base-tp2"]["command"] is None


def test_explain_of_an_impossible_engine_shows_no_command(ws, run, gpus, tmp_path):
    gpus(0)
    path = demo_like(ws, "[sm80]")
    result = run("explain", path, "fp8-tp1-sm80", "--store", tmp_path / "store")
    assert result.exit_code == 0, result.output
    assert command_lines(result.stdout) == []
    assert "impossible: FP8 needs FP8 tensor cores (sm89 or newer); sm80 has none" in result.stdout


# ---- build-host memory ----------------------------------------------------------------------------------

def test_build_memory_needs_follow_the_documented_rule(ws):
    plan, _ = graph_of(ws, f"{variants_yaml(['base', 'awq'])}\nparallelism: [{{tp: 2}}]\n{LIMITS}")
    for vname, quant in (("base", None), ("awq", "int4_awq")):
        target = plan.target(f"{vname}-tp2-sm90")
        engine = estimate.weights_bytes_per_gpu(plan.model, 2, 1, quant, plan.dtype, 128)
        loaded = estimate.weights_bytes_per_gpu(plan.model, 2, 1, None, plan.dtype)
        gpu = engine + estimate.activation_bytes(plan.model, 2, plan.dtype, 2048, 8, 1)
        per_worker = loaded + engine + estimate.BUILD_HOST_OVERHEAD
        assert estimate.build_memory_needs(plan, target) == estimate.BuildNeeds(2 * per_worker, gpu, 2)
        assert estimate.build_memory_needs(plan, target, workers=1) == estimate.BuildNeeds(per_worker, gpu, 1)
        assert estimate.build_memory_needs(plan, target, workers=16).workers == 2  # never more than the ranks
    # a quantized engine is smaller on the GPU; the host still loads full-precision weights
    base, awq = (estimate.build_memory_needs(plan, plan.target(f"{v}-tp2-sm90")) for v in ("base", "awq"))
    assert awq.gpu_bytes_per_worker < base.gpu_bytes_per_worker and awq.host_ram_bytes < base.host_ram_bytes


def test_plan_shows_the_build_host_needs(ws, run):
    path = ws.recipe(minimal(f"{variants_yaml(['base'])}\n{LIMITS}"))
    result = run("plan", path, "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    plan = plan_recipe(load_recipe(path))
    needs = estimate.build_memory_needs(plan, plan.target("base-tp1-sm90"))
    assert {t["name"]: t["build_needs"] for t in data["targets"]} == {
        "base-tp1": None,
        "base-tp1-sm90": {"host_ram_bytes": needs.host_ram_bytes, "gpu_bytes_per_worker": needs.gpu_bytes_per_worker,
                          "workers": 1}}
    table = run("plan", path).stdout
    assert "build host" in table and needs.label() in table
    assert needs.label() == (f"{estimate.format_bytes(needs.host_ram_bytes)} RAM, "
                             f"{estimate.format_bytes(needs.gpu_bytes_per_worker)}/GPU x1")
