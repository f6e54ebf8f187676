"""Recipe loading: defaults, and one clear `file:line:col: path: message` for every kind of bad input."""

from __future__ import annotations

import pytest

from conftest import minimal
from trtbuild.errors import InvalidInput
from trtbuild.recipe.schema import json_schema, load_recipe


def errors_of(path) -> list[str]:
    with pytest.raises(InvalidInput) as info:
        load_recipe(path)
    return info.value.messages


def test_minimal_recipe_gets_documented_defaults(ws):
    loaded = load_recipe(ws.recipe(minimal()))
    r = loaded.recipe
    assert r.schema_version == 1 and r.name == "tiny"
    assert list(r.variants) == ["base"] and r.variants["base"].quant is None
    assert [(p.tp, p.pp) for p in r.parallelism] == [(1, 1)]
    assert r.backends == ["engine"]
    assert r.toolchain.tensorrt_llm == "1.2.1"
    # trtllm-build's own defaults (reference/trtllm.md section 1)
    assert (r.limits.max_batch_size, r.limits.max_input_len, r.limits.max_num_tokens, r.limits.max_beam_width) == (2048, 1024, 8192, 1)
    assert r.limits.max_seq_len is None
    assert (r.calibration.text, r.calibration.samples, r.calibration.seq_len, r.calibration.seed, r.calibration.device) == ("builtin", 512, 512, 0, "auto")
    assert r.source.kind == "path" and r.source.trust_remote_code is False
    assert loaded.resolve_path("model") == ws.root / "model"


def test_empty_and_null_variant_mean_unquantized(ws):
    r = load_recipe(ws.recipe(minimal("""
        variants:
          plain:
          also: {}
          awq: {quant: int4_awq}
        """))).recipe
    assert r.variants["plain"].quant is None and r.variants["also"].quant is None
    assert r.variants["awq"].effective_group_size == 128
    assert r.variants["plain"].effective_group_size is None


def test_variant_calibration_overrides_only_given_fields(ws):
    r = load_recipe(ws.recipe(minimal("""
        calibration: {samples: 64, seq_len: 256, seed: 3}
        variants:
          fp8: {quant: fp8, calibration: {samples: 8}}
          sq: {quant: int8_sq}
        """))).recipe
    assert r.calibration_for("fp8").model_dump() == {"text": "builtin", "samples": 8, "seq_len": 256, "seed": 3, "device": "auto"}
    assert r.calibration_for("sq").samples == 64


def test_invalid_choice_names_file_line_column_and_yaml_path(ws):
    path = ws.recipe(minimal("""
        variants:
          fp8:
            quant: fp9
        """))
    [message] = errors_of(path)
    assert message == (f"{path}:9:12: variants.fp8.quant: 'fp9' is not one of "
                       "fp8, int8_sq, int4_awq, w4a8_awq, int8_wo, int4_wo, nvfp4")


def test_unknown_keys_are_errors_with_a_suggestion(ws):
    path = ws.recipe(minimal("""
        limits: {max_batch_size: 8, max_seq_length: 4096}
        revison: main
        """))
    messages = errors_of(path)
    assert messages[0].startswith(f"{path}:7:29: limits.max_seq_length: unknown key 'max_seq_length' (did you mean 'max_seq_len'?")
    assert messages[1].startswith(f"{path}:8:1: revison: unknown key 'revison' (")
    assert "allowed: schema, name, source" in messages[1]


def test_types_are_strict(ws):
    path = ws.recipe(minimal("""
        parallelism:
          - {tp: "2"}
        limits: {max_batch_size: 0}
        dtype: fp16
        """))
    messages = errors_of(path)
    assert any(m.startswith(f"{path}:8:10: parallelism[0].tp: input should be a valid integer") for m in messages), messages
    assert any(f"{path}:9:26: limits.max_batch_size: input should be greater than 0" in m for m in messages), messages
    assert any(f"{path}:10:8: dtype: 'fp16' is not one of float16, bfloat16, float32" in m for m in messages), messages


def test_missing_required_keys(ws):
    path = ws.recipe("""
        schema: 1
        source: {path: x}
        """)
    [message] = errors_of(path)
    assert message == f"{path}:1:1: name: required key is missing"


def test_schema_version_and_name_pattern(ws):
    path = ws.recipe("""
        schema: 2
        name: Bad Name
        source: {path: x}
        """)
    messages = errors_of(path)
    assert messages[0] == f"{path}:1:9: schema: 2 is not one of 1"
    assert messages[1].startswith(f"{path}:2:7: name: 'Bad Name' does not match")


@pytest.mark.parametrize("source, message", [
    ("{hf: a/b, path: x}", "source: exactly one of hf, nemo, path, gguf, s3 is required (found: hf, path)"),
    ("{trust_remote_code: true}", "source: exactly one of hf, nemo, path, gguf, s3 is required (found: none)"),
    ("{path: x, revision: v1}", "source: revision applies only to an hf source"),
    ("{hf: not-a-repo}", "source.hf: 'not-a-repo' does not match"),
    ("{s3: 'http://bucket/x'}", "source.s3: 'http://bucket/x' does not match"),
])
def test_source_rules(ws, source, message):
    path = ws.recipe(f"""
        schema: 1
        name: t
        source: {source}
        gpus: [sm90]
        """)
    [got] = errors_of(path)
    assert got.startswith(f"{path}:3:") and message in got


def test_group_size_only_for_grouped_formats(ws):
    path = ws.recipe(minimal("variants: {fp8: {quant: fp8, group_size: 64}}"))
    [message] = errors_of(path)
    assert message == f"{path}:7:17: variants.fp8: group_size applies only to int4_awq, w4a8_awq and int4_wo"


def test_int4_weight_only_is_grouped_like_awq(ws):
    """int4_wo quantizes per group of 128 input channels (INT4_BLOCKWISE_WEIGHT_ONLY_CFG), like AWQ."""
    recipe = load_recipe(ws.recipe(minimal(
        "variants: {wo: {quant: int4_wo}, wo64: {quant: int4_wo, group_size: 64}, w8: {quant: int8_wo}}"))).recipe
    assert recipe.variants["wo"].effective_group_size == 128
    assert recipe.variants["wo64"].effective_group_size == 64
    assert recipe.variants["w8"].effective_group_size is None


@pytest.mark.parametrize("flags, message", [
    ("{gemm_plugn: auto}", "engine.flags.gemm_plugn: unknown trtllm-build flag 'gemm_plugn' for tensorrt_llm 1.2.x (did you mean 'gemm_plugin'?)"),
    ("{gemm_plugin: fp9}", "engine.flags.gemm_plugin: 'fp9' is not one of auto, float16, float32, bfloat16, int32, fp8, nvfp4, disable"),
    ("{max_batch_size: 8}", "engine.flags.max_batch_size: 'max_batch_size' cannot be set in a recipe: set it in limits.max_batch_size"),
    ("{model_cls_file: evil.py}", "engine.flags.model_cls_file: 'model_cls_file' cannot be set in a recipe: it loads Python code from a path; recipes never run code"),
    ("{tokens_per_block: big}", "engine.flags.tokens_per_block: 'big' is not an integer"),
    ("{strip_plan: enable}", "engine.flags.strip_plan: 'enable' is not true or false (strip_plan is a switch)"),
    ("{streamingllm: enable}", "engine.flags.streamingllm: 'streamingllm' cannot be set in a recipe: TensorRT-LLM 1.x rejects StreamingLLM"),
    ("{auto_parallel: 2}", "engine.flags.auto_parallel: unknown trtllm-build flag 'auto_parallel' for tensorrt_llm 1.2.x"),
])
def test_engine_flags_are_checked_against_the_pinned_flag_list(ws, flags, message):
    path = ws.recipe(minimal(f"engine: {{flags: {flags}}}"))
    [got] = errors_of(path)
    assert got.startswith(f"{path}:7:") and got.endswith(message), got


def test_valid_engine_flags_pass_with_or_without_dashes(ws):
    r = load_recipe(ws.recipe(minimal("""
        engine:
          flags: {--gemm_plugin: auto, use_fused_mlp: enable, tokens_per_block: 64, strip_plan: true, kv_cache_type: paged}
        """))).recipe
    assert r.engine.flags["tokens_per_block"] == 64


def test_engine_backend_needs_a_1_2_toolchain(ws):
    path = ws.recipe(minimal("toolchain: {tensorrt_llm: 1.3.0}"))
    [message] = errors_of(path)
    assert message.startswith(f"{path}:7:27: ")
    assert "toolchain.tensorrt_llm: tensorrt_llm 1.3.0 has no TensorRT engine backend (removed after the 1.2 line)" in message
    # the hf-checkpoint backend alone does not need engines
    load_recipe(ws.recipe(minimal("toolchain: {tensorrt_llm: 1.3.0}\nbackends: [hf-checkpoint]"), name="hf.yaml"))


def test_engine_backend_needs_gpus(ws):
    path = ws.recipe(minimal(gpus="[]"))
    [message] = errors_of(path)
    assert message.startswith(f"{path}:6:7: gpus: the engine backend needs at least one GPU")


def test_unknown_gpu_is_named_with_its_index(ws):
    path = ws.recipe(minimal(gpus="[H100, H300]"))
    [message] = errors_of(path)
    assert message.startswith(f"{path}:6:14: gpus[1]: 'H300' is not a known GPU; use an SM (sm80, sm86, sm89, sm90, sm100, sm120)")


def test_duplicate_parallelism_and_bad_exclude(ws):
    path = ws.recipe(minimal("""
        parallelism: [{tp: 1}, {tp: 1, pp: 1}]
        exclude:
          - {variant: fp16}
        """))
    messages = errors_of(path)
    assert messages == [
        f"{path}:7:24: parallelism[1]: tp=1 pp=1 is listed twice (also at index 0)",
        f"{path}:9:15: exclude[0].variant: 'fp16' is not a variant of this recipe (base)",
    ]


def test_empty_exclude_entry(ws):
    path = ws.recipe(minimal("exclude: [{}]"))
    [message] = errors_of(path)
    assert message.endswith("exclude[0]: an exclude entry needs at least one of variant, tp, pp, gpu, backend")


def test_yaml_syntax_error_has_position(ws):
    path = ws.recipe("schema: 1\nname: [unclosed\nsource: {path: x}\n")
    [message] = errors_of(path)
    assert message.startswith(f"{path}:3:7: YAML syntax error:")


def test_duplicate_keys_are_rejected(ws):
    path = ws.recipe(minimal("variants: {a: {}}\nvariants: {b: {}}"))
    [message] = errors_of(path)
    assert message == f"{path}:8:1: variants: duplicate key 'variants' (first at line 7)"


@pytest.mark.parametrize("text, message", [
    ("", "a recipe is a YAML mapping"),
    ("- a\n- b\n", "a recipe is a YAML mapping"),
    ("a: 1\n---\nb: 2\n", "YAML syntax error: expected a single document in the stream, but found another document"),
])
def test_documents_that_are_not_one_mapping(ws, text, message):
    path = ws.root / "r.yaml"
    path.write_text(text)
    [got] = errors_of(path)
    assert got.startswith(str(path)) and message in got


def test_unreadable_files(ws):
    assert errors_of(ws.root / "missing.yaml") == [f"{ws.root / 'missing.yaml'}: no such file"]
    binary = ws.root / "bin.yaml"
    binary.write_bytes(b"name: \xff\xfe")
    [message] = errors_of(binary)
    assert message.startswith(f"{binary}: not UTF-8 text")


def test_yaml_11_scalars_follow_safe_load(ws):
    # safe_load semantics: `on` is a boolean, so it is not a valid flag value string.
    path = ws.recipe(minimal("engine: {flags: {context_fmha: on}}"))
    [message] = errors_of(path)
    assert message.endswith("engine.flags.context_fmha: True is not one of enable, disable")


def test_unquoted_version_number_gets_a_hint(ws):
    path = ws.recipe(minimal("toolchain: {tensorrt_llm: 1.2}"))
    [message] = errors_of(path)
    assert message == f"{path}:7:27: toolchain.tensorrt_llm: expected a string, got the number 1.2 (quote it: '1.2')"


def test_wrong_container_types(ws):
    path = ws.recipe(minimal("variants: [fp8]\nlimits: 5"))
    messages = errors_of(path)
    assert messages == [f"{path}:7:11: variants: expected a mapping, got a list",
                        f"{path}:8:9: limits: expected a mapping, got 5"]


def test_every_field_of_the_published_schema_has_a_description():
    # `trtbuild schema` documents the recipe for editors: every key shows what it is when hovered.
    schema = json_schema()
    undocumented = []
    for model, definition in {"Recipe": schema, **schema.get("$defs", {})}.items():
        for name, prop in definition.get("properties", {}).items():
            if not str(prop.get("description", "")).strip():
                undocumented.append(f"{model}.{name}")
    assert undocumented == []
    assert len(schema["$defs"]) >= 10  # the walk saw every model (Source, Variant, Limits, Gates, ...)
