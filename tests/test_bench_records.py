"""Serving measurements as their consumers see them: push and pull carry bench and warm-start records
(with the raw results blobs and cache artifacts they name), gc removes those of the artifacts it
removes, verify names a bad one, ls and report show the figures, and `pull --prefer` ranks by them.

The records are written through the store API with figures written here (the harness's tests
measure a real server); the artifacts are a few small files."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_transfer import make_artifact, three_files
from trtbuild.store.measurements import (BenchRecord, Figures, LoadGenerator, Percentiles, Platform, WarmStartKey,
                                    WarmStartRecord, bench_id)
from trtbuild.recipe.bench import Workload
from trtbuild.store.base import CorruptStore
from trtbuild.store.gc import gc
from trtbuild.store.local import LocalStore
from trtbuild.store.records import Digest
from trtbuild.store.transfer import PushItem, pull, push
from trtbuild.store.verify import repair, verify

H200 = Platform(device="gpu", product="NVIDIA H200", sm="sm90", count=1, driver="570.133.20")
L40S = Platform(device="gpu", product="NVIDIA L40S", sm="sm89", count=1, driver="570.133.20")
CHAT = Workload(name="chat-short", input_len=128, output_len=32, requests=32, concurrency=[1, 8])


def pct(p50: float, p99: float) -> Percentiles:
    return Percentiles(mean=p50, p50=p50, p90=p99, p95=p99, p99=p99)


def put_raw(store: LocalStore, tmp: Path, text: str) -> Digest:
    """A raw-results file stored as a blob, as the harness stores the load generator's output."""
    path = tmp / f"raw-{abs(hash(text))}.jsonl"
    path.write_text(text)
    digest = store.put_file_blob(path)
    path.unlink()
    return digest


def bench(store: LocalStore, tmp: Path, artifact: Digest, target: str, *, tok_s: float, ttft: float,
          e2el: float, concurrency: int = 8, platform: Platform = H200, runtime: str = "vllm",
          created: str = "2026-12-02T10:00:00Z", workload: Workload = CHAT) -> BenchRecord:
    """One measurement of `artifact` with these figures, stored in `store`."""
    digest = workload.digest(concurrency)
    record = BenchRecord(
        id=bench_id(artifact.hash, runtime, "0.26.0", platform, digest), artifact=artifact, target=target,
        recipe="tiny", runtime=runtime, runtime_version="0.26.0", platform=platform, workload=workload.name,
        workload_spec=workload.identity(concurrency), workload_digest=digest,
        figures=Figures(ttft_ms=pct(ttft, ttft * 2), tpot_ms=pct(5.0, 9.0), itl_ms=pct(5.0, 9.0),
                        e2el_ms=pct(e2el, e2el * 1.5), request_throughput=tok_s / 32, output_token_throughput=tok_s,
                        total_token_throughput=tok_s * 5, completed=32, failed=0, input_tokens=4096,
                        output_tokens=1024, duration_s=1024 / tok_s),
        time_to_ready_s=41.5, peak_gpu_memory_mib=1200.0, peak_rss_mib=800.0,
        load_generator=LoadGenerator(name="aiperf", version="0.13.0", command=["aiperf", "profile"]),
        raw=put_raw(store, tmp, f"{target} {concurrency} {platform.product} {tok_s}\n"), created=created,
        host="gpu-host")
    store.put_bench(record)
    return record


def warm(store: LocalStore, tmp: Path, artifact: Digest, n: int = 1) -> WarmStartRecord:
    """A warm-start cache (a small folder stored as an artifact) captured on `artifact`."""
    folder = tmp / f"cache-{n}"
    (folder / "torch_compile_cache").mkdir(parents=True)
    (folder / "torch_compile_cache" / "graph.py").write_text(f"# compiled {n}\n")
    manifest = store.ingest(folder)
    key = WarmStartKey(artifact=artifact.hash, runtime="vllm", runtime_version="0.26.0", torch="2.9.0",
                       triton="3.5.0", flashinfer=None, cuda="12.8", driver="570.133.20", sm="sm90", tp=1, pp=1,
                       serve_options="0" * 64)
    record = WarmStartRecord(key=key, cache=Digest(hash=manifest.digest, size_bytes=manifest.size),
                             cold_ready_s=60.0, warm_ready_s=20.0, created="2026-12-02T10:00:00Z", host="gpu-host")
    store.put_warmstart(record)
    return record


@pytest.fixture
def stores(tmp_path):
    local, remote = LocalStore(tmp_path / "local"), LocalStore(tmp_path / "remote")
    local.create()
    return local, remote


def blob_bytes(store: LocalStore, digest: str) -> bytes:
    with store.open_blob(digest) as f:
        return f.read()


def test_push_carries_the_records_and_what_they_name_and_pull_brings_them_back_exactly(stores, tmp_path):
    local, remote = stores
    record = make_artifact(local, tmp_path / "a", three_files("a"), "base-hf", 1)
    artifact = Digest(hash=record.digest, size_bytes=record.size)
    measured = [bench(local, tmp_path, artifact, "base-hf", tok_s=900.0, ttft=20.0, e2el=300.0),
                bench(local, tmp_path, artifact, "base-hf", tok_s=150.0, ttft=10.0, e2el=180.0, concurrency=1)]
    cache = warm(local, tmp_path, artifact)
    push(local, remote, [PushItem(record, ("tiny", "base-hf"))])
    assert remote.bench_records(record.digest) == sorted(measured, key=lambda r: (r.created, r.id))
    assert remote.warmstart_records(record.digest) == [cache]
    assert [blob_bytes(remote, r.raw.hash) for r in measured] == [blob_bytes(local, r.raw.hash) for r in measured]
    assert remote.get_manifest(cache.cache.hash) == local.get_manifest(cache.cache.hash)
    assert remote.artifact_problem(cache.cache.hash) is None

    fresh = LocalStore(tmp_path / "fresh")
    fresh.create()
    pull(remote, fresh, record.key)  # a plain pull: the measurements, not the caches (tens of MB each)
    assert fresh.bench_records(record.digest) == remote.bench_records(record.digest)
    assert fresh.warmstart_records(record.digest) == [] and not fresh.has_manifest(cache.cache.hash)
    assert verify(fresh) == []
    pull(remote, fresh, record.key, warm_start=True)
    assert fresh.warmstart_records(record.digest) == [cache]
    assert [blob_bytes(fresh, r.raw.hash) for r in measured] == [blob_bytes(local, r.raw.hash) for r in measured]
    assert fresh.artifact_problem(cache.cache.hash) is None
    assert verify(fresh) == []


def test_a_record_whose_raw_blob_is_missing_stops_the_push_naming_the_record(stores, tmp_path):
    local, remote = stores
    record = make_artifact(local, tmp_path / "a", three_files("a"), "base-hf", 1)
    measured = bench(local, tmp_path, Digest(hash=record.digest, size_bytes=record.size), "base-hf", tok_s=900.0,
                     ttft=20.0, e2el=300.0)
    local.remove_blob(measured.raw.hash)
    where = local.describe_bench(record.digest, measured.id)
    with pytest.raises(CorruptStore) as caught:
        push(local, remote, [PushItem(record, ("tiny", "base-hf"))])
    assert str(caught.value) == (f"bench record {where}: names raw results blob {measured.raw.hash}, which "
                                 f"{local.location} lacks; run `trtbuild bench` again")
    assert remote.bench_records() == []


def test_a_later_run_replaces_an_earlier_one_and_an_earlier_one_never_a_later(stores, tmp_path):
    local, remote = stores
    record = make_artifact(local, tmp_path / "a", three_files("a"), "base-hf", 1)
    artifact = Digest(hash=record.digest, size_bytes=record.size)
    older = bench(remote, tmp_path, artifact, "base-hf", tok_s=100.0, ttft=20.0, e2el=300.0,
                  created="2026-12-01T10:00:00Z")
    newer = bench(local, tmp_path, artifact, "base-hf", tok_s=900.0, ttft=20.0, e2el=300.0)
    assert older.id == newer.id
    push(local, remote, [PushItem(record, ("tiny", "base-hf"))])
    assert remote.bench_records(record.digest) == [newer]
    local.put_bench(older)  # the local store's is now the older run: a pull brings the newer one back
    pull(remote, local, record.key)
    assert local.bench_records(record.digest) == [newer]


def test_gc_removes_the_records_of_the_artifacts_it_removes_and_keeps_what_kept_ones_name(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.create()
    kept = make_artifact(store, tmp_path / "a", three_files("a"), "base-hf", 1)
    gone = make_artifact(store, tmp_path / "b", three_files("b"), "fp8-hf", 2)
    store.update_ref("tiny", "base-hf", kept.digest, kept.key)
    kept_bench = bench(store, tmp_path, Digest(hash=kept.digest, size_bytes=kept.size), "base-hf", tok_s=900.0,
                       ttft=20.0, e2el=300.0)
    kept_warm = warm(store, tmp_path, Digest(hash=kept.digest, size_bytes=kept.size), 1)
    gone_bench = bench(store, tmp_path, Digest(hash=gone.digest, size_bytes=gone.size), "fp8-hf", tok_s=1200.0,
                       ttft=15.0, e2el=250.0)
    gone_warm = warm(store, tmp_path, Digest(hash=gone.digest, size_bytes=gone.size), 2)

    report = gc(store, set(), keep_last=1)
    assert report.records == [gone.key]
    assert report.measurements == 2
    assert store.bench_records() == [kept_bench]
    assert store.warmstart_records() == [kept_warm]
    assert store.has_blob(kept_bench.raw.hash) and not store.has_blob(gone_bench.raw.hash)
    assert store.artifact_problem(kept_warm.cache.hash) is None
    assert not store.has_manifest(gone_warm.cache.hash)
    assert verify(store) == []


def test_verify_names_a_malformed_record_and_one_whose_raw_blob_is_missing_and_repair_drops_them(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.create()
    record = make_artifact(store, tmp_path / "a", three_files("a"), "base-hf", 1)
    artifact = Digest(hash=record.digest, size_bytes=record.size)
    lost = bench(store, tmp_path, artifact, "base-hf", tok_s=900.0, ttft=20.0, e2el=300.0)
    store.remove_blob(lost.raw.hash)
    broken = warm(store, tmp_path, artifact)
    broken_file = tmp_path / "store" / "warmstart" / record.digest / f"{broken.key.digest()}.json"
    broken_file.write_text('{"schema": 1, "key": "nope"}\n')
    lost_file = tmp_path / "store" / "bench" / record.digest / f"{lost.id}.json"

    problems = verify(store)
    assert problems == [
        f"{lost_file}: names raw results blob {lost.raw.hash}, which is missing",
        f"warm-start record {broken_file} is malformed (key: Input should be an object); run `trtbuild cache verify --repair`",
    ]
    _, done = repair(store)
    assert done == [
        f"dropped bench record {lost_file} (names raw results blob {lost.raw.hash}, which is missing): "
        "`trtbuild bench` measures it again",
        f"dropped warm-start record {broken_file} (malformed): `trtbuild bench --capture-warm-start` captures it again",
    ]
    assert verify(store) == [] and store.bench_records() == [] and store.warmstart_records() == []


# ---- pull --prefer: measured figures on this host's product, else the rule -------------------------

def _digest(n: int) -> str:
    return f"{n:064x}"


def _lock(stage: str, names: list[str]):
    """A lock of validated targets `names` (each a 2 GiB artifact of `stage`)."""
    from trtbuild.lock.lockfile import LockedRecipe, LockedTarget, LockFile

    targets = {name: LockedTarget(stage=stage, key=_digest(i + 1), digest=_digest(1000 + i), size=2 * 1024 ** 3)
               for i, name in enumerate(names)}
    checks = {f"{tid}:validate": LockedTarget(stage="validate", key=_digest(500 + i), digest=_digest(600 + i), size=1,
                                              gates_passed=True) for i, tid in enumerate(names)}
    return LockFile(recipe=LockedRecipe(name="tiny", digest=_digest(0)), source=None, toolchain={},
                    targets={**targets, **checks}, validation="run")


FORMATS = {"base-hf": (None, None), "fp8-hf": ("fp8", None)}


def h200_host():
    from trtbuild.deploy.select import Host
    from trtbuild.host.hardware import DetectedGpu

    return Host(gpus=(DetectedGpu(0, "NVIDIA H200", "sm90", 141 * 1024 ** 3),), tensorrt_llm=None, tensorrt=None,
                runtimes={"vllm": "0.33.0"}, cpu="AMD EPYC 9654 96-Core Processor")


def measured_store(tmp_path, platform: Platform = H200) -> tuple[LocalStore, list[str]]:
    """A store with figures for base-hf and fp8-hf on `platform`: fp8 has the higher throughput at
    concurrency 8, base the lower end-to-end latency at concurrency 1. Returns it and the digests asked."""
    store = LocalStore(tmp_path / "shared")
    store.create()
    lock = _lock("hf-checkpoint", ["base-hf", "fp8-hf"])
    base = Digest(hash=lock.targets["base-hf"].digest, size_bytes=2 * 1024 ** 3)
    fp8 = Digest(hash=lock.targets["fp8-hf"].digest, size_bytes=2 * 1024 ** 3)
    bench(store, tmp_path, base, "base-hf", tok_s=640.0, ttft=30.0, e2el=400.0, platform=platform)
    bench(store, tmp_path, fp8, "fp8-hf", tok_s=910.0, ttft=25.0, e2el=350.0, platform=platform)
    bench(store, tmp_path, base, "base-hf", tok_s=120.0, ttft=12.0, e2el=180.0, concurrency=1, platform=platform)
    bench(store, tmp_path, fp8, "fp8-hf", tok_s=115.0, ttft=11.0, e2el=190.0, concurrency=1, platform=platform)
    return store, []


def choose_with(store: LocalStore, asked: list[str], prefer: str, host=None, stage: str = "hf-checkpoint",
                names=("base-hf", "fp8-hf")):
    from trtbuild.deploy.select import choose

    def measurements(digest: str) -> list:
        asked.append(digest)
        return store.bench_records(digest)

    return choose(_lock(stage, list(names)), host or h200_host(), prefer=prefer,
                  formats=lambda tid, _: FORMATS.get(tid), variant_order=["base", "fp8"], measurements=measurements)


def test_prefer_throughput_and_latency_choose_different_targets_by_the_measured_figures(tmp_path):
    store, asked = measured_store(tmp_path)
    fast = choose_with(store, asked, "throughput")
    assert (fast.chosen.target, fast.chosen_by) == ("fp8-hf", "measured")
    assert fast.note == ("chose fp8-hf by measured figures: fp8-hf 910 output tok/s; base-hf 640 output tok/s "
                         "(chat-short, concurrency 8, NVIDIA H200)")
    assert fast.chosen_by_json() == {"by": "measured", "workload": "chat-short", "concurrency": 8,
                                     "product": "NVIDIA H200", "figures": [
                                         {"target": "fp8-hf", "output_tok_s": 910.0, "ttft_p50_ms": 25.0,
                                          "e2el_p50_ms": 350.0},
                                         {"target": "base-hf", "output_tok_s": 640.0, "ttft_p50_ms": 30.0,
                                          "e2el_p50_ms": 400.0}]}
    assert asked == [_digest(1000), _digest(1001)]  # one listing per candidate
    quick = choose_with(store, [], "latency")
    assert (quick.chosen.target, quick.chosen_by) == ("base-hf", "measured")
    assert quick.note == ("chose base-hf by measured figures: base-hf E2EL p50 180 ms, TTFT p50 12 ms; fp8-hf E2EL "
                          "p50 190 ms, TTFT p50 11 ms (chat-short, concurrency 1, NVIDIA H200)")


def test_without_figures_the_rule_chooses_and_says_so(tmp_path):
    store = LocalStore(tmp_path / "empty")
    store.create()
    selection = choose_with(store, [], "throughput")
    assert (selection.chosen.target, selection.chosen_by) == ("base-hf", "rule")
    assert selection.note == ("no measured figures for NVIDIA H200; chose by the rule (fewest GPUs, then the "
                              "recipe's variant order): base-hf")
    assert selection.chosen_by_json() == {"by": "rule", "workload": None, "concurrency": None, "product": None,
                                          "figures": []}


def test_figures_of_another_gpu_product_are_not_used(tmp_path):
    store, asked = measured_store(tmp_path, platform=L40S)
    selection = choose_with(store, asked, "throughput")
    assert (selection.chosen.target, selection.chosen_by) == ("base-hf", "rule")
    assert selection.note.startswith("no measured figures for NVIDIA H200; ")


def test_a_cpu_only_host_ranks_gguf_targets_by_its_cpu_models_figures(tmp_path):
    from trtbuild.deploy.select import Host

    cpu = Platform(device="cpu", product="AMD EPYC 9654 96-Core Processor", count=0)
    store = LocalStore(tmp_path / "shared")
    store.create()
    lock = _lock("gguf", ["q8-gguf", "q4-gguf"])
    for name, tok_s in (("q8-gguf", 40.0), ("q4-gguf", 55.0)):
        bench(store, tmp_path, Digest(hash=lock.targets[name].digest, size_bytes=1), name, tok_s=tok_s, ttft=90.0,
              e2el=900.0, platform=cpu, runtime="llamacpp")
    host = Host(gpus=(), tensorrt_llm=None, tensorrt=None, llama_cpp_python="0.3.16",
                cpu="AMD EPYC 9654 96-Core Processor")
    selection = choose_with(store, [], "throughput", host=host, stage="gguf", names=("q8-gguf", "q4-gguf"))
    assert (selection.chosen.target, selection.chosen_by) == ("q4-gguf", "measured")
    assert selection.note == ("chose q4-gguf by measured figures: q4-gguf 55 output tok/s; q8-gguf 40 output tok/s "
                              "(chat-short, concurrency 8, AMD EPYC 9654 96-Core Processor)")
    other = Host(gpus=(), tensorrt_llm=None, tensorrt=None, llama_cpp_python="0.3.16", cpu="Intel Xeon")
    fallback = choose_with(store, [], "throughput", host=other, stage="gguf", names=("q8-gguf", "q4-gguf"))
    assert (fallback.chosen.target, fallback.note) == (
        "q8-gguf", "no measured figures for Intel Xeon; chose by the rule (the recipe's variant order): q8-gguf")


# ---- ls: the figures per target -------------------------------------------------------------------

def test_ls_shows_each_targets_best_measured_figures_and_json_every_record(tmp_path):
    import datetime as dt

    from trtbuild.deploy.listing import Listing, list_published, table_lines

    store = LocalStore(tmp_path / "shared")
    store.create()
    base = make_artifact(store, tmp_path / "a", three_files("a"), "base-hf", 1, stage="hf-checkpoint")
    fp8 = make_artifact(store, tmp_path / "b", three_files("b"), "fp8-hf", 2, stage="hf-checkpoint")
    for record in (base, fp8):
        store.update_ref("tiny", record.target, record.digest, record.key)
    artifact = Digest(hash=base.digest, size_bytes=base.size)
    bench(store, tmp_path, artifact, "base-hf", tok_s=640.5, ttft=30.0, e2el=400.0)  # e2el p99 600
    bench(store, tmp_path, artifact, "base-hf", tok_s=120.25, ttft=12.0, e2el=180.0, concurrency=1)  # p99 270
    bench(store, tmp_path, artifact, "base-hf", tok_s=300.0, ttft=20.0, e2el=150.0, platform=L40S)  # p99 225
    published = list_published(store)
    now = dt.datetime(2026, 12, 3, tzinfo=dt.timezone.utc)
    lines = table_lines(published, now)
    serving = lines[0].index("SERVING (MEASURED)")
    assert lines[1][serving:].startswith(
        "640.5 tok/s (vllm, NVIDIA H200, chat-short@8); TTFT p50 12.0 ms (vllm, NVIDIA H200, chat-short@1); "
        "E2EL p99 225.0 ms (vllm, NVIDIA L40S, chat-short@8)  ")
    assert lines[2][serving:].startswith("-  ")
    listed = Listing(store.location, None, published, now=now).as_json()["published"]
    assert [len(p["measurements"]) for p in listed] == [3, 0]
    assert [m for m in listed[0]["measurements"] if m["concurrency"] == 1] == [{
        "runtime": "vllm", "runtime_version": "0.26.0", "device": "gpu", "product": "NVIDIA H200", "sm": "sm90",
        "gpus": 1, "workload": "chat-short", "concurrency": 1, "output_tok_s": 120.25, "request_throughput": 120.25 / 32,
        "ttft_p50_ms": 12.0, "tpot_p50_ms": 5.0, "e2el_p50_ms": 180.0, "e2el_p99_ms": 270.0, "time_to_ready_s": 41.5,
        "created": "2026-12-02T10:00:00Z", "host": "gpu-host", "standin": []}]


# ---- report: the serving section -----------------------------------------------------------------

def test_report_writes_the_serving_section_with_a_table_per_load_and_a_pareto_plot_per_product(tmp_path):
    from trtbuild.report.collect import ReportRow
    from trtbuild.report.html import render_report
    from trtbuild.report.serving import pareto, plot_file, serving_rows

    store = LocalStore(tmp_path / "store")
    store.create()
    digests = {"base-hf": _digest(1000), "fp8-hf": _digest(1001), "awq-hf": _digest(1002)}
    rows = [ReportRow(target="base-hf", kind="hf-checkpoint", variant="base", status="built", kld_mean=0.0,
                      top1_agreement=1.0),
            ReportRow(target="fp8-hf", kind="hf-checkpoint", variant="fp8", status="built", kld_mean=0.0125,
                      top1_agreement=0.975),
            ReportRow(target="awq-hf", kind="hf-checkpoint", variant="awq", status="built", kld_mean=0.05,
                      top1_agreement=0.9)]
    for target, tok_s in (("base-hf", 640.0), ("fp8-hf", 910.0), ("awq-hf", 850.0)):
        bench(store, tmp_path, Digest(hash=digests[target], size_bytes=1), target, tok_s=tok_s, ttft=30.0, e2el=400.0)
    serving = serving_rows(rows, digests, store)
    assert [(r.target, r.output_tok_s) for r in serving] == [("fp8-hf", 910.0), ("awq-hf", 850.0), ("base-hf", 640.0)]
    assert pareto(serving) == {0, 2}  # awq is beaten by fp8 on both axes

    out = tmp_path / "out"
    html_path, _ = render_report("tiny", rows, out, serving)
    page = html_path.read_text()
    assert "<h2>Serving measurements</h2>" in page
    assert "<h3>NVIDIA H200, chat-short@8</h3>" in page
    assert ("<tr><td>fp8</td><td><code>fp8-hf</code></td><td>vllm</td><td>0.0125</td><td>97.5%</td><td>910.0</td>"
            "<td>30.0</td><td>600.0</td><td>yes</td></tr>") in page
    assert ("<tr><td>awq</td><td><code>awq-hf</code></td><td>vllm</td><td>0.05</td><td>90.0%</td><td>850.0</td>"
            "<td>30.0</td><td>600.0</td><td></td></tr>") in page
    plot = out / plot_file("NVIDIA H200", "chat-short")
    assert plot.name == "serving-nvidia-h200-chat-short.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f'<img src="{plot.name}"' in page

    bare = tmp_path / "bare"
    render_report("tiny", rows, bare, [])
    assert "Serving measurements" not in (bare / "report.html").read_text()
    assert sorted(p.name for p in bare.iterdir()) == ["report.html", "report.png"]
