"""`trtbuild bench` against a real server on the CPU: the demo's q8_0-gguf on llama-cpp-python's
server (its packaged command), driven by the real aiperf. Two measurements (one workload at two
concurrency levels), the records and raw results in the store, no server left behind; a server that
does not start and a Ctrl-C leave nothing either."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import BENCH_MARK, BENCH_WORKLOADS, private_store, processes_marked
from trtbuild import interrupt
from trtbuild.store.measurements import Platform, bench_id
from trtbuild.recipe.bench import Workload
from trtbuild.host.toolchain import package_version
from trtbuild.store.local import LocalStore

RECIPE = "smollm2-135m-demo"
TARGET = "q8_0-gguf"
# what BENCH_WORKLOADS says, written out: the spec the records must carry
SPEC = {"dataset": "synthetic", "input_len": 16, "output_len": 4, "spread": 0.0, "requests": 4, "seed": 0}


def cpu_model() -> str:
    return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name"))


def test_bench_records_each_concurrency_level_of_the_workload_exactly(demo_bench):
    store_path, _, output, left = demo_bench
    store = LocalStore(store_path)
    digest = store.read_ref(RECIPE, TARGET).digest
    assert output["schema"] == 1
    records = output["records"]
    assert [r["workload_spec"] for r in records] == [{**SPEC, "concurrency": 1}, {**SPEC, "concurrency": 2}]
    platform = Platform(device="cpu", product=cpu_model(), sm=None, count=0, driver=None)
    version = package_version("llama_cpp")
    for record, concurrency in zip(records, (1, 2)):
        workload = Workload(name="tiny", input_len=16, output_len=4, requests=4, concurrency=[1, 2])
        assert record["id"] == bench_id(digest, "llamacpp", version, platform, workload.digest(concurrency))
        assert (record["artifact"]["hash"], record["target"], record["recipe"]) == (digest, TARGET, RECIPE)
        assert (record["runtime"], record["runtime_version"], record["workload"]) == ("llamacpp", version, "tiny")
        assert record["platform"] == platform.model_dump(mode="json")
        figures = record["figures"]
        # exact lengths: every end-of-generation token is biased away, so each answer is 4 tokens
        assert (figures["completed"], figures["failed"]) == (4, 0)
        assert (figures["input_tokens"], figures["output_tokens"]) == (4 * 16, 4 * 4)
        assert (record["load_generator"]["name"], record["load_generator"]["version"]) == ("aiperf",
                                                                                          package_version("aiperf"))
        assert record["peak_gpu_memory_mib"] is None and record["peak_rss_mib"] > 0
        assert record["standin"] == []
        raw = store.blob_path(record["raw"]["hash"])
        assert raw.stat().st_size == record["raw"]["size_bytes"]
        assert len(raw.read_text().splitlines()) == 4
    stored = {r.id: r.model_dump(mode="json", by_alias=True) for r in store.bench_records(digest)}
    assert stored == {r["id"]: r for r in records}
    assert left == []  # the server's whole group (and aiperf's workers) ended with the run


def test_the_figures_are_aiperfs_summary_of_its_own_per_request_records(demo_bench):
    """The summary figures the record holds are what aiperf's raw per-request records (the blob)
    give: the parser read the right metrics (TTFT, aiperf's inter_token_latency as TPOT, request
    latency as E2EL), not others."""
    store_path, _, output, _ = demo_bench
    store = LocalStore(store_path)
    for record in output["records"]:
        lines = [json.loads(line) for line in store.blob_path(record["raw"]["hash"]).read_text().splitlines()]
        metric = lambda name: [line["metrics"][name]["value"] for line in lines]  # noqa: E731
        figures = record["figures"]
        assert figures["ttft_ms"]["mean"] == pytest.approx(statistics.fmean(metric("time_to_first_token")), rel=1e-12)
        assert figures["ttft_ms"]["p50"] == pytest.approx(statistics.median(metric("time_to_first_token")), rel=1e-12)
        assert figures["e2el_ms"]["p50"] == pytest.approx(statistics.median(metric("request_latency")), rel=1e-12)
        assert figures["tpot_ms"]["mean"] == pytest.approx(statistics.fmean(metric("inter_token_latency")), rel=1e-12)
        assert sum(metric("output_sequence_length")) == figures["output_tokens"]
        assert sum(metric("input_sequence_length")) == figures["input_tokens"]


def _bench(store: Path, workloads: Path, env: dict, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trtbuild", "bench", "--target", TARGET, "--workloads",
                             str(workloads)], env={**env, "TRTBUILD_CACHE": str(store)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def _gone(mark: str, within_s: float = 10.0) -> list[int]:
    """The marked processes still there after up to `within_s` (aiperf's workers end on their own)."""
    deadline = time.monotonic() + within_s
    while (left := processes_marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_a_server_that_does_not_start_is_one_line_exit_1_and_leaves_nothing(demo_gguf, tmp_path):
    store = private_store(demo_gguf[0], tmp_path / "store")
    workloads = tmp_path / "workloads.yaml"
    workloads.write_text(BENCH_WORKLOADS)
    # llama-cpp-python's server reads its settings from the environment too: one it cannot parse stops it
    env = {**demo_gguf[1], "N_THREADS": "bogus", BENCH_MARK: "failed-start"}
    process = _bench(store, workloads, env)
    stdout, stderr = process.communicate(timeout=300)
    lines = [line for line in stderr.splitlines() if not line.startswith(("starting ", "llamacpp ready"))]
    assert process.returncode == 1
    assert len(lines) == 1 and lines[0].startswith(f"llamacpp server for {TARGET} (")
    assert "exited with 1 before it was ready: 1 validation error for ModelSettings | n_threads" in lines[0]
    assert stdout == ""
    assert _gone("failed-start") == []
    assert LocalStore(store).bench_records() == []


def test_ctrl_c_while_it_measures_exits_130_and_leaves_no_server_and_no_record(demo_gguf, tmp_path):
    store = private_store(demo_gguf[0], tmp_path / "store")
    workloads = tmp_path / "workloads.yaml"
    workloads.write_text(BENCH_WORKLOADS)
    env = {**demo_gguf[1], BENCH_MARK: "interrupted"}
    # a group of its own, as a terminal's job, with SIGINT as a terminal leaves it: a test session started
    # in a script's background (`cmd &`) runs with SIGINT ignored, and the command rightly keeps that
    process = _bench(store, workloads, env, start_new_session=True,
                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    for line in process.stderr:  # the server is up once the first run starts
        seen.append(line.rstrip("\n"))
        if line.startswith(f"{TARGET}: tiny at concurrency 1"):
            break
    assert seen[-1].startswith(f"{TARGET}: tiny at concurrency 1"), seen
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground group
    rest = process.stderr.read()
    process.wait(timeout=60)
    assert process.returncode == interrupt.EXIT
    assert rest.splitlines()[-1] == interrupt.LINE
    assert _gone("interrupted") == []
    assert LocalStore(store).bench_records() == []


def test_a_deploy_host_measures_by_the_lock_it_pulled_by(demo_gguf, tmp_path):
    """A deploy host has the lock and the pulled artifacts, not the recipe's source: bench by the lock
    measures the artifact the lock names, under the lock's recipe name."""
    from trtbuild.lock import lockfile

    store = private_store(demo_gguf[0], tmp_path / "store")
    lock_path = store / f"{RECIPE}.lock"
    digest = lockfile.read(lock_path).targets[TARGET].digest
    workloads = tmp_path / "workloads.yaml"
    workloads.write_text("workloads:\n  - {name: one, input_len: 8, output_len: 2, requests: 2, concurrency: [1]}\n")
    # the run's temporary folder, which it must leave as it found it (aiperf's dataset files included);
    # short, as aiperf's IPC socket paths under it must be (a UNIX socket path holds 107 bytes)
    scratch = Path(tempfile.mkdtemp(prefix="tb-"))
    env = {**demo_gguf[1], "TRTBUILD_CACHE": str(store), BENCH_MARK: "by-lock", "TMPDIR": str(scratch)}
    try:
        done = subprocess.run([sys.executable, "-m", "trtbuild", "bench", str(lock_path), "--target", TARGET,
                               "--workloads", str(workloads), "--json"], capture_output=True, text=True, env=env,
                              timeout=300)
        left_in_tmp = sorted(p.name for p in scratch.iterdir())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    [record] = json.loads(done.stdout)["records"]
    assert (record["artifact"]["hash"], record["recipe"], record["target"]) == (digest, RECIPE, TARGET)
    assert (record["figures"]["completed"], record["figures"]["output_tokens"]) == (2, 4)
    assert _gone("by-lock") == []
    assert left_in_tmp == []


def test_by_a_lock_whose_artifact_the_local_store_lacks_it_says_pull_it_first(demo_gguf, tmp_path):
    lock_path = demo_gguf[0] / f"{RECIPE}.lock"
    env = {**demo_gguf[1], "TRTBUILD_CACHE": str(tmp_path / "empty")}
    done = subprocess.run([sys.executable, "-m", "trtbuild", "bench", str(lock_path), "--target", TARGET],
                          capture_output=True, text=True, env=env, timeout=120)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (f"{TARGET}: not in the local store {tmp_path / 'empty'}; pull it first "
                           f"(`trtbuild pull {lock_path} --target {TARGET}`)\n")
    assert not (tmp_path / "empty").exists()


NO_MODELS_SERVER = r"""
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"object": "list"}')
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Answer).serve_forever()
"""


def test_a_server_whose_model_list_names_no_model_is_one_line_and_is_stopped(tmp_path):
    """An OpenAI-compatible server answers GET /v1/models with the models it serves; one that answers
    without any cannot be asked for one: one line, and its process group ends."""
    from trtbuild.bench.server import RuntimeServer, ServerSpec, group_alive
    from trtbuild.errors import TrtbuildError

    spec = ServerSpec("vllm", "base-hf (0123456789ab)", tmp_path, (sys.executable, "-c", NO_MODELS_SERVER), 0, {})
    server = RuntimeServer(spec, 60)
    with pytest.raises(TrtbuildError) as caught:
        server.__enter__()
    assert str(caught.value) == ("vllm server for base-hf (0123456789ab): GET /v1/models answered without a model "
                                 "(an OpenAI list of models is expected): b'{\"object\": \"list\"}'")
    assert not group_alive(server.pid)
