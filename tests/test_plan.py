"""Target expansion and every planning rule, with the reason a person reads."""

from __future__ import annotations

import json

import pytest

from conftest import LLAMA_70B, TINY_LLAMA, minimal
from trtbuild.errors import InvalidInput
from trtbuild.plan.expand import plan_recipe, select
from trtbuild.recipe.schema import load_recipe


def plan_of(ws, extra: str = "", gpus: str = "[sm90]", config: dict | None = None, **kw):
    return plan_recipe(load_recipe(ws.recipe(minimal(extra, gpus), config=config)), **kw)


def statuses(plan) -> dict[str, tuple[str, str | None]]:
    return {t.name: (t.status, t.reason) for t in plan.targets}


def test_expansion_names_kinds_and_dependencies(ws):
    plan = plan_of(ws, """
        variants: {bf16: {}, fp8: {quant: fp8}}
        parallelism: [{tp: 1}, {tp: 2, pp: 2}]
        backends: [engine, hf-checkpoint]
        """, gpus="[sm89, H100]")
    assert [t.name for t in plan.targets] == [
        "bf16-tp1", "bf16-tp1-sm89", "bf16-tp1-sm90", "bf16-tp2-pp2", "bf16-tp2-pp2-sm89", "bf16-tp2-pp2-sm90", "bf16-hf",
        "fp8-tp1", "fp8-tp1-sm89", "fp8-tp1-sm90", "fp8-tp2-pp2", "fp8-tp2-pp2-sm89", "fp8-tp2-pp2-sm90", "fp8-hf",
    ]
    engine = plan.target("fp8-tp2-pp2-sm90")
    assert (engine.kind, engine.variant, engine.tp, engine.pp, engine.gpu, engine.backend) == ("engine", "fp8", 2, 2, "sm90", "engine")
    assert engine.depends_on == ("fp8-tp2-pp2",)
    hf = plan.target("fp8-hf")
    assert (hf.kind, hf.tp, hf.pp, hf.gpu, hf.backend, hf.depends_on) == ("hf-checkpoint", None, None, None, "hf-checkpoint", ())
    assert all(t.ok for t in plan.targets)


def test_products_of_one_sm_make_one_engine_that_must_fit_the_smallest(ws):
    plan = plan_of(ws, gpus="[H200, H100, sm90]")
    [engine] = [t for t in plan.targets if t.kind == "engine"]
    assert engine.name == "base-tp1-sm90" and engine.estimate.gpu_product == "H100"


def test_dtype_defaults_to_the_model_config_then_float16(ws):
    assert plan_of(ws).dtype == "bfloat16"
    no_dtype = {k: v for k, v in TINY_LLAMA.items() if k != "torch_dtype"}
    assert plan_of(ws, config=no_dtype).dtype == "float16"
    assert plan_of(ws, "dtype: float32").dtype == "float32"


@pytest.mark.parametrize("variant, gpu, reason", [
    ("{quant: fp8}", "sm80", "FP8 needs FP8 tensor cores (sm89 or newer); sm80 has none"),
    ("{quant: fp8}", "A10G", "FP8 needs FP8 tensor cores (sm89 or newer); sm86 has none"),
    ("{quant: w4a8_awq}", "sm86", "W4A8 AWQ needs FP8 tensor cores (sm89 or newer); sm86 has none"),
    ("{quant: nvfp4}", "sm90", "NVFP4 needs FP4 tensor cores (sm100 or newer); sm90 has none"),
    ("{kv_cache: fp8}", "sm80", "an FP8 KV cache needs sm89 or newer; sm80 has no FP8 support"),
    ("{kv_cache: nvfp4}", "sm90", "an NVFP4 KV cache needs sm100 or newer; sm90 has no FP4 support"),
    ("{quant: int8_wo}", "sm100", "INT8 weight-only is rejected on sm100 by TensorRT-LLM: 'INT8/INT4 quantization is not supported on SM>=100.'"),
    ("{quant: int4_wo}", "sm100", "INT4 weight-only is rejected on sm100 by TensorRT-LLM: 'INT8/INT4 quantization is not supported on SM>=100.'"),
    ("{quant: int4_awq}", "sm100", "INT4 AWQ (W4A16) is rejected on sm100 by TensorRT-LLM: 'INT8/INT4 quantization is not supported on SM>=100.'"),
    ("{quant: w4a8_awq}", "sm100", "W4A8 AWQ is rejected on sm100 by TensorRT-LLM: 'INT8/INT4 quantization is not supported on SM>=100.'"),
    ("{kv_cache: int8}", "sm100", "an INT8 KV cache is rejected on sm100 by TensorRT-LLM: 'INT8/INT4 quantization is not supported on SM>=100.'"),
    ("{quant: int8_sq}", "GB200", "SmoothQuant is rejected on sm100 by TensorRT-LLM: 'SmoothQuant is not supported on SM>=100.'"),
])
def test_quantization_the_gpu_cannot_run_is_impossible(ws, variant, gpu, reason):
    plan = plan_of(ws, f"variants: {{v: {variant}}}", gpus=f"[{gpu}]")
    [engine] = [t for t in plan.targets if t.kind == "engine"]
    assert (engine.status, engine.reason) == ("impossible", reason)
    assert plan.target("v-tp1").ok  # the checkpoint itself is fine


@pytest.mark.parametrize("variant, gpu", [
    ("{quant: fp8, kv_cache: fp8}", "sm89"), ("{quant: w4a8_awq}", "sm90"), ("{quant: nvfp4, kv_cache: nvfp4}", "sm100"),
    ("{quant: int8_sq, kv_cache: int8}", "sm80"), ("{quant: int4_awq}", "sm86"),
    # the SM>=100 rejections cover SM 100-119 only: RTX 50xx / RTX PRO (sm120) keep INT8/INT4
    ("{quant: int4_wo}", "RTX5090"), ("{quant: int4_awq}", "sm120"), ("{quant: int8_sq}", "sm120"),
    ("{quant: w4a8_awq}", "sm120"), ("{quant: nvfp4}", "sm120"),
])
def test_supported_pairings_are_ok(ws, variant, gpu):
    plan = plan_of(ws, f"variants: {{v: {variant}}}", gpus=f"[{gpu}]")
    assert all(t.ok for t in plan.targets), statuses(plan)


def test_tp_must_divide_attention_heads(ws):
    plan = plan_of(ws, "parallelism: [{tp: 3}]")
    assert statuses(plan)["base-tp3"] == ("impossible", "tp=3 does not divide the 8 attention heads")
    engine = plan.target("base-tp3-sm90")
    assert engine.status == "impossible"
    assert engine.reason == "needs checkpoint base-tp3, which is impossible: tp=3 does not divide the 8 attention heads"


def test_kv_heads_are_split_or_duplicated_following_tensorrt_llm(ws):
    # 12 heads, 4 KV heads: tp=2 splits them, tp=4 gives one each; tp=12 duplicates (12 % 4 == 0).
    config = {**TINY_LLAMA, "num_attention_heads": 12, "num_key_value_heads": 4, "hidden_size": 768}
    plan = plan_of(ws, "parallelism: [{tp: 2}, {tp: 4}, {tp: 12}, {tp: 6}]", config=config)
    s = statuses(plan)
    assert s["base-tp2"][0] == s["base-tp4"][0] == s["base-tp12"][0] == "ok"
    assert s["base-tp6"] == ("impossible", "tp=6 and 4 KV heads: TensorRT-LLM needs tp to divide the KV heads, "
                                          "or the KV heads to divide tp (it then duplicates them)")
    assert plan.target("base-tp12-sm90").estimate.kv_bytes_per_token == 2 * 4 * 1 * 64 * 2  # one KV head per GPU


def test_pp_cannot_exceed_layers(ws):
    plan = plan_of(ws, "parallelism: [{tp: 1, pp: 4}, {tp: 1, pp: 5}]")
    s = statuses(plan)
    assert s["base-tp1-pp4"][0] == "ok"
    assert s["base-tp1-pp5"] == ("impossible", "pp=5 exceeds the model's 4 layers")


def test_awq_group_size_must_divide_the_split_dimensions(ws):
    plan = plan_of(ws, """
        variants: {g128: {quant: int4_awq}, g96: {quant: int4_awq, group_size: 96}, g64: {quant: w4a8_awq, group_size: 64}}
        parallelism: [{tp: 1}, {tp: 4}]
        backends: [engine, hf-checkpoint]
        """)
    s = statuses(plan)
    assert s["g128-tp1"][0] == "ok"
    # intermediate_size/tp = 128 divides; the attention width per rank (64) does not
    assert s["g128-tp4"] == ("impossible", "AWQ group_size 128 does not divide attention width/tp (256/4) = 64")
    assert s["g96-tp1"] == ("impossible", "AWQ group_size 96 does not divide hidden_size = 256")
    assert s["g96-hf"] == ("impossible", "AWQ group_size 96 does not divide hidden_size = 256")
    assert s["g64-tp4"][0] == "ok"


def test_awq_group_size_reason_names_the_dimension(ws):
    plan = plan_of(ws, "variants: {awq: {quant: int4_awq}}\nparallelism: [{tp: 4}]")
    assert statuses(plan)["awq-tp4"] == ("impossible", "AWQ group_size 128 does not divide attention width/tp (256/4) = 64")


def test_int4_weight_only_group_size_is_checked_against_the_model(ws):
    """int4_wo quantizes per group of 128 input channels (INT4_BLOCKWISE_WEIGHT_ONLY_CFG): the plan
    checks the group against the split dimensions, as for AWQ."""
    config = {**TINY_LLAMA, "hidden_size": 320, "intermediate_size": 640, "head_dim": 40}
    plan = plan_of(ws, "variants: {wo: {quant: int4_wo}, wo64: {quant: int4_wo, group_size: 64}}\n"
                       "backends: [engine, hf-checkpoint]", config=config)
    s = statuses(plan)
    assert s["wo-tp1"] == ("impossible", "INT4 weight-only group_size 128 does not divide hidden_size = 320")
    assert s["wo-hf"] == ("impossible", "INT4 weight-only group_size 128 does not divide hidden_size = 320")
    assert s["wo64-tp1"] == ("ok", None)


def test_int4_weight_only_group_size_is_in_the_checkpoint_keys(ws):
    from trtbuild.builder.graph import build_graph

    plan = plan_of(ws, "variants: {wo: {quant: int4_wo}, wo64: {quant: int4_wo, group_size: 64}, w8: {quant: int8_wo}}")
    graph = build_graph(plan)
    for node_id, group in (("wo-tp1", 128), ("wo-quantized", 128), ("wo64-tp1", 64), ("wo64-quantized", 64)):
        assert graph.node(node_id).params["group_size"].value == group, node_id
    assert graph.node("wo-tp1").params["group_size"].origin == "default: variants.wo.group_size"
    assert "group_size" not in graph.node("w8-tp1").params


def test_int8_wo_engines_come_from_a_float_checkpoint_tensorrt_llm_quantizes(ws):
    """TensorRT-LLM 1.2 quantizes W8A16 at load: int8_wo engines for sm80 and sm90 are planned, their
    checkpoint is converted from the source (no calibration), in any dtype trtbuild converts."""
    from trtbuild.builder.graph import build_graph

    plan = plan_of(ws, "variants: {w8: {quant: int8_wo}}\nparallelism: [{tp: 1}, {tp: 2}]", gpus="[A100, H100]")
    assert statuses(plan) == {name: ("ok", None) for name in (
        "w8-tp1", "w8-tp1-sm80", "w8-tp1-sm90", "w8-tp2", "w8-tp2-sm80", "w8-tp2-sm90")}
    graph = build_graph(plan)
    assert graph.node("w8-tp1").stage.entry == "trtbuild.builder.stages.checkpoint:convert_checkpoint"
    assert graph.node("w8-tp1").params["quant"].value == "int8_wo"
    assert "quantized" not in graph.node("w8-tp1").inputs
    assert not [n for n in graph.nodes if n.kind in ("quantize", "calibration")]
    assert statuses(plan_of(ws, "dtype: float32\nvariants: {w8: {quant: int8_wo}}"))["w8-tp1"] == ("ok", None)


def test_int8_wo_rules_of_tensorrt_llms_load_time_quantization(ws):
    # tp 8: q 256/8 = 32 rows plus k and v of one duplicated 32-wide KV head each: 96 outputs per GPU,
    # and the weight-only layout needs multiples of 64
    s = statuses(plan_of(ws, "variants: {w8: {quant: int8_wo}}\nparallelism: [{tp: 8}]"))
    assert s["w8-tp8"] == ("impossible", "W8A16: attention.qkv has 96 out features per GPU; TensorRT-LLM 1.2 "
                           "quantizes weight-only layers at load into a layout that needs multiples of 64 "
                           "(cutlass_preprocessors.cpp)")
    s = statuses(plan_of(ws, "variants: {w8: {quant: int8_wo, kv_cache: int8}}"))
    assert s["w8-tp1"] == ("impossible", "INT8 weight-only engines are built from a float checkpoint that TensorRT-LLM "
                           "quantizes at load (quant_algo W8A16); trtbuild has no stage yet that adds ModelOpt's "
                           "calibrated KV-cache scales to it: build INT8 weight-only without kv_cache, or use another "
                           "format with an INT8 KV cache")


@pytest.mark.parametrize("variant, what, hf_served", [
    ("{quant: fp8}", "FP8", True), ("{quant: int8_sq}", "INT8 SmoothQuant", False),
    ("{kv_cache: fp8}", "an FP8 KV cache", False),  # docs/runtimes.md: no runtime claims these Hugging Face checkpoints
])
def test_float32_with_a_quantized_trtllm_checkpoint_is_impossible(ws, variant, what, hf_served):
    """ModelOpt 0.47's TensorRT-LLM export writes unquantized tensors in float16 when asked for
    float32 (torch_to_tensorrt_llm_checkpoint); the checkpoint would then fail its verification."""
    plan = plan_of(ws, f"dtype: float32\nvariants: {{base: {{}}, q: {variant}}}\nbackends: [engine, hf-checkpoint]")
    s = statuses(plan)
    assert s["q-tp1"] == ("impossible", "ModelOpt's TensorRT-LLM export writes unquantized tensors in float16 or "
                          f"bfloat16 only; dtype float32 is not supported with {what}: use bfloat16 or float16")
    assert s["q-tp1-sm90"][0] == "impossible"
    # trtbuild's own converter writes float32, and the Hugging Face export keeps the model's dtype
    assert s["base-tp1"] == ("ok", None)
    if hf_served:
        assert s["q-hf"] == ("ok", None)
    else:  # impossible for the serving table, never for its dtype
        assert s["q-hf"][0] == "impossible" and s["q-hf"][1].startswith("no runtime serves ")
    assert statuses(plan_of(ws, f"dtype: bfloat16\nvariants: {{q: {variant}}}"))["q-tp1"] == ("ok", None)


def test_nvfp4_blocks_must_divide_dimensions(ws):
    config = {**TINY_LLAMA, "intermediate_size": 520}
    plan = plan_of(ws, "variants: {fp4: {quant: nvfp4}}", gpus="[sm100]", config=config)
    assert statuses(plan)["fp4-tp1"] == ("impossible", "NVFP4 blocks of 16 do not divide intermediate_size = 520")


def test_architecture_must_be_one_the_checkpoint_stage_writes(ws):
    config = {**TINY_LLAMA, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}
    plan = plan_of(ws, "backends: [engine, hf-checkpoint]", config=config)
    s = statuses(plan)
    reason = ("not supported: GPT2LMHeadModel (TensorRT-LLM checkpoints are written for LlamaForCausalLM, "
              "MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM; the hf-checkpoint backend takes others)")
    assert s["base-tp1"] == ("impossible", reason)
    assert s["base-tp1-sm90"] == ("impossible", f"needs checkpoint base-tp1, which is impossible: {reason}")
    assert s["base-hf"][0] == "ok"


def test_engine_model_map_rule():
    from trtbuild.facts import trtllm

    # every family the checkpoint stage writes is one TensorRT-LLM 1.2 builds engines for
    from trtbuild.plan.expand import CHECKPOINT_ARCHITECTURES

    assert set(CHECKPOINT_ARCHITECTURES) <= trtllm.ENGINE_ARCHITECTURES
    assert "MysteryForCausalLM" not in trtllm.ENGINE_ARCHITECTURES


def test_limits_rules(ws):
    plan = plan_of(ws, "limits: {max_input_len: 4000, max_seq_len: 2048}\nbackends: [engine, hf-checkpoint]")
    reason = "limits.max_input_len 4000 exceeds max_seq_len 2048"
    assert statuses(plan)["base-tp1-sm90"] == ("impossible", reason)
    assert statuses(plan)["base-hf"] == ("impossible", reason)

    plan = plan_of(ws, "limits: {max_seq_len: 8192}")
    assert statuses(plan)["base-tp1-sm90"][1].startswith("limits.max_seq_len 8192 exceeds the model's 4096 positions")


def test_max_seq_len_defaults_from_positions_with_rope_scaling(ws):
    assert plan_of(ws).max_seq_len == 4096
    linear = {**TINY_LLAMA, "rope_scaling": {"type": "linear", "factor": 4.0}}
    plan = plan_of(ws, "limits: {max_seq_len: 16384}", config=linear)
    assert plan.max_seq_len == 16384 and all(t.ok for t in plan.targets)
    # llama3 scaling: max_position_embeddings already counts the extension (builder._init_max_seq_len)
    llama3 = {**TINY_LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    assert plan_of(ws, config=llama3).max_seq_len == 4096
    # transformers 5.x writes rope_parameters instead of rope_scaling
    v5 = {**TINY_LLAMA, "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e6}}
    assert plan_of(ws, config=v5).max_seq_len == 8192


def test_weights_that_do_not_fit_are_impossible_with_numbers(ws):
    plan = plan_of(ws, "parallelism: [{tp: 1}, {tp: 2}]\nlimits: {max_seq_len: 8192}", gpus="[L4, H200]", config=LLAMA_70B)
    s = statuses(plan)
    assert s["base-tp1-sm89"][0] == "impossible"
    reason = s["base-tp1-sm89"][1]
    assert reason.startswith("does not fit on L4 (22.5 GiB): weights 131.4 GiB/GPU + activations ")
    assert reason.endswith("> 90% of memory (20.2 GiB)")
    # 131.4 GiB of bf16 weights do not fit in 90% of one 140 GiB H200 either, but half of them do
    assert s["base-tp1-sm90"][1].startswith("does not fit on H200 (140.4 GiB): weights 131.4 GiB/GPU")
    est = plan.target("base-tp2-sm90").estimate
    assert s["base-tp2-sm90"][0] == "ok" and est.fits is True and est.kv_tokens > 8192
    assert est.weights_bytes_per_gpu < plan.target("base-tp1-sm90").estimate.weights_bytes_per_gpu / 2 + 2 * 2**30
    assert plan.target("base-tp1-sm89").estimate.fits is False
    assert plan.target("base-tp1-sm89").estimate.kv_tokens == 0


def test_small_kv_room_is_a_warning_not_an_error(ws):
    # 70B in INT4 AWQ on one L40S: weights fit, but the KV cache cannot hold one 131072-token sequence.
    plan = plan_of(ws, "variants: {awq: {quant: int4_awq}}\nlimits: {max_batch_size: 8, max_num_tokens: 2048}",
                   gpus="[L40S]", config=LLAMA_70B)
    engine = plan.target("awq-tp1-sm89")
    assert engine.ok and engine.estimate.fits, engine.reason
    [warning] = engine.warnings
    assert f"KV cache holds {engine.estimate.kv_tokens:,} tokens per GPU on L40S" in warning
    assert "less than one max_seq_len (131,072) sequence" in warning


def test_sm100_rejects_some_plugins(ws):
    plan = plan_of(ws, "engine: {flags: {gemm_swiglu_plugin: fp8}}\nvariants: {fp8: {quant: fp8}}", gpus="[sm90, sm100]")
    s = statuses(plan)
    assert s["fp8-tp1-sm90"][0] == "ok"
    assert s["fp8-tp1-sm100"] == ("impossible", "engine.flags.gemm_swiglu_plugin=fp8 is not supported on SM 100 (PluginConfig.validate)")


def test_exclude_drops_matching_targets_and_orphaned_checkpoints(ws):
    plan = plan_of(ws, """
        variants: {bf16: {}, fp8: {quant: fp8}}
        parallelism: [{tp: 1}, {tp: 2}]
        backends: [engine, hf-checkpoint]
        exclude:
          - {variant: fp8, gpu: A100}
          - {tp: 2, gpu: sm89}
          - {variant: bf16, backend: hf-checkpoint}
        """, gpus="[sm80, L40S]")
    names = [t.name for t in plan.targets]
    assert "fp8-tp1-sm80" not in names and "fp8-tp2-sm80" not in names
    assert "bf16-tp2-sm89" not in names and "fp8-tp2-sm89" not in names
    assert "bf16-hf" not in names and "fp8-hf" in names
    assert "fp8-tp2" not in names  # every engine that needed it is gone
    assert "fp8-tp1" in names and "fp8-tp1-sm89" in names


def test_gpu_filter_keeps_one_sm(ws):
    plan = plan_of(ws, "backends: [engine, hf-checkpoint]", gpus="[sm89, sm90]", gpu_filter={"sm90"})
    assert [t.name for t in plan.targets] == ["base-tp1", "base-tp1-sm90", "base-hf"]
    with pytest.raises(InvalidInput, match=r"--gpu sm80: .*recipe.yaml targets sm89, sm90"):
        plan_of(ws, gpus="[sm89, sm90]", gpu_filter={"sm80"})


@pytest.mark.parametrize("choice, product, memory_mib", [("L4", "L4", 23034), ("RTX4090", "RTX4090", 24564)])
def test_a_product_on_the_command_line_is_the_card_its_sm_is_estimated_on(ws, choice, product, memory_mib):
    # The recipe names the L40S for sm89; `--gpu L4` asks about the L4, not the L40S's 45 GiB.
    plan = plan_of(ws, gpus="[L40S, sm90]", gpu_filter={choice})
    [engine] = [t for t in plan.targets if t.kind == "engine"]
    assert engine.gpu == "sm89"
    assert (engine.estimate.gpu_product, engine.estimate.gpu_memory_bytes, engine.estimate.gpu_chosen_by) == (
        product, memory_mib * 1024**2, "option")


def test_an_sm_on_the_command_line_keeps_the_recipes_cards(ws):
    plan = plan_of(ws, gpus="[L40S, L4, sm90]", gpu_filter={"sm89"})
    [engine] = [t for t in plan.targets if t.kind == "engine"]
    assert (engine.estimate.gpu_product, engine.estimate.gpu_chosen_by) == ("L4", "recipe")
    plan = plan_of(ws, gpus="[sm89]", gpu_filter={"sm89"})
    [engine] = [t for t in plan.targets if t.kind == "engine"]
    assert (engine.estimate.gpu_product, engine.estimate.gpu_chosen_by) == ("L40S", "default")


def test_a_product_whose_sm_the_recipe_does_not_target_is_refused(ws):
    with pytest.raises(InvalidInput, match=r"^--gpu L4 \(sm89\): .*recipe.yaml targets sm90$"):
        plan_of(ws, gpu_filter={"L4"})


def test_the_fit_on_the_card_given_decides_the_status(ws):
    # Llama-3.1-70B in INT4 AWQ over tp2 (19.9 GiB per GPU) fits the L40S's 45 GiB but not the L4's 22.5 GiB.
    extra = "variants: {int4: {quant: int4_awq}}\nparallelism: [{tp: 2}]"
    assert plan_of(ws, extra, gpus="[L40S]", config=LLAMA_70B).target("int4-tp2-sm89").ok
    on_l4 = plan_of(ws, extra, gpus="[L40S]", config=LLAMA_70B, gpu_filter={"L4"}).target("int4-tp2-sm89")
    assert on_l4.status == "impossible" and on_l4.reason.startswith("does not fit on L4 (22.5 GiB): ")


def test_select_by_glob_keeps_dependencies(ws):
    plan = plan_of(ws, "variants: {bf16: {}, fp8: {quant: fp8}}", gpus="[sm89, sm90]")
    assert [t.name for t in select(plan, ["fp8-*-sm90"]).targets] == ["fp8-tp1", "fp8-tp1-sm90"]
    with pytest.raises(InvalidInput, match="--target nope: matches none of"):
        select(plan, ["nope"])


def test_model_config_is_required_and_checked(ws):
    recipe = ws.recipe("""
        schema: 1
        name: x
        source: {hf: org/not-cached-anywhere}
        gpus: [sm90]
        """)
    with pytest.raises(InvalidInput) as info:
        plan_recipe(load_recipe(recipe))
    assert str(info.value) == (f"{recipe}:3:9: source: no local config.json for hf:org/not-cached-anywhere@main; "
                               "set source.config to a copy of the model's config.json")
    bad = ws.recipe(minimal(), name="bad.yaml", config={"architectures": ["LlamaForCausalLM"], "hidden_size": 64})
    with pytest.raises(InvalidInput, match=r"config.json: missing 'num_attention_heads'"):
        plan_recipe(load_recipe(bad))


def test_plan_reads_a_source_folder_that_holds_only_config_json(ws):
    (ws.root / "model").mkdir()
    ws.config(name="model/config.json")
    recipe = ws.recipe("""
        schema: 1
        name: x
        source: {path: model}
        gpus: [sm90]
        """)
    plan = plan_recipe(load_recipe(recipe))
    assert plan.model.source == str(ws.root / "model" / "config.json") and plan.targets[1].ok
    assert plan.config_origin == str(ws.root / "model" / "config.json")


def test_the_plan_says_where_its_config_came_from(ws, run):
    recipe = ws.recipe(minimal())  # source.config: the offline override
    plan = plan_recipe(load_recipe(recipe))
    assert plan.config_origin == f"source.config {ws.root / 'config.json'}"
    assert plan.as_json()["model"]["config_origin"] == plan.config_origin
    header = run("plan", recipe).stdout.splitlines()[0]
    n = len(plan.targets)
    assert header == (f"tiny ({recipe}): LlamaForCausalLM {plan.dtype}, max_seq_len {plan.max_seq_len:,} "
                      f"(config: {plan.config_origin}); {n} targets, {n} ok, 0 impossible")


def test_an_int8_kv_cache_has_no_hf_checkpoint(ws):
    plan = plan_of(ws, "variants: {sq: {quant: int8_sq, kv_cache: int8}}\nbackends: [engine, hf-checkpoint]")
    assert statuses(plan)["sq-hf"][1].startswith("an INT8 KV cache has no Hugging Face checkpoint form")
    assert statuses(plan)["sq-tp1-sm90"][0] == "ok"


# ---- engine flags trtllm-build itself refuses (engine_flags.trtllm_build_refusal) ---------------------
# Each expected reason is written out here from the rule; tests/test_standins.py checks that the
# stand-in trtllm-build, transcribed separately from the same sources, refuses exactly these.

BUILD_PY = "tensorrt_llm/commands/build.py@65f1d15"
BUILDER_PY = "tensorrt_llm/builder.py (1.x, commit not given by the source index)"
TINY_MIXTRAL = {**TINY_LLAMA, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "num_local_experts": 4, "num_experts_per_tok": 2}


def engine_reasons(plan) -> set:
    return {t.reason for t in plan.targets if t.kind == "engine"}


def test_multiple_profiles_with_opt_num_tokens(ws):
    plan = plan_of(ws, "engine: {flags: {multiple_profiles: enable, opt_num_tokens: 64}}", gpus="[sm89, sm90]")
    assert engine_reasons(plan) == {
        "engine.flags.opt_num_tokens=64 with engine.flags.multiple_profiles=enable: trtllm-build refuses the two "
        f"together ({BUILD_PY} main())"}
    assert plan.target("base-tp1").ok  # the checkpoint is fine
    for alone in ("multiple_profiles: enable", "opt_num_tokens: 64"):
        assert plan_of(ws, f"engine: {{flags: {{{alone}}}}}").target("base-tp1-sm90").ok


def test_a_draft_length_with_context_logits(ws):
    """The twin (and a published engine validated itself) gathers context logits, which trtllm-build
    refuses with max_draft_len > 0; without engine validation only the recipe's own gather flags do."""
    for engines in ("twin", "published"):
        plan = plan_of(ws, f"engine: {{flags: {{max_draft_len: 4}}}}\nvalidate: {{engines: {engines}}}")
        assert statuses(plan)["base-tp1-sm90"] == ("impossible", (
            f"engine.flags.max_draft_len=4: validate.engines: {engines} builds the engine with --gather_context_logits, "
            f"which trtllm-build refuses with a draft length above 0 ({BUILD_PY} main()); set validate.engines: none"))
    assert plan_of(ws, "engine: {flags: {max_draft_len: 4}}\nvalidate: {engines: none}").target("base-tp1-sm90").ok
    assert plan_of(ws, "engine: {flags: {max_draft_len: 0}}").target("base-tp1-sm90").ok
    for flag in ("gather_context_logits", "gather_all_token_logits"):
        plan = plan_of(ws, f"engine: {{flags: {{max_draft_len: 2, {flag}: true}}}}\nvalidate: {{engines: none}}")
        assert statuses(plan)["base-tp1-sm90"] == ("impossible", (
            f"engine.flags.max_draft_len=2 with engine.flags.{flag}: trtllm-build refuses context logits with a "
            f"draft length above 0 ({BUILD_PY} main())"))
        assert plan_of(ws, f"engine: {{flags: {{{flag}: true}}}}").target("base-tp1-sm90").ok


def test_pp_reduce_scatter_is_for_mixtral_only(ws):
    extra = "engine: {flags: {pp_reduce_scatter: enable}}\nparallelism: [{tp: 1, pp: 2}]"
    assert engine_reasons(plan_of(ws, extra, gpus="[sm80, sm90]")) == {
        f"engine.flags.pp_reduce_scatter=enable is supported for MixtralForCausalLM only; the model is "
        f"LlamaForCausalLM ({BUILD_PY} build_model())"}
    mixtral = plan_of(ws, extra, gpus="[sm80, sm90]", config=TINY_MIXTRAL)
    assert all(t.ok for t in mixtral.targets), statuses(mixtral)


@pytest.mark.parametrize("plugin", ["gemm_swiglu_plugin", "low_latency_gemm_swiglu_plugin"])
def test_the_swiglu_plugins_need_the_fused_mlp(ws, plugin):
    extra = "variants: {fp8: {quant: fp8}}"
    assert plan_of(ws, f"{extra}\nengine: {{flags: {{{plugin}: fp8}}}}").target("fp8-tp1-sm90").ok
    plan = plan_of(ws, f"{extra}\nengine: {{flags: {{{plugin}: fp8, use_fused_mlp: disable}}}}")
    assert statuses(plan)["fp8-tp1-sm90"] == ("impossible", (
        f"engine.flags.{plugin}=fp8 requires use_fused_mlp, which engine.flags.use_fused_mlp disables "
        f"({BUILDER_PY} optimize_model_with_config())"))


@pytest.mark.parametrize("flags", ["{speculative_decoding_mode: eagle}",
                                   "{speculative_decoding_mode: eagle, max_draft_len: 300}"])
def test_eagle_needs_an_eagle_checkpoint(ws, flags):
    plan = plan_of(ws, f"engine: {{flags: {flags}}}\nvalidate: {{engines: none}}")
    assert statuses(plan)["base-tp1-sm90"] == ("impossible", (
        "engine.flags.speculative_decoding_mode=eagle needs an EAGLE checkpoint (num_eagle_layers in its config), "
        f"which trtbuild does not write ({BUILDER_PY} build())"))
    assert plan_of(ws, "engine: {flags: {speculative_decoding_mode: draft_tokens_external, max_draft_len: 4}}\n"
                   "validate: {engines: none}").target("base-tp1-sm90").ok


@pytest.mark.parametrize("plugin", ["gemm_swiglu_plugin", "low_latency_gemm_plugin", "low_latency_gemm_swiglu_plugin",
                                    "fp8_rowwise_gemm_plugin"])
def test_sm100_refuses_plugin_validates_list(ws, plugin):
    value = "float16" if plugin == "fp8_rowwise_gemm_plugin" else "fp8"
    plan = plan_of(ws, f"variants: {{fp8: {{quant: fp8}}}}\nengine: {{flags: {{{plugin}: {value}}}}}",
                   gpus="[sm100]")
    assert statuses(plan)["fp8-tp1-sm100"] == (
        "impossible", f"engine.flags.{plugin}={value} is not supported on SM 100 (PluginConfig.validate)")


def test_plan_shows_a_refused_flag_in_one_line_and_exits_0(ws, run):
    path = ws.recipe(minimal("engine: {flags: {multiple_profiles: enable, opt_num_tokens: 64}}"))
    result = run("plan", path, "--format", "json")
    assert result.exit_code == 0 and result.stderr == ""
    [engine] = [t for t in json.loads(result.stdout)["targets"] if t["kind"] == "engine"]
    assert engine["status"] == "impossible" and "\n" not in engine["reason"]
    assert engine["reason"].startswith("engine.flags.opt_num_tokens=64 with engine.flags.multiple_profiles=enable")
    table = run("plan", path)
    assert table.exit_code == 0
    assert f"- base-tp1-sm90: {engine['reason']}" in table.stdout.splitlines()
