"""The typed stage summaries (store/summaries.py): one model per stage kind over the JSON the stages
have always written, so a stored record reads and writes back byte for byte; a summary of a kind no
model describes, or with a field missing or unknown, is refused in one line naming the record;
timestamps are UTC datetimes written as before; an engine's platform is one model everywhere."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from summarykit import validation_summary
from conftest import key_fields
from trtbuild.keys import canonical_json
from trtbuild.store.platform import EnginePlatform
from trtbuild.store.base import CorruptStore, parse_record
from trtbuild.store.records import ActionRecord, Ref, dump
from trtbuild.store.summaries import (SUMMARY_MODELS, CheckpointSummary, EngineSummary, HfCheckpointSummary,
                                      ValidationSummary, dump_summary, parse_summary)

KEY = "a" * 64
ENGINE = {"schema": 1, "kind": "engine", "sm": "sm90", "tp": 2, "pp": 1, "world_size": 2,
          "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None}, "checkpoint": "c" * 64,
          "toolchain": {"tensorrt_llm": "1.2.0", "tensorrt": "10.13.2", "image": None}, "standin": False,
          "command": ["trtllm-build", "--checkpoint_dir", "checkpoint"], "memory": {"engine_bytes_per_rank": 123}}
# One summary of every kind, as its stage writes it (the tools' own fields included).
WRITTEN = {
    "source:gguf": {"architecture": "LlamaForCausalLM", "parameters": 1000, "dtype": "float16"},
    "source:nemo": {"architecture": "LlamaForCausalLM", "parameters": 10, "dtype": ["bfloat16", "float32"],
                    "form": "nemo2", "tensors": 3, "weights_details": {"shards": 1}},
    "calibration": {"samples": 2, "seq_len": 8, "tokens": 40, "seed": 0, "overlapping": False, "starts": [0, 16],
                    "text_sha256": "d" * 64},
    "quantize": {"device": "cpu", "quant": "fp8", "amax": {"layers": 2}},
    "checkpoint:convert": {"tp": 1, "pp": 1, "dtype": "float16", "architecture": "LlamaForCausalLM", "quant_algo": None,
                           "ranks": [{"tensors": 3, "bytes": 10}], "tensors_per_rank": [3], "bytes": 10,
                           "config_fixes": []},
    "hf-export:export": {"tensors": 3, "bytes": 10, "dtype": "float16", "shards": 1},
    "hf-checkpoint:package": {"tensors": 3, "shards": 1,
                              "serving": {"files": ["serving/vllm_args.json"], "runtimes": {"vllm": "0.26.0"},
                                          "check": {"vllm": True}, "serves": {"vllm": ["sm90"]}}},
    "gguf-convert": {"gguf": {"file": "model.gguf", "bytes": 100, "architecture": "llama", "file_type": 32,
                              "tensors": {"bf16": 2, "f32": 1}, "tokenizer": "gpt2", "vocab_size": 8},
                     "outtype": "bf16", "converter": "llama-cpp-python 0.3.36 sdist"},
    "gguf": {"gguf_type": "Q4_K_M", "fallback_tensors": 1,
             "gguf": {"file": "model.gguf", "bytes": 60, "architecture": "llama", "file_type": 15,
                      "tensors": {"q4_k": 1, "q5_0": 1, "f32": 1}, "tokenizer": "gpt2", "vocab_size": 8},
             "serving": {"files": ["serving/llamacpp_server.json"], "llama_cpp_python": "0.3.36",
                         "command": ["python3", "-m", "llama_cpp.server", "--model", "model.gguf"]}},
    "engine": ENGINE,
    "reference": {"text_sha256": "e" * 64, "windows": 2, "seq_len": 8, "top_k": 4, "ppl": 12.5, "text_tokens": 40,
                  "overlapping": False, "device": "cpu"},
    # a recipe's gate limit written as an integer stays one
    "validate": validation_summary(0.01, gates={"ppl_delta_pct": {"value": 0.5, "limit": 2, "passed": True}}),
    "validate:vllm": validation_summary(0.02, runner="vllm 0.26.0", device="cuda:0", load_options={"dtype": "auto"},
                                        load_options_from="serving/vllm_args.json", scoring_options={"max_logprobs": 4},
                                        logits_path="prompt_logprobs", reference_topk_lumped=0.0),
    "source:path": {},  # an adopted folder: no report
}


def record_json(stage: str, summary, created: str = "2026-12-01T19:22:01Z") -> dict:
    return {"schema": 1, "key": KEY, "artifact": {"hash": "b" * 64, "size_bytes": 10}, "stage": stage,
            "stage_version": 1, "target": "t", "recipe": "r", "created": created, "toolchain": {"torch": "2.13.0"},
            "summary": summary, "fields": key_fields(stage=stage), "execution": {"seconds": 1.5, "peak_rss_mib": None,
                                                                           "host": "h", "figures": {}, "logs": {}}}


def stored(stage: str, summary) -> bytes:
    return canonical_json(record_json(stage, summary)) + b"\n"


@pytest.mark.parametrize("stage", list(WRITTEN))
def test_a_stored_record_reads_and_writes_back_byte_for_byte(stage):
    data = stored(stage, WRITTEN[stage])
    record = parse_record(KEY, data, "ac/x.json")
    assert canonical_json(dump(record)) + b"\n" == data
    assert dump_summary(record.summary) == json.loads(json.dumps(WRITTEN[stage]))


def test_every_kind_of_the_registry_has_a_summary_model():
    from trtbuild.builder.stages.registry import STAGES
    from trtbuild.store.summaries import kind_of

    assert {kind_of(stage_id) for stage_id in STAGES} <= set(SUMMARY_MODELS)
    assert {kind_of(stage) for stage in WRITTEN} == {kind_of(stage_id) for stage_id in STAGES}


def test_the_summaries_are_typed_by_their_stage_kind():
    engine = parse_record(KEY, stored("engine", ENGINE), "ac/x.json").summary
    assert isinstance(engine, EngineSummary) and engine.toolchain.tensorrt == "10.13.2"
    validation = parse_record(KEY, stored("validate:trtllm", WRITTEN["validate"]), "ac/x.json").summary
    assert isinstance(validation, ValidationSummary) and validation.gates["ppl_delta_pct"].limit == 2
    package = parse_record(KEY, stored("hf-checkpoint:package", WRITTEN["hf-checkpoint:package"]), "ac/x.json").summary
    assert isinstance(package, HfCheckpointSummary) and package.serving.serves == {"vllm": ["sm90"]}
    assert isinstance(parse_summary("checkpoint:export", WRITTEN["checkpoint:convert"]), CheckpointSummary)
    assert parse_record(KEY, stored("source:path", {}), "ac/x.json").summary is None


@pytest.mark.parametrize("stage, summary, problem", [
    ("compile", {"chars": 5}, "summary: Value error, stage 'compile' has no summary kind (kinds: {kinds})"),
    ("engine", {**ENGINE, "kind": "source"}, "summary: Value error, the engine stage's summary says kind 'source'"),
    ("validate", {k: v for k, v in validation_summary().items() if k != "runner"}, "summary.runner: Field required"),
    ("validate", {**validation_summary(), "verdict": "ok"}, "summary.verdict: Extra inputs are not permitted"),
    ("engine", {k: v for k, v in ENGINE.items() if k != "memory"}, "summary.memory: Field required"),
    ("reference", ["not", "an", "object"], "summary: Value error, the summary is not an object (list)"),
])
def test_a_summary_of_an_unknown_kind_or_with_a_field_missing_or_unknown_is_refused_in_one_line(stage, summary, problem):
    with pytest.raises(CorruptStore) as caught:
        parse_record(KEY, stored(stage, summary), "ac/aa/x.json")
    kinds = ", ".join(SUMMARY_MODELS)  # trtbuild's, and any the test kit added (stagekit)
    assert SUMMARY_MODELS.keys() >= {"source", "calibration", "quantize", "checkpoint", "hf-export", "hf-checkpoint",
                                     "engine", "reference", "validate"}
    assert str(caught.value) == (f"action record ac/aa/x.json is malformed ({problem.format(kinds=kinds)}); "
                                 "run `trtbuild cache verify --repair`")


def test_times_are_utc_datetimes_written_as_records_always_were():
    record = parse_record(KEY, canonical_json(record_json("source:path", {}, created="2026-12-01T20:22:01+01:00")),
                          "ac/x.json")
    assert record.created == dt.datetime(2026, 12, 1, 19, 22, 1, tzinfo=dt.timezone.utc)
    assert dump(record)["created"] == "2026-12-01T19:22:01Z"
    ref = Ref.model_validate_json(json.dumps({"schema": 1, "digest": "b" * 64, "key": KEY, "history": [
        {"digest": "b" * 64, "key": KEY, "time": "2026-12-01T19:22:01Z"}]}), strict=True)
    assert ref.history[0].time.tzinfo == dt.timezone.utc
    assert dump(ref)["history"][0]["time"] == "2026-12-01T19:22:01Z"
    with pytest.raises(CorruptStore, match=r"created: Input should have timezone info"):
        parse_record(KEY, canonical_json(record_json("source:path", {}, created="2026-12-01T19:22:01")), "ac/x.json")


def test_an_engines_platform_is_one_model_from_its_summary_its_folder_and_its_lock(tmp_path):
    """EngineSummary.platform (runner, ls), engine_check.read_engine (check) and the lock's
    LockedPlatform are the one EnginePlatform, and say the same of the same engine."""
    from test_engine_check import make_engine

    from trtbuild.deploy.engine_check import read_engine
    from trtbuild.deploy.listing import platform_of
    from trtbuild.lock.lockfile import LockedPlatform

    folder = make_engine(tmp_path / "engine", tp=2, per_rank=123, quantization=ENGINE["quantization"],
                         version="1.2.0", tensorrt="10.13.2")
    summary = EngineSummary.model_validate(json.loads((folder / "trtbuild.json").read_text()))
    record = ActionRecord.model_validate(record_json("engine", summary.model_dump(mode="json", by_alias=True)))
    assert LockedPlatform is EnginePlatform
    assert read_engine(folder) == summary.platform() == platform_of(record)
    assert isinstance(read_engine(folder), EnginePlatform)


def test_a_records_key_fields_are_the_keys_fields_and_read_as_attributes():
    """ActionRecord.fields is typed (store/records.KeyFields): exactly keys.KEY_FIELDS, read by name."""
    from trtbuild.keys import KEY_FIELDS
    from trtbuild.store.records import KeyFields

    assert tuple(KeyFields.model_fields) == KEY_FIELDS
    data = record_json("hf-checkpoint:package", WRITTEN["hf-checkpoint:package"])
    data["fields"] = key_fields(stage="hf-checkpoint:package", inputs={"weights": "f" * 64},
                                params={"quant": "fp8", "kv_cache": None})
    record = parse_record(KEY, canonical_json(data), "ac/x.json")
    assert (record.fields.inputs, record.fields.params["quant"]) == ({"weights": "f" * 64}, "fp8")


@pytest.mark.parametrize("fields, problem", [
    ({k: v for k, v in key_fields().items() if k != "inputs"}, "fields.inputs: Field required"),
    ({**key_fields(), "host": "h"}, "fields.host: Extra inputs are not permitted"),
    ({**key_fields(), "stage_version": "1"}, "fields.stage_version: Input should be a valid integer"),
])
def test_a_record_whose_key_fields_are_not_the_keys_is_refused_naming_the_field(fields, problem):
    data = {**record_json("source:path", {}), "fields": fields}
    with pytest.raises(CorruptStore) as caught:
        parse_record(KEY, canonical_json(data), "ac/x.json")
    assert str(caught.value) == (f"action record ac/x.json is malformed ({problem}); "
                                 "run `trtbuild cache verify --repair`")
