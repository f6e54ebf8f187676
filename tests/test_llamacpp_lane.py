"""The gguf backend: llama.cpp's own converter and quantizer make the files, llama.cpp computes the
logits that validate them, and the plan says what an architecture takes (issue 25)."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_LLAMA
from trtbuild.facts import llamacpp as llamacpp_facts
from trtbuild.facts import quantformats
from trtbuild.validate.gates import DEFAULT_GATES


def _targets(build: dict) -> dict:
    return {t["name"]: t for t in build["targets"]}


# ---- the recipe and the plan ------------------------------------------------------------------

def test_a_gguf_variant_takes_no_modelopt_field(ws, run):
    recipe = ws.recipe("""
        schema: 1
        name: r
        source: {path: model, config: {config}}
        variants:
          q8: {gguf: Q8_0, quant: fp8}
        backends: [gguf]
    """)
    result = run("plan", recipe)
    assert result.exit_code == 2
    assert "variants.q8" in result.stderr
    assert "quant cannot be set beside gguf" in result.stderr


def test_the_gguf_backend_needs_a_gguf_variant_and_a_gguf_variant_the_backend(ws, run):
    without_variant = ws.recipe("""
        schema: 1
        name: r
        source: {path: model, config: {config}}
        backends: [hf-checkpoint, gguf]
    """, name="a.yaml")
    result = run("plan", without_variant)
    assert result.exit_code == 2
    assert "backends: the gguf backend builds the variants that name a llama.cpp type" in result.stderr
    without_backend = ws.recipe("""
        schema: 1
        name: r
        source: {path: model, config: {config}}
        variants: {q4: {gguf: Q4_K_M}}
        backends: [hf-checkpoint]
    """, name="b.yaml")
    result = run("plan", without_backend)
    assert result.exit_code == 2
    assert "variants.q4.gguf: a gguf variant needs `gguf` in backends" in result.stderr


def test_an_unknown_gguf_type_is_refused_naming_the_types(ws, run):
    recipe = ws.recipe("""
        schema: 1
        name: r
        source: {path: model, config: {config}}
        variants: {q3: {gguf: Q3_K_S}}
        backends: [gguf]
    """)
    result = run("plan", recipe)
    assert result.exit_code == 2
    assert result.stderr == f"{recipe}:4:23: variants.q3.gguf: 'Q3_K_S' is not one of Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q4_0\n"


def test_plan_makes_a_gguf_target_per_gguf_variant_and_none_for_the_others(ws, run):
    recipe = ws.recipe("""
        schema: 1
        name: r
        source: {path: model, config: {config}}
        variants:
          base: {}
          q8: {gguf: Q8_0}
          q4: {gguf: Q4_K_M}
        backends: [hf-checkpoint, gguf]
    """)
    result = run("plan", recipe, "--json")
    assert result.exit_code == 0, result.stderr
    targets = {t["name"]: t for t in json.loads(result.stdout)["targets"]}
    assert {n: (t["kind"], t["variant"], t["status"]) for n, t in targets.items()} == {
        "base-hf": ("hf-checkpoint", "base", "ok"), "q8-gguf": ("gguf", "q8", "ok"), "q4-gguf": ("gguf", "q4", "ok")}
    # TINY_LLAMA: hidden 256, intermediate 512 (256 divides both: no fallback), 4 heads x 32 = 256
    assert targets["q4-gguf"]["warnings"] == []


def test_an_architecture_llama_cpps_converter_does_not_map_is_impossible(ws, run):
    recipe = ws.recipe("""
        schema: 1
        name: r
        source: {path: model, config: {config}}
        variants: {q8: {gguf: Q8_0}}
        backends: [gguf]
    """, config={**TINY_LLAMA, "architectures": ["NotAModelForCausalLM"]})
    result = run("plan", recipe, "--json")
    assert result.exit_code == 0, result.stderr
    target = json.loads(result.stdout)["targets"][0]
    assert (target["name"], target["status"]) == ("q8-gguf", "impossible")
    assert target["reason"] == ("not supported: llama.cpp's converter (llama-cpp-python 0.3.36) has no mapping for "
                                "NotAModelForCausalLM (conversion/__init__.py TEXT_MODEL_MAP)")


def test_plan_warns_where_llama_cpp_falls_back_from_a_k_quant():
    """SmolLM2-135M: hidden 576 = 2.25 x 256, so llama.cpp stores Q4_K_M's q4_K weights of 576 input
    features in q5_0 (llama-quant.cpp tensor_type_fallback); 1536 = 6 x 256 keeps q4_K."""
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import default_recipe, load_recipe

    plan = plan_recipe(load_recipe(default_recipe()))
    assert plan.target("q4_k_m-gguf").warnings == ("576-wide weights stored in q5_0: 256 does not divide 576 "
                                                   "(llama.cpp's fallback)",)
    assert plan.target("q8_0-gguf").warnings == ()


# ---- the facts against llama.cpp's own code ----------------------------------------------------

def test_the_converter_facts_are_the_fetched_converters():
    """trtbuild/data/llamacpp.json's architectures are TEXT_MODEL_MAP's keys in the converter that
    trtbuild fetches for the installed llama-cpp-python (the sdist of that version)."""
    from importlib.metadata import version

    from trtbuild.host import llamacpp

    assert version("llama_cpp_python") == llamacpp_facts.PINNED_VERSION
    tree = llamacpp.converter().parent
    module = ast.parse((tree / "conversion" / "__init__.py").read_text())
    text_map = next(node.value for node in module.body
                    if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "TEXT_MODEL_MAP")
    assert {key.value for key in text_map.keys} == llamacpp_facts.CONVERTER_ARCHITECTURES


def test_the_gguf_types_are_llama_cpps_file_types():
    """Each type's ftype is the value of llama.h's enum that llama-cpp-python's bindings carry."""
    import llama_cpp

    assert {name: t.ftype for name, t in quantformats.GGUF_TYPES.items()} == {
        name: getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}") for name in quantformats.GGUF_TYPES}


def test_a_source_tree_without_the_converter_is_refused_in_one_line(tmp_path, monkeypatch):
    from trtbuild.host import llamacpp

    monkeypatch.setenv(llamacpp.SOURCE_ENV, str(tmp_path))
    with pytest.raises(llamacpp.ConverterUnavailable) as caught:
        llamacpp.converter()
    assert str(caught.value) == f"{llamacpp.SOURCE_ENV}={tmp_path}: no convert_hf_to_gguf.py there"


# ---- the demo's GGUF files, built by the real llama.cpp -----------------------------------------

def test_the_demo_builds_q8_0_and_q4_k_m_that_pass_their_gates_in_order(demo_gguf):
    _, _, build = demo_gguf
    targets = _targets(build)
    assert {n: t["status"] for n, t in targets.items()} == dict.fromkeys(
        ["source", "gguf-source", "q8_0-gguf", "reference", "q8_0-gguf:validate", "q4_k_m-gguf",
         "q4_k_m-gguf:validate"], "built")
    q8, q4 = targets["q8_0-gguf:validate"], targets["q4_k_m-gguf:validate"]
    assert q8["metrics"]["kld_mean"] < q4["metrics"]["kld_mean"]
    assert {name: g["limit"] for name, g in q8["gates"].items()} == DEFAULT_GATES["8bit"]
    assert {name: g["limit"] for name, g in q4["gates"].items()} == DEFAULT_GATES["4bit"]
    assert all(g["passed"] for g in q8["gates"].values()) and all(g["passed"] for g in q4["gates"].values())
    assert targets["q8_0-gguf"]["decided_by"] == [{"validation": "q8_0-gguf:validate", "device": "cpu",
                                                   "runner": f"llama.cpp ({llamacpp_facts.PINNED})"}]


def test_each_file_is_the_type_asked_for_with_the_tokenizer_inside(demo_gguf):
    from gguf import GGUFReader

    _, _, build = demo_gguf
    targets = _targets(build)
    for name, ftype in (("q8_0-gguf", 7), ("q4_k_m-gguf", 15)):
        folder = Path(targets[name]["path"])
        reader = GGUFReader(str(folder / "model.gguf"))
        assert reader.fields["general.file_type"].contents() == ftype
        assert reader.fields["tokenizer.ggml.model"].contents() == "gpt2"
        assert reader.fields["tokenizer.ggml.pre"].contents() == "smollm"
        assert len(reader.fields["tokenizer.ggml.tokens"].data) == 49152
        report = json.loads((folder / "report.json").read_text())
        assert report["gguf"]["file_type"] == ftype
        assert report["serving"]["command"][:6] == ["python3", "-m", "llama_cpp.server", "--model", "model.gguf", "--n_ctx"]


def test_llama_cpp_encodes_text_as_the_source_tokenizer(demo_gguf):
    """The file's tokenizer is the source's: llama.cpp turns text (not only ids) into the same ids."""
    import subprocess
    import sys

    from transformers import AutoTokenizer

    _, _, build = demo_gguf
    targets = _targets(build)
    texts = ["The capital of France is", "def add(a, b):\n    return a + b\n", "Grüße, naïve café — 42 × 3"]
    source = AutoTokenizer.from_pretrained(targets["source"]["path"])
    script = ("import json, sys, llama_cpp\n"
              "llm = llama_cpp.Llama(sys.argv[1], vocab_only=True, verbose=False)\n"
              "print(json.dumps([llm.tokenize(t.encode(), add_bos=False, special=False) for t in json.loads(sys.argv[2])]))")
    done = subprocess.run([sys.executable, "-c", script, str(Path(targets["q4_k_m-gguf"]["path"]) / "model.gguf"),
                           json.dumps(texts)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [source(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_the_estimate_is_within_five_percent_of_the_file(demo_gguf):
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import default_recipe, load_recipe

    _, _, build = demo_gguf
    targets = _targets(build)
    plan = plan_recipe(load_recipe(default_recipe()))
    for name in ("q8_0-gguf", "q4_k_m-gguf"):
        actual = (Path(targets[name]["path"]) / "model.gguf").stat().st_size
        estimated = plan.target(name).estimate.weights_bytes_per_gpu
        assert abs(estimated / actual - 1) < 0.05, (name, estimated, actual)


def test_a_gguf_with_flipped_bytes_fails_its_gates(demo_gguf, tmp_path):
    """The validation stage, as the runner calls it, on a copy of Q8_0 whose tensor data has a byte
    flipped every 4 KiB: llama.cpp still loads it, and the gates say it is not the model."""
    from gguf import GGUFReader

    from trtbuild.builder.stages.base import StageContext
    from trtbuild.builder.stages.validate import validate_llamacpp

    _, _, build = demo_gguf
    targets = _targets(build)
    damaged = tmp_path / "damaged"
    shutil.copytree(targets["q8_0-gguf"]["path"], damaged)
    model = damaged / "model.gguf"
    model.chmod(0o644)
    start = min(t.data_offset for t in GGUFReader(str(model)).tensors)
    data = np.fromfile(model, dtype=np.uint8)
    data[start::4096] ^= 0xFF
    data.tofile(model)
    gates = dict(DEFAULT_GATES["8bit"])
    out = tmp_path / "out"
    out.mkdir()
    ctx = StageContext(out=out, inputs={"reference": Path(targets["reference"]["path"]), "gguf": damaged},
                       params={"gates": gates, "runner": "llamacpp"}, runtime={"target": "q8_0-gguf"})
    validate_llamacpp(ctx)
    report = json.loads((out / "report.json").read_text())
    assert report["gates"]["kld_mean"]["passed"] is False
    assert report["gates"]["top1_agreement"]["passed"] is False
    healthy = json.loads((Path(targets["q8_0-gguf:validate"]["path"]) / "report.json").read_text())
    assert report["metrics"]["kld_mean"] > 10 * gates["kld_mean"] > 10 * healthy["metrics"]["kld_mean"]
