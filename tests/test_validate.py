"""Validation through `trtbuild build` on a tiny real model: the shared reference, metrics that are ~0
for an unquantized checkpoint, gates that fail a damaged one, and what the lock and JSON carry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import needs_no_gpu, needs_no_trtllm
from tinymodels import make_model, make_tokenizer, pydoc_text
from trtbuild.validate import gates, metrics

TESTS = Path(__file__).resolve().parent

RECIPE = """
schema: 1
name: tiny-validate
source: {{path: model}}
dtype: bfloat16
variants:
  bf16: {{}}
  fp8: {{quant: fp8, kv_cache: fp8}}
calibration: {{text: {calibration}, samples: 4, seq_len: 32}}
parallelism: [{{tp: 1}}, {{tp: 2}}]
gpus: [sm90]
limits: {{max_input_len: 128, max_seq_len: 256}}
backends: [engine, hf-checkpoint]
validate: {{text: {evaluation}, samples: 3, seq_len: 48}}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("validate")
    make_model(folder / "model", "llama", make_tokenizer(folder / "tokenizer"))
    (folder / "calib.txt").write_text(pydoc_text()[:30000])
    return folder


def build(folder: Path, store: Path, *args, calibration="calib.txt", evaluation="builtin", env=None) -> tuple[int, dict]:
    recipe = folder / "recipe.yaml"
    recipe.write_text(RECIPE.format(calibration=calibration, evaluation=evaluation))
    result = subprocess.run([sys.executable, "-m", "trtbuild", "build", str(recipe), "--json", *args], capture_output=True,
                            text=True, env={**os.environ, "TRTBUILD_CACHE": str(store), **(env or {})}, timeout=900)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    return result.returncode, {t["name"]: t for t in json.loads(result.stdout)["targets"]}


@pytest.fixture(scope="module")
def built(project):
    store = project / "store"
    return store, *build(project, store)


def test_one_reference_shared_by_every_validation(built):
    _, rc, targets = built
    assert rc == 0
    assert targets["reference"]["status"] == "built"
    validations = [t for t in targets.values() if t["stage"] == "validate" and t["status"] != "skipped"]
    assert {t["name"] for t in validations} == {"bf16-tp1:validate", "bf16-tp2:validate", "bf16-hf:validate",
                                                 "fp8-tp1:validate", "fp8-tp2:validate", "fp8-hf:validate"}
    # fp8 is validated through its restored quantized model: one key for every parallelism and the HF form
    fp8 = [targets[n] for n in ("fp8-tp1:validate", "fp8-tp2:validate", "fp8-hf:validate")]
    assert len({t["key"] for t in fp8}) == 1 and sorted(t["status"] for t in fp8) == ["built", "cached", "cached"]


def test_unquantized_checkpoints_match_their_source(built):
    _, _, targets = built
    for name in ("bf16-tp1:validate", "bf16-tp2:validate", "bf16-hf:validate"):
        m = targets[name]["metrics"]
        assert m["kld_mean"] < 1e-5 and m["top1_agreement"] >= 0.98 and abs(m["ppl_delta_pct"]) < 0.1, (name, m)
        assert set(m) == {"kld_mean", "kld_p99", "top1_agreement", "ppl_reference", "ppl", "ppl_delta_pct", "tokens"}
        assert m["tokens"] == 3 * 47
        assert all(g["passed"] for g in targets[name]["gates"].values())


def test_quantized_numbers_are_plausible_and_gated(built):
    store, _, targets = built
    entry = targets["fp8-tp1:validate"]
    m = entry["metrics"]
    assert 0 < m["kld_mean"] < m["kld_p99"] and 0 < m["top1_agreement"] <= 1
    assert set(entry["gates"]) == {"kld_mean", "kld_p99", "top1_agreement", "ppl_delta_pct"}
    assert entry["gates"]["kld_mean"] == {"value": m["kld_mean"], "limit": gates.DEFAULT_GATES["8bit"]["kld_mean"],
                                          "passed": True}
    report = Path(entry["path"])
    assert "| KL divergence, mean |" in (report / "report.md").read_text()
    assert json.loads((report / "report.json").read_text())["calibration_overlap"] == 0.0
    lock = yaml.safe_load((store.parent / "recipe.lock").read_text())
    assert lock["validation"] == "run"
    assert lock["targets"]["fp8-tp1:validate"]["gates_passed"] is True
    assert lock["targets"]["fp8-tp1:validate"]["metrics"]["kld_mean"] == pytest.approx(m["kld_mean"], rel=1e-4)


@needs_no_gpu
@needs_no_trtllm
def test_engines_wait_for_validation(built):
    _, _, targets = built
    assert targets["fp8-tp1-sm90"]["status"] == "skipped"
    assert targets["fp8-tp1-sm90"]["reason"] == "needs sm90 GPU with tensorrt_llm 1.2.x (this machine: no GPU, no tensorrt_llm); and needs fp8-tp1-sm90:validate, which was skipped"
    # its checkpoint's validation passed; what it still waits for is its own (its twin's) validation
    assert targets["fp8-tp1:validate"]["status"] == "built"
    assert targets["fp8-tp1-sm90:validate"]["reason"].endswith("; and needs fp8-tp1-sm90:twin, which was skipped")


@needs_no_gpu
@needs_no_trtllm
def test_what_tensorrt_llm_must_validate_is_skipped_here_with_the_reason(built):
    """Engines (through a twin built with --gather_context_logits) and hf-checkpoints as TensorRT-LLM
    serves them: nodes of the build, skipped on a host without tensorrt_llm and a GPU."""
    _, _, targets = built
    for variant in ("bf16", "fp8"):
        twin, check = targets[f"{variant}-tp1-sm90:twin"], targets[f"{variant}-tp1-sm90:validate"]
        assert (twin["stage"], twin["status"], twin["reason"]) == ("engine", "skipped", "needs sm90 GPU with tensorrt_llm 1.2.x (this machine: no GPU, no tensorrt_llm)")
        assert check["stage"] == "validate" and check["status"] == "skipped"
        assert check["reason"].startswith("needs tensorrt_llm 1.2.x and an NVIDIA GPU (this machine: no tensorrt_llm")
        hf = targets[f"{variant}-hf:validate-trtllm"]
        assert hf["stage"] == "validate" and hf["status"] == "skipped"
        assert hf["reason"].startswith("needs tensorrt_llm (PyTorch backend, 1.3 or later) and an NVIDIA GPU")
        assert "metrics" not in hf and "metrics" not in check  # nothing pretends to have measured them


def test_evaluating_on_the_calibration_text_marks_the_gates_unreliable(project):
    code, targets = build(project, project / "store", "--target", "fp8-tp1", evaluation="calib.txt")
    entry = targets["fp8-tp1:validate"]
    report = json.loads((Path(entry["path"]) / "report.json").read_text())
    assert report["calibration_overlap"] > 0 and report["gates_reliable"] is False
    assert any("the evaluation text is the calibration text" in w for w in entry["warnings"])


def test_no_validate_skips_and_says_so(project, tmp_path):
    code, targets = build(project, tmp_path / "store", "--no-validate", "--target", "bf16-tp1")
    assert code == 0 and not any(t["stage"] in ("validate", "reference") for t in targets.values())
    assert yaml.safe_load((project / "recipe.lock").read_text())["validation"] == "skipped (--no-validate)"


def test_a_damaged_checkpoint_fails_its_gate_and_blocks_its_engines(project, tmp_path, monkeypatch):
    """A checkpoint stage that permutes one layer's MLP rows: validation must catch it."""
    from trtbuild.builder.graph import build_graph
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe
    from trtbuild.builder.runner import run_graph
    from trtbuild.builder.stages.base import Stage
    from trtbuild.builder.stages.registry import STAGES
    from trtbuild.store.local import LocalStore

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    recipe = project / "damaged.yaml"
    recipe.write_text(RECIPE.format(calibration="calib.txt", evaluation="builtin").replace("name: tiny-validate", "name: damaged"))
    registry = {**STAGES, "checkpoint:convert": Stage("checkpoint", 1, "stagekit:damaged_checkpoint")}
    graph = build_graph(plan_recipe(load_recipe(recipe)), registry)
    graph = graph.closure({"bf16-tp1-sm90"})
    results = {r.id: r for r in run_graph(graph, LocalStore(tmp_path / "store")).results}
    bad = results["bf16-tp1:validate"]
    assert bad.status == "failed" and bad.digest is not None  # kept in the store for inspection
    assert bad.reason.startswith("failed its gates: kld_mean ")
    assert "(limit 0.01)" in bad.reason and "report.md" in bad.reason
    assert results["bf16-tp1-sm90"].status == "failed"
    assert results["bf16-tp1-sm90"].reason == "needs bf16-tp1:validate, which failed"


def test_kl_from_top_k_is_a_close_lower_bound():
    """On peaked, Zipf-like distributions (as language models' are) the top-64 estimate is a lower
    bound within a few percent; benchmarks/RESULTS.md measures it on SmolLM2."""
    rng = np.random.default_rng(0)
    vocab = 5000
    logits = -1.5 * np.log(np.arange(1, vocab + 1))[None, :] + rng.normal(size=(50, vocab)) * 0.5
    noisy = logits + rng.normal(size=logits.shape) * 0.3

    def log_softmax(x):
        m = x.max(-1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))

    p, q = log_softmax(logits), log_softmax(noisy)
    exact = (np.exp(p) * (p - q)).sum(-1)
    ids, top = metrics.topk_reference(p.astype(np.float32), 64)
    approx = metrics.kl_topk(ids, top, q.astype(np.float32))
    assert np.all(approx <= exact + 1e-5)
    assert np.abs(approx - exact).mean() < 0.15 * exact.mean()


def test_two_sample_test_reproduces_trtllm_mmlu_numbers():
    """reference/trtllm.md section 7: MMLU, n 4096, sigma 50, alpha 0.05, beta 0.2 gives a threshold
    about 1.82 below the reference and theta about 2.75."""
    test = metrics.two_sample_test(4096, 50.0)
    assert test["threshold_offset"] == pytest.approx(-1.82, abs=0.005)
    assert test["theta"] == pytest.approx(2.75, abs=0.005)


def _metrics(top1_per_window: list, tokens_per_window: int) -> metrics.Metrics:
    top1 = np.repeat(np.array(top1_per_window)[:, None], tokens_per_window, axis=1)
    zeros = np.zeros_like(top1)
    return metrics.summarize(metrics.Comparison(kl=zeros + 0.01, top1=top1, ref_nll=zeros + 2.0, cand_nll=zeros + 2.0))


def test_top1_gate_warns_when_the_sample_cannot_detect_a_drop_of_its_margin():
    # 2 windows x 10 tokens: theta for a 0.97 limit is far above the 0.03 margin
    few = _metrics([1.0, 0.9], 10)
    _, warnings, tests = metrics.evaluate_gates(few, {"top1_agreement": 0.97})
    assert tests["top1_agreement"]["theta"] > tests["top1_agreement"]["margin"] == pytest.approx(0.03)
    assert any(w.startswith("top1_agreement: ") and "two-sample test" in w for w in warnings)
    # many windows: enough effective tokens, no such warning
    many = _metrics([1.0, 0.8] * 200, 100)
    gates, warnings, tests = metrics.evaluate_gates(many, {"top1_agreement": 0.85})
    assert gates["top1_agreement"].passed and tests["top1_agreement"]["theta"] < 0.15
    assert not any("two-sample" in w for w in warnings)
    # neighbouring tokens are not independent: the effective n comes from the spread over windows
    assert tests["top1_agreement"]["n"] < many.tokens


def test_report_command_writes_the_page_and_plot(built, project):
    store, _, _ = built
    _, targets = build(project, store)  # cached: rewrites the lock other tests changed
    result = subprocess.run([sys.executable, "-m", "trtbuild", "report", str(project / "recipe.yaml"), "--store", str(store)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    html, png = (Path(line) for line in result.stdout.split())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = html.read_text()
    assert 'id="matrix"' in page and "fp8-tp1" in page and "bf16-hf" in page
    row = page[page.index("<code>fp8-tp1</code>"):]
    row = row[:row.index("</tr>")]
    kld = targets["fp8-tp1:validate"]["metrics"]["kld_mean"]
    assert f'<td class="num">{kld:.3g}</td>' in row and "passed" in row and "status-built" in row
    assert "<td>torch on cpu</td>" in row  # which runner measured it, on which device
    engine = page[page.index("<code>fp8-tp1-sm90</code>"):]
    engine = engine[:engine.index("</tr>")]
    assert f'<td class="num">{kld:.3g}</td>' in engine and "<td>torch on cpu (of fp8-tp1)</td>" in engine


@pytest.mark.parametrize("mode", ["twin", "published", "none"])
def test_validate_engines_modes_shape_the_graph(mode, tmp_path):
    """`validate.engines`: who carries --gather_context_logits, and what the published engine waits for."""
    from conftest import TINY_LLAMA
    from trtbuild.builder.graph import build_graph
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(TINY_LLAMA))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"schema: 1\nname: r\nsource: {{path: model}}\ngpus: [sm90]\nvalidate: {{engines: {mode}}}\n")
    graph = build_graph(plan_recipe(load_recipe(recipe)))
    ids = [n.id for n in graph.nodes]
    engine = graph.node("base-tp1-sm90")
    gathers = engine.params["flags"].value.get("gather_context_logits", False)
    if mode == "twin":
        twin, check = graph.node("base-tp1-sm90:twin"), graph.node("base-tp1-sm90:validate")
        assert twin.params["flags"].value == {**engine.params["flags"].value, "gather_context_logits": True}
        assert not gathers
        assert {k: p.value for k, p in twin.params.items() if k != "flags"} == \
            {k: p.value for k, p in engine.params.items() if k != "flags"}
        assert check.inputs["engine"] == twin.id and engine.after == ["base-tp1:validate", check.id]
        assert ids.index(twin.id) < ids.index(check.id) < ids.index(engine.id)
    elif mode == "published":
        check = graph.node("base-tp1-sm90:validate")
        assert gathers and "validate.engines: published" in engine.params["flags"].parts["gather_context_logits"]
        assert check.inputs["engine"] == engine.id and ids.index(engine.id) < ids.index(check.id)
        assert not any(i.endswith(":twin") for i in ids)
    else:
        assert not gathers and engine.after == ["base-tp1:validate"]
        assert not any(i.startswith("base-tp1-sm90:") for i in ids)
    # with --no-validate nothing asks for the flag
    plain = build_graph(plan_recipe(load_recipe(recipe)), validate=False)
    assert [n.id for n in plain.nodes if n.kind == "engine"] == ["base-tp1-sm90"]
    assert "gather_context_logits" not in plain.node("base-tp1-sm90").params["flags"].value
