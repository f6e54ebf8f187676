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

import stagekit
from tinymodels import make_model, make_tokenizer, pydoc_text
from trtbuild.validate import metrics

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
    validations = [t for t in targets.values() if t["stage"] == "validate"]
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
    assert entry["gates"]["kld_mean"] == {"value": m["kld_mean"], "limit": metrics.DEFAULT_GATES["8bit"]["kld_mean"],
                                          "passed": True}
    report = Path(entry["path"])
    assert "| KL divergence, mean |" in (report / "report.md").read_text()
    assert json.loads((report / "report.json").read_text())["calibration_overlap"] == 0.0
    lock = yaml.safe_load((store.parent / "recipe.lock").read_text())
    assert lock["validation"] == "run"
    assert lock["targets"]["fp8-tp1:validate"]["gates_passed"] is True
    assert lock["targets"]["fp8-tp1:validate"]["metrics"]["kld_mean"] == pytest.approx(m["kld_mean"], rel=1e-4)


def test_engines_wait_for_validation(built):
    _, _, targets = built
    assert targets["fp8-tp1-sm90"]["status"] == "skipped"  # no GPU here, but only after the validation passed
    assert targets["fp8-tp1-sm90"]["reason"].startswith("needs sm90 GPU")


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
    from trtbuild.graph import build_graph
    from trtbuild.plan import plan_recipe
    from trtbuild.recipe import load_recipe
    from trtbuild.runner import run_graph
    from trtbuild.stages.base import Stage
    from trtbuild.stages.registry import STAGES
    from trtbuild.store.local import LocalStore

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    recipe = project / "damaged.yaml"
    recipe.write_text(RECIPE.format(calibration="calib.txt", evaluation="builtin").replace("name: tiny-validate", "name: damaged"))
    registry = {**STAGES, "checkpoint:convert": Stage("checkpoint", 1, "stagekit:damaged_checkpoint")}
    graph = build_graph(plan_recipe(load_recipe(recipe)), registry)
    graph = graph.closure({"bf16-tp1-sm90"})
    results = {r.id: r for r in run_graph(graph, LocalStore(tmp_path / "store"))[0]}
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
