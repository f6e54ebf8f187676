"""Serving measurements as their consumers see them: push and pull carry bench and warm-start records
(with the raw results blobs and cache artifacts they name), gc removes those of the artifacts it
removes, verify names a bad one, ls and report show the figures, and `pull --prefer` ranks by them.

The records are written through the store API with figures written here (the harness's tests
measure a real server); the artifacts are a few small files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_transfer import make_artifact, three_files
from trtbuild.bench.records import (BenchRecord, Figures, LoadGenerator, Percentiles, Platform, WarmStartKey,
                                    WarmStartRecord, bench_id)
from trtbuild.bench.workload import Workload
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
    pull(remote, fresh, record.key)
    assert fresh.bench_records(record.digest) == remote.bench_records(record.digest)
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
