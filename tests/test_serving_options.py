"""An hf-checkpoint's runtime options (serving/): derived from the recipe, every name and value checked
against the runtimes' own argument lists, and packaged over a cached export without touching it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

import stagekit
from trtbuild.facts import serving
from trtbuild.serving import options as so
from trtbuild.builder.graph import build_graph
from trtbuild.plan.expand import plan_recipe
from trtbuild.facts.quantformats import KV_CACHE_NAMES, QUANT_NAMES
from trtbuild.recipe.schema import load_recipe
from trtbuild.builder.runner import run_graph
from trtbuild.builder.stages.registry import STAGES
from trtbuild.store.local import LocalStore

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "trtbuild" / "recipes" / "smollm2-demo.yaml"
DATA = ROOT / "trtbuild" / "data"
TESTS = Path(__file__).resolve().parent


def table(name: str) -> dict:
    return json.loads((DATA / name).read_text())


@pytest.fixture(scope="module")
def demo_graph():
    return build_graph(plan_recipe(load_recipe(DEMO)), validate=False)


def test_the_demos_hf_checkpoints_are_an_export_and_a_package(demo_graph):
    fp8 = demo_graph.node("fp8-hf")
    export = demo_graph.node("fp8-hf-export")
    assert (export.kind, export.stage.id, export.inputs) == ("hf-export", "hf-export:export",
                                                             {"source": "source", "quantized": "fp8-quantized"})
    assert demo_graph.node("base-hf-export").stage.id == "hf-export:convert"
    assert (fp8.kind, fp8.stage.id, fp8.stage.isolated, fp8.inputs) == ("hf-checkpoint", "hf-checkpoint:package",
                                                                        False, {"weights": "fp8-hf-export"})
    assert fp8.param_values() == {
        "limits": {"max_batch_size": 8, "max_num_tokens": 2048, "max_input_len": 1024, "max_seq_len": 2048},
        "dtype": "bfloat16", "quant": "fp8", "kv_cache": "fp8",
        "parallelism": [{"tp": 1, "pp": 1}], "memory_fraction": 0.9, "runtimes": so.runtime_versions(),
        "serving_table": serving.TABLE_VERSION}
    assert fp8.params["memory_fraction"].origin == "default: serving.memory_fraction"
    # the export's key holds no limits: new limits re-package it, never re-export it
    assert set(export.param_values()) == {"dtype", "quant", "kv_cache"}


def test_the_demos_options_exactly(demo_graph):
    [(sub, fp8)] = so.from_params(demo_graph.node("fp8-hf").param_values())
    assert sub == ""
    assert so.llm_api_options(fp8) == {
        "dtype": "bfloat16", "max_batch_size": 8, "max_num_tokens": 2048, "max_seq_len": 2048, "max_input_len": 1024,
        "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
        "kv_cache_config": {"dtype": "fp8", "free_gpu_memory_fraction": 0.9}}
    assert so.vllm_args(fp8) == [
        "--quantization", "modelopt", "--kv-cache-dtype", "fp8", "--tensor-parallel-size", "1",
        "--pipeline-parallel-size", "1", "--max-model-len", "2048", "--max-num-seqs", "8",
        "--max-num-batched-tokens", "2048", "--gpu-memory-utilization", "0.9", "--dtype", "bfloat16"]
    assert so.sglang_args(fp8) == [
        "--quantization", "modelopt_fp8", "--kv-cache-dtype", "fp8_e4m3", "--tp-size", "1", "--pp-size", "1",
        "--context-length", "2048", "--max-running-requests", "8", "--mem-fraction-static", "0.9",
        "--dtype", "bfloat16"]
    [(sub, base)] = so.from_params(demo_graph.node("base-hf").param_values())
    assert sub == ""
    # unquantized: no --quantization, the KV cache in the model's dtype
    assert so.vllm_args(base)[:2] == ["--kv-cache-dtype", "auto"]
    assert so.sglang_args(base)[:2] == ["--kv-cache-dtype", "auto"]
    assert so.llm_api_options(base)["kv_cache_config"] == {"dtype": "auto", "free_gpu_memory_fraction": 0.9}
    [(sub, wo)] = so.from_params(demo_graph.node("int4-wo-hf").param_values())
    assert sub == ""
    # INT4 weight-only is exported as W4A16_AWQ, which no vLLM or SGLang ModelOpt loader accepts (the
    # runtime table): they get no options at all, TensorRT-LLM gets its own
    assert so.serving_runtimes(wo) == ["trtllm"]
    with pytest.raises(so.NotServed, match=r"^vllm serves INT4 weight-only on no SM \(the runtime table\)$"):
        so.vllm_args(wo)
    with pytest.raises(so.NotServed, match=r"^sglang serves INT4 weight-only on no SM"):
        so.sglang_args(wo)
    assert so.llm_api_options(wo)["kv_cache_config"] == {"dtype": "auto", "free_gpu_memory_fraction": 0.9}


def every_format():
    for quant in (None, *QUANT_NAMES):
        for kv in (None, *KV_CACHE_NAMES):
            if kv != "int8":  # an INT8 KV cache has no Hugging Face form (plan rules it out)
                yield so.Serving(quant, kv, "float16", 4, 512, 1024, 256, 0.8, tp=2, pp=2)


def test_every_option_name_and_value_is_in_the_runtimes_own_lists():
    trtllm = table(so.TRTLLM_OPTIONS)
    fields = {f["name"]: f for f in trtllm["llm_args_fields"]}
    kv_fields = {f["name"]: f for f in trtllm["kv_cache_config_fields"]}
    vllm = {f["flag"]: f for f in table(so.VLLM_ARGS)["flags"]}
    sglang = {f["flag"]: f for f in table(so.SGLANG_ARGS)["flags"]}
    for s in every_format():
        runtimes = so.serving_runtimes(s)
        if "trtllm" in runtimes:
            options = so.llm_api_options(s)
            assert set(options) <= set(fields)
            assert set(options["kv_cache_config"]) <= set(kv_fields)
            assert options["kv_cache_config"]["dtype"] in kv_fields["dtype"]["choices"]
        derived = {"vllm": (so.vllm_args, vllm), "sglang": (so.sglang_args, sglang)}
        for argv, flags in ((derived[r][0](s), derived[r][1]) for r in runtimes if r != "trtllm"):
            assert set(argv[::2]) <= set(flags), argv
            for flag, value in zip(argv[::2], argv[1::2]):
                allowed = flags[flag]["choices"] or flags[flag].get("accepted_values") or [value]
                assert value in allowed, (flag, value)


def test_an_option_the_runtime_does_not_know_is_a_bug_that_fails_the_plan(monkeypatch):
    with pytest.raises(so.UnknownOption, match=r"^trtllm-llm-api-options.json: LLM args have no field 'max_batch'$"):
        so.check_llm_api_options({"max_batch": 8})
    with pytest.raises(so.UnknownOption, match=r"^vllm-serve-args.json: the runtime's parser has no --max-seq-len$"):
        so.check_argv(so.VLLM_ARGS, ["--max-seq-len", "2048"])
    real = serving.options
    monkeypatch.setattr(serving, "options", lambda runtime, quant, kv, version=None: {
        **real(runtime, quant, kv, version), **({"kv_cache_dtype": "fp8_e4m4"} if runtime == "sglang" and kv else {})})
    with pytest.raises(so.UnknownOption, match=r"^sglang-server-args.json: --kv-cache-dtype: 'fp8_e4m4' is not one of "):
        build_graph(plan_recipe(load_recipe(DEMO)), validate=False)


def test_several_parallelism_entries_get_a_folder_each(tmp_path, demo_graph):
    params = {**demo_graph.node("fp8-hf").param_values(), "parallelism": [{"tp": 1, "pp": 1}, {"tp": 2, "pp": 1},
                                                                           {"tp": 2, "pp": 2}]}
    written = so.write_serving(tmp_path, params)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert files == sorted(written) == sorted(
        ["serving/README.md"] + [f"serving/{d}/{f}" for d in ("tp1", "tp2", "tp2-pp2")
                                 for f in ("llm_api_options.yaml", "vllm_args.json", "sglang_args.json")])
    options = yaml.safe_load((tmp_path / "serving/tp2-pp2/llm_api_options.yaml").read_text())
    assert (options["tensor_parallel_size"], options["pipeline_parallel_size"]) == (2, 2)
    vllm = json.loads((tmp_path / "serving/tp2/vllm_args.json").read_text())
    assert vllm == {"--quantization": "modelopt", "--kv-cache-dtype": "fp8", "--tensor-parallel-size": 2,
                    "--pipeline-parallel-size": 1, "--max-model-len": 2048, "--max-num-seqs": 8,
                    "--max-num-batched-tokens": 2048, "--gpu-memory-utilization": 0.9, "--dtype": "bfloat16"}
    sglang = json.loads((tmp_path / "serving/tp2-pp2/sglang_args.json").read_text())
    assert (sglang["--tp-size"], sglang["--pp-size"], sglang["--mem-fraction-static"]) == (2, 2, 0.9)
    readme = (tmp_path / "serving/README.md").read_text()
    assert "trtllm-serve DIR --extra_llm_api_options DIR/serving/tp2-pp2/llm_api_options.yaml" in readme
    argv = " ".join(f"{flag} {value}" for flag, value in vllm.items())
    assert f"vllm serve DIR {argv}" in readme


def test_one_parallelism_entry_writes_serving_itself_with_the_exact_commands(tmp_path, demo_graph):
    so.write_serving(tmp_path, demo_graph.node("fp8-hf").param_values())
    assert yaml.safe_load((tmp_path / "serving/llm_api_options.yaml").read_text())["max_seq_len"] == 2048
    readme = (tmp_path / "serving/README.md").read_text().splitlines()
    assert "trtllm-serve DIR --extra_llm_api_options DIR/serving/llm_api_options.yaml" in readme
    assert ("vllm serve DIR --quantization modelopt --kv-cache-dtype fp8 --tensor-parallel-size 1 "
            "--pipeline-parallel-size 1 --max-model-len 2048 --max-num-seqs 8 --max-num-batched-tokens 2048 "
            "--gpu-memory-utilization 0.9 --dtype bfloat16") in readme
    assert ("python -m sglang.launch_server --model-path DIR --quantization modelopt_fp8 --kv-cache-dtype fp8_e4m3 "
            "--tp-size 1 --pp-size 1 --context-length 2048 --max-running-requests 8 --mem-fraction-static 0.9 "
            "--dtype bfloat16") in readme


# ---- packaging over a cached export -------------------------------------------------------------

@pytest.fixture
def stage_modules_importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))


def test_a_change_of_limits_repackages_the_cached_export_without_reading_it(tmp_path, monkeypatch,
                                                                           stage_modules_importable):
    from conftest import TINY_LLAMA
    import trtbuild.store.state as state

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    runs = tmp_path / "runs.log"
    registry = {**STAGES, "calibration": stagekit.RECORD_CALIBRATION, "quantize": stagekit.RECORD_QUANTIZE,
                "hf-export:export": stagekit.RECORD_HF}
    store = LocalStore(tmp_path / "store")

    def build(batch: int, memory: str = ""):
        recipe = tmp_path / "r.yaml"
        recipe.write_text(f"schema: 1\nname: r\nsource: {{path: model}}\nvariants: {{fp8: {{quant: fp8}}}}\n"
                          f"limits: {{max_batch_size: {batch}}}\nbackends: [hf-checkpoint]\n{memory}")
        graph = build_graph(plan_recipe(load_recipe(recipe)), registry, validate=False)
        for each in graph.nodes:
            each.runtime.runs, each.runtime.node = str(runs), each.id
        return {r.id: r for r in run_graph(graph, store).results}

    first = build(8)
    assert {k: r.status for k, r in first.items()} == dict.fromkeys(
        ["source", "calibration", "fp8-quantized", "fp8-hf-export", "fp8-hf"], "built")

    hashed = []
    real = state.file_sha256
    monkeypatch.setattr(state, "file_sha256", lambda path, progress=None: hashed.append(Path(path)) or real(path, progress))
    second = build(16)
    assert {k: r.status for k, r in second.items()} == {"source": "cached", "calibration": "cached",
                                                        "fp8-quantized": "cached", "fp8-hf-export": "cached",
                                                        "fp8-hf": "built"}
    assert second["fp8-hf-export"].key == first["fp8-hf-export"].key
    assert second["fp8-hf"].key != first["fp8-hf"].key
    assert stagekit.counts(runs) == {"calibration": 1, "fp8-quantized": 1, "fp8-hf-export": 1}  # no second export
    # only the files the package wrote were read and hashed: the export's files were not
    export = store.get_manifest(second["fp8-hf-export"].digest)
    written = sorted(p.name for p in hashed if p.parent.name == "serving" and p.parent.parent.name == "out")
    assert written == ["README.md", "check.json", "llm_api_options.yaml", "report.json", "sglang_args.json",
                       "vllm_args.json"]
    export_bytes = {store.blob_path(e.sha256) for e in export.entries}
    outside_source = [p for p in hashed if not p.is_relative_to(model)]  # the source folder is re-keyed each build
    assert [p for p in outside_source if p in export_bytes or p.name in {e.path for e in export.entries}] == []
    package = store.get_manifest(second["fp8-hf"].digest)
    assert [e for e in package.entries if not e.path.startswith("serving/")] == list(export.entries)
    options = yaml.safe_load(next(
        store.open_blob(e.sha256).read() for e in package.entries if e.path == "serving/llm_api_options.yaml"))
    assert options["max_batch_size"] == 16

    third = build(16, "serving: {memory_fraction: 0.8}\n")  # the memory share is in the package's key too
    assert (third["fp8-hf-export"].status, third["fp8-hf"].status) == ("cached", "built")


def test_the_loader_checks_verdict_reaches_the_artifact_the_lock_and_ls(tmp_path, stage_modules_importable):
    """serving/check.json is in the hf-checkpoint; the lock keeps who serves it on which SM, and
    `ls` shows the same from the package's record."""
    import datetime as dt

    from conftest import TINY_LLAMA
    from trtbuild.lock import lockfile
    from trtbuild.deploy import listing as published

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("schema: 1\nname: r\nsource: {path: model}\nvariants: {base: {}}\nbackends: [hf-checkpoint]\n"
                      "gpus: [sm90]\n")
    registry = {**STAGES, "hf-export:convert": stagekit.RECORD_HF}
    loaded = load_recipe(recipe)
    graph = build_graph(plan_recipe(loaded), registry, validate=False)
    for each in graph.nodes:
        each.runtime.runs, each.runtime.node = str(tmp_path / "runs.log"), each.id
    store = LocalStore(tmp_path / "store")
    results = {r.id: r for r in run_graph(graph, store).results}
    package = results["base-hf"]
    assert package.status == "built"
    every_sm = ["sm80", "sm86", "sm89", "sm90", "sm100", "sm120"]  # an unquantized fp16 checkpoint (the runtime table)
    served = {"trtllm": every_sm, "vllm": every_sm, "sglang": every_sm}
    check = json.loads(next(store.open_blob(e.sha256).read() for e in store.get_manifest(package.digest).entries
                            if e.path == "serving/check.json"))
    assert {r: v["accepted"] for r, v in check["runtimes"].items()} == {"trtllm": True, "vllm": True, "sglang": True}
    assert package.summary.serving.serves == served

    lock = lockfile.write(tmp_path / "r.lock", loaded, None, list(results.values()), {})
    assert lock.targets["base-hf"].serves == served and lock.targets["base-hf-export"].serves is None
    assert lockfile.read(tmp_path / "r.lock").targets["base-hf"].serves == served
    for target, ref in (("base-hf", package), ("base-hf-export", results["base-hf-export"])):
        store.update_ref("r", target, ref.digest, ref.key)
    listed = {p.target: p for p in published.list_published(store, "r")}
    assert listed["base-hf"].serves == served
    line = next(row for row in published.table_lines(list(listed.values()), dt.datetime.now(dt.timezone.utc))
                if " base-hf " in row)
    assert "trtllm>=1.3 sm80 sm86 sm89 sm90 sm100 sm120; vllm sm80 sm86 sm89 sm90 sm100 sm120; sglang sm80 sm86 " \
           "sm89 sm90 sm100 sm120" in line


def _server_argv(runtime: str, folder):
    """What `trtbuild bench` starts for `runtime` on `folder`: the packaged options, then its host and port."""
    from trtbuild.bench.server import RuntimeServer, server_spec

    return RuntimeServer(server_spec(runtime, folder, "fp8-hf"), 1).command


def test_bench_starts_each_runtime_with_flags_its_own_parser_defines(tmp_path, demo_graph):
    """The servers `trtbuild bench` starts on a packaged hf-checkpoint (vllm serve, SGLang's launch_server,
    trtllm-serve) take only flags their parsers define, each with a value of its type: the parsers as
    read from the runtimes' sources (trtbuild/data/*.json, the tables check_argv enforces)."""
    so.write_serving(tmp_path, demo_graph.node("fp8-hf").param_values())
    vllm = _server_argv("vllm", tmp_path)
    assert vllm[:3] == ["vllm", "serve", str(tmp_path)]
    so.check_argv(so.VLLM_ARGS, vllm[3:])
    assert vllm[-4:-1] == ["--host", "127.0.0.1", "--port"]
    sglang = _server_argv("sglang", tmp_path)
    assert sglang[1:3] == ["-m", "sglang.launch_server"]
    so.check_argv(so.SGLANG_ARGS, sglang[3:])
    assert sglang[3:5] == ["--model-path", str(tmp_path)]
    trtllm = _server_argv("trtllm", tmp_path)
    serve_cli = {spelling: entry for entry in so._table(so.TRTLLM_OPTIONS)["trtllm_serve_cli"]
                 for spelling in [entry["flag"], *entry["aliases"]]}
    assert trtllm[:2] == ["trtllm-serve", str(tmp_path)]
    flags = trtllm[2::2]
    assert [f for f in flags if f not in serve_cli] == [] and len(flags) == len(trtllm[3::2])
    assert trtllm[3] == str(tmp_path / "serving" / so.LLM_API_OPTIONS_FILE)
    so.check_llm_api_options(yaml.safe_load(Path(trtllm[3]).read_text()))


def test_a_flag_no_runtime_defines_is_refused_by_the_table_bench_is_held_to(tmp_path, demo_graph):
    so.write_serving(tmp_path, demo_graph.node("fp8-hf").param_values())
    with pytest.raises(so.UnknownOption, match=r"^vllm-serve-args.json: the runtime's parser has no --hots$"):
        so.check_argv(so.VLLM_ARGS, [*_server_argv("vllm", tmp_path)[3:-4], "--hots", "127.0.0.1"])
