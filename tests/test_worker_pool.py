"""The shared worker (worker_pool.py): the stages that share it run one after another in one process,
each with its own log, figures and failure; a crash costs one stage, not the build."""

from __future__ import annotations

import os
from pathlib import Path

from stagekit import (COUNTING, HOLD, SHARED_DIE, SHARED_FAIL, SHARED_HOLD, SHARED_STDIN, SHARED_UPPER, SHARED_WRITE,
                      WRITE, node)
from stage_fixtures import stage_modules_importable, store  # noqa: F401 (fixtures)
from trtbuild.builder import worker_pool
from trtbuild.builder.graph import Graph
from trtbuild.builder.runner import run_graph


def pids(runs: Path) -> dict[str, int]:
    return {name: int(pid) for name, pid in (line.split() for line in runs.read_text().splitlines())}


def test_stages_that_share_a_worker_run_in_one_process_and_others_in_their_own(store, tmp_path):
    runs = tmp_path / "runs.log"
    graph = Graph("g", [node("a", SHARED_WRITE, runs, text="alpha"), node("A", SHARED_UPPER, runs, inputs={"src": "a"}),
                        node("own", WRITE, runs, text="own"), node("b", SHARED_WRITE, runs, text="beta")])
    results = run_graph(graph, store).results
    assert [r.status for r in results] == ["built"] * 4
    seen = pids(runs)
    assert seen["a"] == seen["A"] == seen["b"]  # the release before `own` left the worker serving
    assert len({seen["a"], seen["own"], os.getpid()}) == 3


def test_each_stage_keeps_its_own_log_and_peak_memory(store, tmp_path):
    runs = tmp_path / "runs.log"
    graph = Graph("g", [node("large", SHARED_HOLD, runs, mib=300), node("small", SHARED_HOLD, runs, mib=1)])
    large, small = run_graph(graph, store).results
    records = {r.id: store.get_record(r.key) for r in (large, small)}
    for name, record in records.items():
        log = store.blob_path(record.execution.logs["hold.log"].hash).read_text()
        assert log == f"hold_memory {name}\n"
    assert records["large"].execution.figures["pid"] == records["small"].execution.figures["pid"]
    # the peak starts over for each stage: the second one's is not the first one's 300 MiB
    assert records["large"].execution.peak_rss_mib > 300
    assert records["small"].execution.peak_rss_mib < records["large"].execution.peak_rss_mib - 250


def test_a_stage_leaves_no_cyclic_garbage_to_the_next(store, tmp_path):
    """What a stage leaves in reference cycles is collected when the stage ends, not when the
    collector next visits it: the copies of a quantized model that the exports and validation make
    end as such garbage (validation's float32 copy of a 4 GB model, 6.8 GB), which weighed on the
    stages after them."""
    runs = tmp_path / "runs.log"
    graph = Graph("g", [node("large", SHARED_HOLD, runs, mib=300, cycle=True), node("small", SHARED_HOLD, runs, mib=1)])
    large, small = run_graph(graph, store).results
    records = {r.id: store.get_record(r.key) for r in (large, small)}
    assert records["large"].execution.figures["pid"] == records["small"].execution.figures["pid"]
    assert records["large"].execution.peak_rss_mib > 300
    assert records["small"].execution.peak_rss_mib < records["large"].execution.peak_rss_mib - 250


def test_a_failed_stage_fails_alone_and_the_worker_serves_the_next(store, tmp_path):
    runs = tmp_path / "runs.log"
    graph = Graph("g", [node("bad", SHARED_FAIL, runs), node("next", SHARED_WRITE, runs, text="x")])
    bad, after = run_graph(graph, store).results
    assert bad.status == "failed" and bad.reason.startswith("ValueError: the input is not what this stage expects second line")
    assert after.status == "built"
    seen = pids(runs)
    assert seen["bad"] == seen["next"]


def test_a_stage_that_kills_the_worker_fails_and_a_new_worker_runs_the_next(store, tmp_path):
    runs = tmp_path / "runs.log"
    graph = Graph("g", [node("oom", SHARED_DIE, runs), node("next", SHARED_WRITE, runs, text="x")])
    died, after = run_graph(graph, store).results
    assert died.status == "failed" and died.reason.startswith("stage process killed by SIGKILL (out of memory?)")
    assert after.status == "built"
    seen = pids(runs)
    assert seen["oom"] != seen["next"]
    assert not list((store.root / "tmp").iterdir())


def test_progress_lines_of_a_shared_stage_reach_the_reporter(store, tmp_path):
    steps = []

    class Reporter:  # records the progress steps
        def started(self, node, what):
            return self

        def advance(self, nbytes):
            pass

        def step(self, done, total, label):
            steps.append((done, total, label))

        def finished(self, result):
            pass

        def notice(self, line):
            pass

    shared_counting = type(COUNTING)(COUNTING.name, COUNTING.version, COUNTING.entry, shares_worker=True)
    result, = run_graph(Graph("g", [node("c", shared_counting, steps=3)]), store, reporter=Reporter()).results
    assert result.status == "built"
    assert steps == [(1, 3, "batches"), (2, 3, "batches"), (3, 3, "batches")]


def test_a_build_served_from_the_store_starts_no_stage_process(store, tmp_path, monkeypatch):
    runs = tmp_path / "runs.log"

    def graph():
        return Graph("g", [node("a", SHARED_WRITE, runs, text="alpha"), node("own", HOLD, runs, mib=1),
                           node("A", SHARED_UPPER, runs, inputs={"src": "a"})])

    assert [r.status for r in run_graph(graph(), store).results] == ["built"] * 3

    def no_process(*args, **kwargs):
        raise AssertionError(f"a stage process was started: {args[0]}")

    monkeypatch.setattr(worker_pool.subprocess, "Popen", no_process)
    assert [r.status for r in run_graph(graph(), store).results] == ["cached"] * 3


def test_a_shared_stage_reads_nothing_of_the_workers_requests(store, tmp_path):
    """The requests reach the worker on a descriptor of its own: a stage (or its child) reading
    its standard input sees an empty one, as in a process of its own, and the next stage still runs."""
    from trtbuild.store.checkout import materialize

    runs = tmp_path / "runs.log"
    graph = Graph("g", [node("in", SHARED_STDIN), node("next", SHARED_WRITE, runs, text="x")])
    first, after = run_graph(graph, store).results
    assert (first.status, after.status) == ("built", "built")
    assert (materialize(store, first.digest) / "stdin.txt").read_text() == "own='' child=''"


def test_a_worker_that_cannot_start_fails_the_stage_with_its_own_words(store, tmp_path, monkeypatch):
    """A broken install: the worker's own error is the failed stage's log tail."""
    import sys

    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named trtbuild' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(broken))
    result, = run_graph(Graph("g", [node("a", SHARED_WRITE, text="x")]), store).results
    assert (result.status, result.log_tail) == ("failed", ["ModuleNotFoundError: No module named trtbuild"])
    assert result.reason.startswith("stage process exited with status 1 (log: ")


def test_a_worker_gone_before_its_first_request_fails_the_stage_not_the_build(store, tmp_path, monkeypatch):
    """The worker may exit before the request is written (a broken install is quick): the write's
    broken pipe is that stage's failure with the worker's words, and the next stage still runs."""
    import sys

    from trtbuild.builder.worker_pool import WorkerPool

    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named trtbuild' >&2\nexit 1\n")
    broken.chmod(0o755)
    start = WorkerPool._worker

    def started_and_gone(self, log):
        proc = start(self, log)
        proc.wait()  # the race's losing order, every time
        return proc

    monkeypatch.setattr(WorkerPool, "_worker", started_and_gone)
    monkeypatch.setattr(sys, "executable", str(broken))
    graph = Graph("g", [node("a", SHARED_WRITE, text="x"), node("b", SHARED_WRITE, text="y")])
    first, second = run_graph(graph, store).results
    assert (first.status, first.log_tail) == ("failed", ["ModuleNotFoundError: No module named trtbuild"])
    assert first.reason.startswith("stage process exited with status 1 (log: ")
    assert (second.status, second.log_tail) == ("failed", ["ModuleNotFoundError: No module named trtbuild"])
