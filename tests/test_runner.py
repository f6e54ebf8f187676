"""The runner on graphs of simple real stages (tests/stagekit.py), run in real subprocesses."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import stagekit
from stagekit import DIE, FAIL, GATED, UPPER_INPROCESS, WRITE, counts, diamond, node
from stage_fixtures import TESTS, stage_modules_importable, store  # noqa: F401 (fixtures)
from trtbuild.builder.graph import Graph
from trtbuild.builder.runner import RunOptions, Silent, run_graph
from trtbuild.store.checkout import materialize
from trtbuild.store.local import LocalStore
from trtbuild.store.verify import verify
from trtbuild.store.summaries import dump_summary


def statuses(results) -> dict[str, str]:
    return {r.id: r.status for r in results}


def test_second_run_builds_nothing(store, tmp_path):
    runs = tmp_path / "runs.log"
    first = run_graph(diamond(runs), store).results
    assert statuses(first) == dict.fromkeys(["a", "b", "A", "B", "ab"], "built")
    out = materialize(store, first[-1].digest)
    assert (out / "text.txt").read_text() == "ALPHA!+BETA!"
    assert (out / "bin" / "tool.sh").stat().st_mode & 0o111
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == ["bin/tool.sh", "text.txt"]

    second = run_graph(diamond(runs), store).results
    assert statuses(second) == dict.fromkeys(["a", "b", "A", "B", "ab"], "cached")
    assert [r.digest for r in second] == [r.digest for r in first]
    assert counts(runs) == dict.fromkeys(["a", "b", "A", "B", "ab"], 1)


def test_changing_one_parameter_rebuilds_only_its_subtree(store, tmp_path):
    runs = tmp_path / "runs.log"
    run_graph(diamond(runs), store)
    changed = run_graph(diamond(runs, b_text="gamma"), store).results
    assert statuses(changed) == {"a": "cached", "A": "cached", "b": "built", "B": "built", "ab": "built"}
    assert counts(runs) == {"a": 1, "A": 1, "b": 2, "B": 2, "ab": 2}
    assert (materialize(store, changed[-1].digest) / "text.txt").read_text() == "ALPHA!+GAMMA!"
    again = run_graph(diamond(runs, b_text="gamma"), store).results
    assert set(statuses(again).values()) == {"cached"}


def test_keys_hold_input_digests_so_equal_bytes_do_not_cascade(store, tmp_path):
    runs = tmp_path / "runs.log"
    g1 = Graph("g", [node("a", WRITE, runs, text="same", delay=0), node("A", UPPER_INPROCESS, runs, inputs={"src": "a"})])
    g2 = Graph("g", [node("a", WRITE, runs, text="same", delay=0.01), node("A", UPPER_INPROCESS, runs, inputs={"src": "a"})])
    r1 = run_graph(g1, store).results
    r2 = run_graph(g2, store).results
    assert r2[0].status == "built" and r2[0].key != r1[0].key  # a new parameter: a new key, built
    assert r2[0].digest == r1[0].digest  # ... to the same bytes
    assert r2[1].status == "cached"  # so what depends on those bytes is not rebuilt
    assert counts(runs) == {"a": 2, "A": 1}


def test_a_failing_stage_fails_its_dependents_with_one_line_and_keeps_its_log(store, tmp_path):
    runs = tmp_path / "runs.log"
    graph = Graph("g", [node("bad", FAIL, runs), node("after", UPPER_INPROCESS, runs, inputs={"src": "bad"}),
                        node("other", WRITE, runs, text="fine")])
    results = run_graph(graph, store).results
    bad, after, other = results
    assert bad.status == "failed"
    assert bad.reason.startswith("ValueError: the input is not what this stage expects second line (log: ")
    log_dir = Path(bad.reason.split("(log: ")[1].rstrip(")"))
    assert "Traceback" in (log_dir / "fail.log").read_text()
    assert (after.status, after.reason) == ("failed", "needs bad, which failed")
    assert other.status == "built"  # independent work goes on
    assert store.get_record(bad.key) is None and verify(store) == []


def test_a_stage_killed_by_the_kernel_does_not_kill_the_runner(store, tmp_path):
    results = run_graph(Graph("g", [node("oom", DIE, tmp_path / "runs.log")]), store).results
    assert results[0].status == "failed"
    assert results[0].reason.startswith("stage process killed by SIGKILL (out of memory?)")


def test_until_and_unavailable_stages_are_skipped(store, tmp_path):
    graph = Graph("g", [node("a", WRITE, text="x"), node("A", UPPER_INPROCESS, inputs={"src": "a"}),
                        node("later", UPPER_INPROCESS, inputs={"src": "A"})])
    graph.nodes[0].kind = graph.nodes[1].kind = "checkpoint"
    graph.nodes[2].kind = "engine"
    graph.nodes[2].host = stagekit.Lacking("needs sm90 GPU with tensorrt_llm 1.2.x (this machine: no GPU)")
    results = run_graph(graph, store, RunOptions(until="checkpoint")).results
    assert [(r.id, r.status, r.reason) for r in results] == [
        ("a", "built", None), ("A", "built", None), ("later", "skipped", "after --until checkpoint")]
    results = run_graph(graph, store).results
    assert [r.status for r in results] == ["cached", "cached", "skipped"]
    assert results[2].reason == "needs sm90 GPU with tensorrt_llm 1.2.x (this machine: no GPU)"
    results = run_graph(graph, store, RunOptions(require_all=True)).results
    assert results[2].status == "failed"


CONCURRENT = """
import sys, json
sys.path.insert(0, {tests!r})
from pathlib import Path
import stagekit
from trtbuild.builder.runner import run_graph
from trtbuild.store.local import LocalStore
results = run_graph(stagekit.diamond(Path({runs!r}), a_text="slow"), LocalStore(Path({store!r}))).results
print(json.dumps({{r.id: [r.status, r.digest] for r in results}}))
"""


def test_four_concurrent_processes_build_each_key_once(store, tmp_path):
    runs = tmp_path / "runs.log"
    script = CONCURRENT.format(tests=str(TESTS), runs=str(runs), store=str(store.root))
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outputs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert counts(runs) == dict.fromkeys(["a", "b", "A", "B", "ab"], 1)
    for name in ("a", "b", "A", "B", "ab"):
        assert sorted(o[name][0] for o in outputs).count("built") == 1
        assert len({o[name][1] for o in outputs}) == 1  # everybody got the same artifact
    assert verify(store) == []


KILLABLE = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
import stagekit
from trtbuild.builder.graph import Graph
from trtbuild.builder.runner import run_graph
from trtbuild.store.local import LocalStore
graph = Graph("big", [stagekit.node("big", stagekit.BIG, Path({runs!r}), mib={mib}, files=8),
                      stagekit.node("small", stagekit.UPPER_INPROCESS, None, inputs={{"src": "big"}})])
graph.nodes[1].stage = stagekit.WRITE
graph.nodes[1].params["text"] = stagekit.Param("after", "test")
results = run_graph(graph, LocalStore(Path({store!r}))).results
print([r.status.value for r in results])
"""


def _kill_when(script: str, root: Path, moment) -> None:
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not moment(root):
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _stage_running(root: Path) -> bool:
    return any((root / "tmp").glob("big-*/out/part0.bin")) if (root / "tmp").exists() else False


def _blobs(root: Path) -> list[Path]:
    return [p for p in (root / "cas").rglob("*") if p.is_file()] if (root / "cas").exists() else []


def _manifest_written(root: Path) -> bool:
    return any((root / "manifests").glob("*.json")) if (root / "manifests").exists() else False


def test_a_runner_killed_mid_write_leaves_a_valid_store_and_the_next_run_completes(tmp_path):
    runs = tmp_path / "runs.log"
    moments = {"while the stage writes": _stage_running, "while blobs are stored": lambda r: bool(_blobs(r)),
               "once the manifest is written": _manifest_written}
    caught_mid_ingest = False
    for i, (label, moment) in enumerate(moments.items()):
        root = tmp_path / f"store{i}"
        script = KILLABLE.format(tests=str(TESTS), runs=str(runs), store=str(root), mib=64)
        _kill_when(script, root, moment)
        store = LocalStore(root)
        assert verify(store) == [], f"store invalid after SIGKILL {label}"
        if label == "while blobs are stored":
            caught_mid_ingest = bool(_blobs(root)) and not store.records()
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        assert set(ast.literal_eval(done.stdout.strip())) <= {"built", "cached"}
        assert verify(store) == []
        for record in store.records():
            materialize(store, record.digest)  # every recorded artifact is whole
    assert caught_mid_ingest, "the kill did not land between the first blob and the record"


def test_recipe_graph_rebuilds_only_the_changed_variants_subtree(store, tmp_path):
    """A recipe's own graph, with simple real stages standing in for checkpoint and engine."""
    from conftest import TINY_LLAMA
    from trtbuild.builder.graph import build_graph
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe
    from trtbuild.builder.stages.registry import STAGES

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    runs = tmp_path / "runs.log"
    stand_in = {"calibration": stagekit.RECORD_CALIBRATION, "quantize": stagekit.RECORD_QUANTIZE,
                "checkpoint:convert": stagekit.RECORD_CHECKPOINT, "checkpoint:export": stagekit.RECORD_CHECKPOINT,
                "hf-export:convert": stagekit.RECORD_HF, "hf-export:export": stagekit.RECORD_HF,
                "engine": stagekit.RECORD_ENGINE, "reference": stagekit.RECORD_REFERENCE,
                "validate": stagekit.RECORD_VALIDATE, "validate:trtllm": stagekit.RECORD_VALIDATE,
                "validate:vllm": stagekit.RECORD_VALIDATE}
    registry = {**STAGES, **stand_in}

    def build(kv: str) -> dict[str, str]:
        recipe = tmp_path / "r.yaml"
        recipe.write_text(f"""
schema: 1
name: r
source: {{path: model}}
variants: {{bf16: {{}}, fp8: {{quant: fp8, kv_cache: {kv}}}}}
parallelism: [{{tp: 1}}, {{tp: 2}}]
gpus: [sm89, sm90]
backends: [engine, hf-checkpoint]
""")
        graph = build_graph(plan_recipe(load_recipe(recipe)), registry)
        for each in graph.nodes:
            each.host = None  # the stand-in engine needs no GPU
            each.runtime.runs, each.runtime.node = str(runs), each.id
        results = run_graph(graph, store).results
        return statuses(results)

    first = build("fp8")
    # source, calibration, fp8-quantized, reference; per variant 2 checkpoints, 4 engines, their 4
    # validation twins and 4 engine validations, 1 HF checkpoint (its export and its package, the real
    # stage), 3 checkpoint validations (fp8's three share one key: 1 built, 2 cached) and the HF
    # checkpoint's TensorRT-LLM and vLLM validations
    assert len(first) == 4 + 2 * (2 + 4 + 4 + 4 + 2 + 3 + 2)
    assert [n for n, st in first.items() if st != "built"] == ["fp8-tp2:validate", "fp8-hf:validate"]
    second = build("null")  # fp8 without the FP8 KV cache
    rebuilt = {name for name, status in second.items() if status == "built"}
    # the calibration set and the reference are the same: not rebuilt; fp8's three validations share
    # one key (its quantized model), built once
    engines = {f"fp8-tp{tp}-{sm}" for tp in (1, 2) for sm in ("sm89", "sm90")}
    assert rebuilt == {"fp8-quantized", "fp8-tp1", "fp8-tp2", "fp8-hf-export", "fp8-hf", "fp8-tp1:validate",
                       "fp8-hf:validate-trtllm", "fp8-hf:validate-vllm",
                       *engines, *{f"{e}:twin" for e in engines}, *{f"{e}:validate" for e in engines}}
    assert {name for name, status in second.items() if status == "cached"} == set(first) - rebuilt
    assert counts(runs)["bf16-tp1-sm90"] == 1 and counts(runs)["fp8-tp1-sm90"] == 2


def test_stage_progress_lines_reach_the_reporter(store):
    class Recorder(Silent):
        def __init__(self):
            self.steps = []

        def step(self, done, total, label):
            self.steps.append((done, total, label))

    reporter = Recorder()
    results = run_graph(Graph("g", [node("count", stagekit.COUNTING, steps=4)]), store, reporter=reporter).results
    assert results[0].status == "built"
    assert reporter.steps and reporter.steps[-1] == (4, 4, "batches")
    assert [s[0] for s in reporter.steps] == sorted(s[0] for s in reporter.steps)
    log = store.get_record(results[0].key).execution.logs["counting.log"]
    assert "TRTBUILD-PROGRESS: 4/4 batches" in store.blob_path(log.hash).read_text()


# ---- what the store gives back is what was stored ---------------------------------------------------

def test_the_log_and_the_run_figures_live_in_the_action_record_not_the_artifact(store, tmp_path):
    """Two builds of the same graph into two stores (a log line, seconds and peak memory that differ
    every run) give the same digests; the log is a blob named by the record, with its size."""
    other = LocalStore(tmp_path / "other")
    first = run_graph(Graph("g", [node("count", stagekit.COUNTING, steps=3)]), store).results[0]
    second = run_graph(Graph("g", [node("count", stagekit.COUNTING, steps=3)]), other).results[0]
    assert first.digest == second.digest and first.key == second.key
    record = store.get_record(first.key)
    assert sorted(e.path for e in store.get_manifest(first.digest).entries) == ["done.txt"]
    log = record.execution.logs["counting.log"]
    assert log.size_bytes == store.blob_path(log.hash).stat().st_size > 0
    assert record.execution.peak_rss_mib > 0 and record.execution.seconds > 0
    assert record.artifact.size_bytes == store.get_manifest(first.digest).size


def _first_blob(store: LocalStore, digest: str) -> Path:
    return store.blob_path(store.get_manifest(digest).entries[0].sha256)


def test_a_deleted_blob_is_rebuilt_not_reported_cached(store, tmp_path):
    runs = tmp_path / "runs.log"
    first = run_graph(diamond(runs), store).results
    _first_blob(store, first[-1].digest).unlink()  # ab's artifact loses a file
    again = run_graph(diamond(runs), store).results
    assert statuses(again) == {"a": "cached", "b": "cached", "A": "cached", "B": "cached", "ab": "built"}
    assert again[-1].digest == first[-1].digest and counts(runs)["ab"] == 2
    assert verify(store) == []


def test_a_flipped_byte_with_its_mtime_restored_is_rebuilt(store, tmp_path):
    runs = tmp_path / "runs.log"
    first = run_graph(diamond(runs), store).results
    blob = _first_blob(store, first[0].digest)
    st = blob.stat()
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[0] ^= 0xFF
    blob.write_bytes(bytes(data))
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = run_graph(diamond(runs), store).results
    assert statuses(again)["a"] == "built" and again[0].digest == first[0].digest
    assert counts(runs)["a"] == 2 and verify(store) == []


def test_rebuild_builds_the_named_node_again_and_nothing_else(store, tmp_path):
    runs = tmp_path / "runs.log"
    run_graph(diamond(runs), store)
    again = run_graph(diamond(runs), store, RunOptions(rebuild=frozenset({"B"}))).results
    assert statuses(again) == {"a": "cached", "b": "cached", "A": "cached", "B": "built", "ab": "cached"}
    assert counts(runs)["B"] == 2


def test_a_damaged_artifact_that_this_host_cannot_rebuild_fails_with_one_line(store, tmp_path):
    runs = tmp_path / "runs.log"
    first = run_graph(diamond(runs), store).results
    _first_blob(store, first[-1].digest).unlink()
    graph = diamond(runs)
    graph.nodes[-1].host = stagekit.Lacking("needs sm90 GPU (this machine: no GPU)")
    ab = run_graph(graph, store).results[-1]
    blob = store.get_manifest(first[-1].digest).entries[0].sha256
    assert (ab.status, ab.reason) == ("failed", f"the stored artifact is damaged (blob {blob} (bin/tool.sh) is missing "
                                                f"from {store.root / 'cas'}) and needs sm90 GPU (this machine: no GPU)")


def test_refs_move_only_once_every_validation_of_the_node_passed(store, tmp_path):
    runs = tmp_path / "runs.log"
    graph = Graph("g", [node("ckpt", WRITE, runs, text="x"), node("ckpt:validate", FAIL, runs, inputs={"c": "ckpt"})])
    graph.nodes[1].kind, graph.nodes[1].serves = "validate", "ckpt"
    ckpt, validation = run_graph(graph, store).results
    assert ckpt.status == "built" and validation.status == "failed"
    assert ckpt.ref == "ckpt:validate failed"
    assert store.read_ref("g", "ckpt") is None and store.read_ref("g", "ckpt:validate") is None
    graph.nodes[1].stage, graph.nodes[1].params = UPPER_INPROCESS, {}
    graph.nodes[1].inputs = {"src": "ckpt"}
    ckpt, validation = run_graph(graph, store).results
    assert (ckpt.status, validation.status, ckpt.ref) == ("cached", "built", None)
    assert store.read_ref("g", "ckpt").digest == ckpt.digest


def validated(text: str = "x", torch_kl: float = 0.01, vllm_kl: float = 0.02, vllm_here: bool = True,
              torch_here: bool = True, vllm_version: str = "1") -> Graph:
    """A checkpoint, its torch validation and its vLLM validation (a runtime's: its host need is vLLM
    on a GPU, which `vllm_here=False` says this host lacks), as graph.GraphBuilder makes them."""
    nodes = [node("ckpt", WRITE, text=text),
             node("ckpt:validate", GATED, inputs={"src": "ckpt"}, kl=torch_kl, runner="torch"),
             node("ckpt:validate-vllm", GATED, inputs={"src": "ckpt"}, kl=vllm_kl, runner="vllm", version=vllm_version)]
    for validation in nodes[1:]:
        validation.serves = "ckpt"
    nodes[2].after = ["ckpt:validate"]
    if not vllm_here:
        nodes[2].host = stagekit.Lacking("needs vllm on a CUDA GPU: this machine has no vllm")
    if not torch_here:
        nodes[1].host = stagekit.Lacking("needs a CUDA GPU (this machine: no GPU)")
    return Graph("g", nodes)


def refs_of(store: LocalStore) -> dict[str, str]:
    return {target: ref.digest for _, target, ref in store.refs()}


def test_a_runtime_validation_this_host_cannot_run_leaves_the_decision_to_torchs_figures(store):
    results = run_graph(validated(vllm_here=False), store).by_id()
    ckpt, torch_validation, vllm_validation = results["ckpt"], results["ckpt:validate"], results["ckpt:validate-vllm"]
    assert (vllm_validation.status, vllm_validation.reason) == ("skipped", "needs vllm on a CUDA GPU: this machine has no vllm")
    assert (ckpt.status, ckpt.ref) == ("built", None)
    assert ckpt.decided_by == [{"validation": "ckpt:validate", "runner": "torch", "device": "cpu"}]
    assert ckpt.as_json()["decided_by"] == ckpt.decided_by
    assert refs_of(store) == {"ckpt": ckpt.digest, "ckpt:validate": torch_validation.digest}


def test_with_require_all_a_runtime_validation_this_host_cannot_run_holds_the_ref_back(store):
    results = run_graph(validated(vllm_here=False), store, RunOptions(require_all=True)).by_id()
    assert results["ckpt:validate-vllm"].status == "failed"
    assert (results["ckpt"].ref, results["ckpt"].decided_by) == ("ckpt:validate-vllm failed", [])
    assert refs_of(store) == {}


def test_a_runtime_validation_that_ran_and_failed_holds_the_ref_back_though_torch_passed(store):
    results = run_graph(validated(vllm_kl=0.5), store).by_id()
    assert results["ckpt:validate"].status == "built"
    assert results["ckpt:validate-vllm"].status == "failed"
    assert results["ckpt:validate-vllm"].reason.startswith("failed its gates: kld_mean 0.5 (limit 0.1); report: ")
    assert (results["ckpt"].ref, results["ckpt"].decided_by) == ("ckpt:validate-vllm failed its gates", [])
    assert refs_of(store) == {}  # nor the validations': they move with their target


def test_when_the_runtime_validation_ran_its_figures_decide_first(store):
    results = run_graph(validated(), store).by_id()
    ckpt = results["ckpt"]
    assert ckpt.ref is None
    assert ckpt.decided_by == [{"validation": "ckpt:validate-vllm", "runner": "vllm", "device": "cpu"},
                               {"validation": "ckpt:validate", "runner": "torch", "device": "cpu"}]
    assert refs_of(store) == {"ckpt": ckpt.digest, "ckpt:validate": results["ckpt:validate"].digest,
                              "ckpt:validate-vllm": results["ckpt:validate-vllm"].digest}


def test_a_node_no_validation_of_which_ran_keeps_its_old_ref(store):
    results = run_graph(validated(vllm_here=False, torch_here=False), store).by_id()
    assert results["ckpt"].status == "built" and results["ckpt:validate"].status == "skipped"
    assert results["ckpt"].ref == "ckpt:validate was skipped"
    graph = validated(vllm_here=False)  # an engine's case: its only validation is the runtime's
    graph.nodes.pop(1)
    graph.nodes[1].after = []
    results = run_graph(graph, store).by_id()
    assert results["ckpt"].ref == "ckpt:validate-vllm was skipped"
    assert refs_of(store) == {}


def test_the_ref_of_a_runtime_validation_of_another_artifact_goes_when_its_target_moves_without_it(store):
    first = run_graph(validated(), store).by_id()  # a host with vLLM
    # vLLM's version changes the key, not the inputs: the validation made elsewhere is of this very artifact
    again = run_graph(validated(vllm_here=False, vllm_version="2"), store).by_id()
    assert again["ckpt:validate-vllm"].status == "skipped" and again["ckpt"].ref is None
    assert refs_of(store)["ckpt:validate-vllm"] == first["ckpt:validate-vllm"].digest
    changed = run_graph(validated(text="y", vllm_here=False), store).by_id()  # another checkpoint
    assert changed["ckpt"].ref is None and changed["ckpt"].digest != first["ckpt"].digest
    assert refs_of(store) == {"ckpt": changed["ckpt"].digest, "ckpt:validate": changed["ckpt:validate"].digest}


def test_two_recipes_with_one_name_cannot_move_each_others_refs(store, tmp_path):
    from trtbuild.errors import InvalidInput

    runs = tmp_path / "runs.log"
    run_graph(diamond(runs), store, RunOptions(recipe_identity="recipes/a.yaml"))
    with pytest.raises(InvalidInput) as caught:
        run_graph(diamond(runs, b_text="other"), store, RunOptions(recipe_identity="copy/a.yaml"))
    assert str(caught.value) == (f"recipe copy/a.yaml: name 'diamond' already belongs to recipes/a.yaml in store "
                                 f"{store.root}; give this recipe another `name:` (or remove "
                                 f"{store.root / 'refs' / 'diamond' / '.recipe.json'} to hand the name over)")
    assert counts(runs)["b"] == 1  # refused before anything ran


@pytest.mark.parametrize("overlay", [stagekit.OVERLAY, stagekit.OVERLAY_ISOLATED], ids=["in-process", "isolated"])
def test_an_overlay_stages_artifact_is_its_inputs_files_plus_what_it_wrote(store, tmp_path, overlay):
    runs = tmp_path / "runs.log"
    graph = Graph("g", [node("a", UPPER_INPROCESS, runs, inputs={"src": "w"}),
                        node("b", overlay, runs, inputs={"base": "a"}, name="extra/note.txt", text="hi")])
    graph.nodes.insert(0, node("w", WRITE, runs, text="alpha"))
    results = {r.id: r for r in run_graph(graph, store).results}
    assert {k: r.status for k, r in results.items()} == dict.fromkeys("wab", "built")
    base, merged = store.get_manifest(results["a"].digest), store.get_manifest(results["b"].digest)
    assert [e.path for e in merged.entries] == ["extra/note.txt", "report.json", "text.txt"]
    assert [e for e in merged.entries if e.path != "extra/note.txt"] == list(base.entries)
    out = materialize(store, results["b"].digest)
    assert ((out / "text.txt").read_text(), (out / "extra/note.txt").read_text()) == ("ALPHA", "hi")
    assert dump_summary(results["b"].summary) == {"chars": 5}  # the input's report (the stage wrote no serving/report.json)
    assert verify(store) == []
    # the files it wrote went in as blobs only: no manifest of extra/ alone that nothing names (issue #23)
    assert set(store.manifest_digests()) == {results[n].digest for n in "wab"}


def test_an_overlay_stage_may_not_replace_a_file_of_its_input(store, tmp_path):
    graph = Graph("g", [node("w", WRITE, None, text="alpha"),
                        node("b", stagekit.OVERLAY, None, inputs={"base": "w"}, name="text.txt", text="other")])
    results = {r.id: r for r in run_graph(graph, store).results}
    base = results["w"].digest
    assert (results["b"].status, results["b"].reason) == (
        "failed", f"the stage wrote text.txt, which its input {base[:16]}... already has; "
                  "an overlay may add files, never replace them")
    assert store.read_ref("g", "b") is None


def test_a_report_its_stage_kinds_summary_refuses_fails_the_stage_and_nothing_is_stored(store, tmp_path):
    """store.summaries types every record's summary: a stage whose report is not its kind's (a field
    missing) fails in one line naming the field, and no record of it is written."""
    graph = Graph("g", [node("v", stagekit.HALF_REPORT, None)])
    result = run_graph(graph, store).results[0]
    assert (result.status, result.reason) == ("failed", "the stage's report is not a validate summary: "
                                                        "metrics.kld_p99: Field required")
    assert store.get_record(result.key) is None


def test_a_stage_is_handed_a_typed_runtime_and_a_key_no_field_names_is_refused():
    """StageContext.runtime is a StageRuntime: what a node's dict or a worker's spec holds, typed (an S3
    source's objects, an engine's build needs), written to the spec and read back the same; a key no
    field names (a typo of `text`) is refused instead of read as missing."""
    from pydantic import ValidationError

    from trtbuild.builder.stages.base import StageContext, StageRuntime

    runtime = StageRuntime.of({"device": "cpu", "image": None, "objects": {"a.bin": {"key": "p/a.bin", "size": 1,
                                                                                      "sha256": "0" * 64}}})
    assert (runtime.device, runtime.image, runtime.objects["a.bin"].key) == ("cpu", None, "p/a.bin")
    assert StageRuntime.of(json.loads(json.dumps(runtime.as_json()))) == runtime
    assert StageContext(out=Path("."), inputs={}, params={}, runtime={"target": "t"}).runtime.target == "t"
    with pytest.raises(ValidationError, match="tekst"):
        StageRuntime.of({"tekst": "builtin"})
