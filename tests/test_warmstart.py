"""Warm-start caches (issue #26): the key rule (a cache is installed only where every part of its key
matches this host, else one line naming the first part that differs and nothing written), capture
of a cache folder into the store and its install as the same bytes, and `pull --warm-start` end to
end on the CPU: NVML answering as a recorded H100 (tests/standin_nvml), vLLM the stand-in
(tests/standin_vllm, 0.33.0+standin), torch, Triton and FlashInfer as package metadata."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import jsonschema
import pytest
import yaml

from test_transfer import make_artifact
from trtbuild.store.measurements import WarmStartKey, WarmStartRecord
from trtbuild.bench.warmstart import (WarmStartRefused, capture, differences, host_key, install)
from trtbuild.host import toolchain
from trtbuild.keys import canonical_json
from trtbuild.lock import lockfile
from trtbuild.lock.lockfile import LockedRecipe, LockedTarget, LockFile
from trtbuild.store.local import LocalStore
from trtbuild.store.records import Digest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACT = "a" * 64
OPTIONS = {"--quantization": "modelopt", "--kv-cache-dtype": "auto", "--tensor-parallel-size": 1,
           "--pipeline-parallel-size": 1, "--max-model-len": 2048, "--dtype": "bfloat16"}
OPTIONS_SHA = hashlib.sha256(canonical_json(OPTIONS)).hexdigest()
# captured on the GPU host of ../shared/gpu-vllm: one H200, vLLM 0.26.0, torch 2.11.0+cu130
CAPTURED = WarmStartKey(artifact=ARTIFACT, runtime="vllm", runtime_version="0.26.0", torch="2.11.0+cu130",
                        triton="3.6.0", flashinfer="0.6.14", cuda="13.0", driver="580.95.05", sm="sm90", tp=1, pp=1,
                        serve_options=OPTIONS_SHA, served_from="/srv/models/fp8-hf")
# what vLLM 0.26.0 left in VLLM_CACHE_ROOT, in miniature (the paths as facts/warmstart.py describes them)
CACHE = {
    "torch_compile_cache/3f9c2a7d01/rank_0_0/backbone/cache_key_factors.json": b'{"config_hash": "c0ffee"}\n',
    "torch_compile_cache/3f9c2a7d01/rank_0_0/backbone/computation_graph.py": b"def forward(x):\n    return x\n",
    "torch_compile_cache/3f9c2a7d01/inductor_cache/fx/ab/fxgraph-ab12": bytes(range(256)) * 8,
    "flashinfer_autotune_cache/0.6.14/90a/5e1d/autotune_configs.json": b'{"_metadata": {"gpu": "NVIDIA H200"}}\n',
    "modelinfos/LlamaForCausalLM.json": b'{"architecture": "LlamaForCausalLM"}\n',
}


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write_tree(folder: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


@pytest.fixture
def store(tmp_path) -> LocalStore:
    s = LocalStore(tmp_path / "store")
    s.create()
    return s


@pytest.fixture
def captured(store, tmp_path) -> WarmStartRecord:
    """CACHE captured under CAPTURED (timings as the GPU host's README measured them)."""
    return capture(store, write_tree(tmp_path / "vllm-cache", CACHE), CAPTURED, 45.6, 38.4)


# ---- the key rule ------------------------------------------------------------------------------------

def test_differences_names_every_part_that_differs_in_the_keys_order():
    here = CAPTURED.model_copy(update={"sm": "sm89", "runtime_version": "0.33.0", "driver": None, "tp": 2})
    assert differences(CAPTURED, here) == ["runtime_version: cache 0.26.0, host 0.33.0",
                                           "driver: cache 580.95.05, host none", "sm: cache sm90, host sm89",
                                           "tp: cache 1, host 2"]
    assert differences(CAPTURED, CAPTURED.model_copy()) == []


def test_a_cache_captured_for_sm90_is_refused_on_an_sm89_host_and_nothing_is_written(captured, store, tmp_path):
    dest = tmp_path / "home" / ".cache" / "vllm"
    with pytest.raises(WarmStartRefused) as refused:
        install(store, captured, dest, CAPTURED.model_copy(update={"sm": "sm89"}), "fp8-hf")
    assert str(refused.value) == (f"warm-start cache {captured.cache.hash[:12]} of fp8-hf: captured for sm90, "
                                  "this host is sm89; not installed")
    assert not (tmp_path / "home").exists()


def test_a_cache_of_vllm_0_26_0_is_refused_under_0_33_0_and_nothing_is_written(captured, store, tmp_path):
    dest = tmp_path / "vllm"
    with pytest.raises(WarmStartRefused) as refused:
        install(store, captured, dest, CAPTURED.model_copy(update={"runtime_version": "0.33.0"}), "fp8-hf")
    assert str(refused.value) == (f"warm-start cache {captured.cache.hash[:12]} of fp8-hf: captured with vllm "
                                  "0.26.0, this host has vllm 0.33.0; not installed")
    assert not dest.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store", "vllm-cache"]  # no staging folder either


def test_a_cache_of_a_tp2_start_is_refused_for_a_tp1_start_and_nothing_is_written(captured, store, tmp_path):
    """vLLM's compile cache holds a graph per rank (rank_<r>_<dp>): a tp2 start's is not a tp1 start's."""
    tp2 = capture(store, write_tree(tmp_path / "tp2-cache", CACHE), CAPTURED.model_copy(update={"tp": 2}), 60.0, 30.0)
    dest = tmp_path / "vllm"
    with pytest.raises(WarmStartRefused) as refused:
        install(store, tp2, dest, CAPTURED, "fp8-hf")
    assert str(refused.value) == (f"warm-start cache {tp2.cache.hash[:12]} of fp8-hf: captured with tensor-parallel "
                                  "size 2, this start uses 1; not installed")
    assert not dest.exists()


def test_a_matching_host_gets_the_same_tree_as_writable_files_of_its_own(captured, store, tmp_path):
    dest = install(store, captured, tmp_path / "vllm", CAPTURED.model_copy(), "fp8-hf")
    assert tree(dest) == CACHE
    for path in dest.rglob("*"):
        if path.is_file():  # the runtime may rewrite its cache: never the store's read-only blob itself
            assert (path.stat().st_nlink, path.stat().st_mode & 0o777) == (1, 0o644)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store", "vllm", "vllm-cache"]


def test_install_beside_other_caches_adds_its_folders_and_never_overwrites_another_cache(captured, store, tmp_path):
    dest = write_tree(tmp_path / "vllm", {"torch_compile_cache/0000000000/rank_0_0/x.py": b"another model\n"})
    install(store, captured, dest, CAPTURED.model_copy(), "fp8-hf")
    assert tree(dest) == {**CACHE, "torch_compile_cache/0000000000/rank_0_0/x.py": b"another model\n"}
    install(store, captured, dest, CAPTURED.model_copy(), "fp8-hf")  # again: already there, nothing to do
    assert tree(dest) == {**CACHE, "torch_compile_cache/0000000000/rank_0_0/x.py": b"another model\n"}

    other = write_tree(tmp_path / "other", {"modelinfos/LlamaForCausalLM.json": b"{}\n"})
    with pytest.raises(WarmStartRefused) as refused:
        install(store, captured, other, CAPTURED.model_copy(), "fp8-hf")
    assert str(refused.value) == (f"{other / 'modelinfos/LlamaForCausalLM.json'}: already there with other bytes "
                                  f"(another cache); warm-start cache {captured.cache.hash[:12]} of fp8-hf not installed")
    assert tree(other) == {"modelinfos/LlamaForCausalLM.json": b"{}\n"}


# ---- capture -------------------------------------------------------------------------------------------

def test_capture_stores_the_folder_as_an_artifact_and_its_record_beside_the_artifact(captured, store, tmp_path):
    manifest = store.get_manifest(captured.cache.hash)
    assert {e.path: e.size for e in manifest.entries} == {rel: len(data) for rel, data in CACHE.items()}
    assert captured.cache == Digest(hash=manifest.digest, size_bytes=sum(len(d) for d in CACHE.values()))
    assert (captured.key, captured.cold_ready_s, captured.warm_ready_s) == (CAPTURED, 45.6, 38.4)
    assert store.warmstart_records(ARTIFACT) == [captured]
    assert (store.root / "warmstart" / ARTIFACT / f"{CAPTURED.digest()}.json").is_file()
    # and back out: ingest -> record -> install is the same tree
    assert tree(install(store, store.warmstart_records(ARTIFACT)[0], tmp_path / "back", CAPTURED, "fp8-hf")) == CACHE


def test_a_folder_the_runtime_left_empty_is_not_captured(store, tmp_path):
    (tmp_path / "empty" / "torch_compile_cache").mkdir(parents=True)
    with pytest.raises(Exception) as nothing:
        capture(store, tmp_path / "empty", CAPTURED, 1.0, 1.0)
    assert str(nothing.value) == f"{tmp_path / 'empty'}: the runtime left no cache file there; nothing to capture"
    assert store.warmstart_records() == []


# ---- this host -------------------------------------------------------------------------------------------

@pytest.fixture
def h100_with_vllm(recorded_gpu, installed_packages, monkeypatch):
    """A recorded H100 (driver 550.90.07, tests/standin_nvml/README.md), the stand-in vLLM 0.33.0+standin,
    and torch 2.11.0+cu130, Triton 3.6.0, FlashInfer 0.6.14 as installed metadata."""
    recorded_gpu("H100")
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "standin_vllm"))
    installed_packages(torch="2.11.0+cu130", triton="3.6.0", flashinfer_python="0.6.14")
    toolchain.package_version.cache_clear()


def test_host_key_reads_the_packages_driver_and_sm_of_this_host(h100_with_vllm):
    assert host_key(ARTIFACT, "vllm", OPTIONS, 1, 1, Path("/srv/models/fp8-hf")) == WarmStartKey(
        artifact=ARTIFACT, runtime="vllm", runtime_version="0.33.0+standin", torch="2.11.0+cu130", triton="3.6.0",
        flashinfer="0.6.14", cuda="13.0", driver="550.90.07", sm="sm90", tp=1, pp=1, serve_options=OPTIONS_SHA,
        served_from="/srv/models/fp8-hf")


# ---- pull --warm-start -------------------------------------------------------------------------------------

HERE = dict(runtime_version="0.33.0+standin", driver="550.90.07", sm="sm90")  # h100_with_vllm's


@pytest.fixture
def shared(tmp_path, monkeypatch, h100_with_vllm):
    """A shared store holding a validated fp8-hf (vLLM options packaged) and its lock; a deploy host's
    empty local store; VLLM_CACHE_ROOT in the test's folder. Returns (store, lock, fp8-hf's digest)."""
    remote = LocalStore(tmp_path / "shared")
    remote.create()
    files = {"config.json": b'{"architectures": ["LlamaForCausalLM"]}', "model.safetensors": b"\0" * 64,
             "serving/vllm_args.json": json.dumps(OPTIONS, indent=1).encode()}
    hf = make_artifact(remote, tmp_path / "art" / "fp8-hf", files, "fp8-hf", 1, "hf-checkpoint")
    check = make_artifact(remote, tmp_path / "art" / "validate", {"report.json": b"{}"}, "fp8-hf:validate", 2, "validate")
    lock = LockFile(recipe=LockedRecipe(name="tiny", digest="0" * 64), source=None, toolchain={}, validation="run",
                    targets={"fp8-hf": LockedTarget(stage="hf-checkpoint", key=hf.key, digest=hf.digest, size=hf.size),
                             "fp8-hf:validate": LockedTarget(stage="validate", key=check.key, digest=check.digest,
                                                             size=check.size, gates_passed=True)})
    lock_path = tmp_path / "tiny.lock"
    lock_path.write_text(lockfile.HEADER + yaml.safe_dump(lock.model_dump(mode="json", by_alias=True)))
    LocalStore(tmp_path / "deploy").create()
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "deploy"))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache-root"))
    return remote, lock_path, hf.digest


def captured_on(remote: LocalStore, tmp_path: Path, digest: str, **key) -> WarmStartRecord:
    """A cache captured on `digest`, served (by default) from the folder the deploy host's pull puts it in."""
    folder = write_tree(tmp_path / f"captured-{len(remote.warmstart_records())}", CACHE)
    served_from = str(tmp_path / "deploy" / "checkouts" / digest)
    return capture(remote, folder, CAPTURED.model_copy(update={"artifact": digest, "served_from": served_from,
                                                               **key}), 45.6, 38.4)


def test_pull_warm_start_refuses_a_cache_of_another_sm_and_installs_nothing(shared, run, tmp_path):
    remote, lock_path, digest = shared
    record = captured_on(remote, tmp_path, digest, **{**HERE, "sm": "sm89"})  # an L40S captured it
    result = run("pull", lock_path, "--target", "fp8-hf", "--store", remote.root, "--warm-start")
    line = f"warm-start cache {record.cache.hash[:12]} of fp8-hf: captured for sm89, this host is sm90; not installed"
    path = tmp_path / "deploy" / "checkouts" / digest
    assert (result.exit_code, result.stdout, result.stderr) == (1, f"{path}\n", f"{line}\n")
    assert tree(path)["serving/vllm_args.json"] == json.dumps(OPTIONS, indent=1).encode()  # the pull itself stands
    assert not (tmp_path / "vllm-cache-root").exists()

    as_json = run("pull", lock_path, "--target", "fp8-hf", "--store", remote.root, "--warm-start", "--json")
    out = json.loads(as_json.stdout)
    schema = json.loads((ROOT / "docs" / "schemas" / "pull.schema.json").read_text())
    jsonschema.validate(out["warm_start"], schema["properties"]["warm_start"])
    assert (as_json.exit_code, out["warm_start"], as_json.stderr) == (
        1, {"installed": None, "refused": line, "path": None}, f"{line}\n")
    assert not (tmp_path / "vllm-cache-root").exists()


def test_pull_warm_start_installs_the_matching_cache_where_vllm_looks(shared, run, tmp_path):
    remote, lock_path, digest = shared
    captured_on(remote, tmp_path, digest, **{**HERE, "sm": "sm89"})
    record = captured_on(remote, tmp_path, digest, **HERE)
    result = run("pull", lock_path, "--target", "fp8-hf", "--store", remote.root, "--warm-start", "--json")
    out = json.loads(result.stdout)
    root = tmp_path / "vllm-cache-root"
    assert (result.exit_code, out["warm_start"], result.stderr) == (
        0, {"installed": record.cache.hash, "refused": None, "path": str(root)},
        f"warm-start cache {record.cache.hash[:12]} of fp8-hf installed into {root}\n")
    assert tree(root) == CACHE


def test_pull_warm_start_refuses_a_vllm_cache_captured_serving_another_path(shared, run, tmp_path):
    """vLLM names its compile cache by the model's path: a cache captured on /srv/models/fp8-hf is no
    use to a start on the pulled checkout, and the line says where to pull it to."""
    remote, lock_path, digest = shared
    record = captured_on(remote, tmp_path, digest, **HERE, served_from="/srv/models/fp8-hf")
    result = run("pull", lock_path, "--target", "fp8-hf", "--store", remote.root, "--warm-start")
    path = tmp_path / "deploy" / "checkouts" / digest
    assert (result.exit_code, result.stderr) == (1, (
        f"warm-start cache {record.cache.hash[:12]} of fp8-hf: captured serving the model from /srv/models/fp8-hf, "
        f"this start serves it from {path} (vLLM names its compile cache by the model's path: pull it with --dest "
        "/srv/models/fp8-hf); not installed\n"))
    assert not (tmp_path / "vllm-cache-root").exists()


def test_pull_warm_start_of_an_artifact_nothing_was_captured_on_says_so(shared, run, tmp_path):
    remote, lock_path, digest = shared
    result = run("pull", lock_path, "--target", "fp8-hf", "--store", remote.root, "--warm-start")
    assert (result.exit_code, result.stderr) == (
        0, "no warm-start cache was captured of fp8-hf for vllm; the runtime will compile and tune at its first start\n")
    assert not (tmp_path / "vllm-cache-root").exists()
    assert os.path.isdir(result.stdout.strip())


# ---- bench --capture-warm-start's second start --------------------------------------------------------------

STANDIN_SERVE = '''#!{python}
"""A stand-in `vllm serve` for capture_after_runs (no vLLM runs on the CPU): what vLLM 0.26.0 does with
VLLM_CACHE_ROOT, in miniature: the first start writes torch_compile_cache/<hash>/..., a later one
finds it (or, with STANDIN_RECOMPILE, compiles into another folder); then it answers /v1/models."""
import http.server, json, os, sys
from pathlib import Path

root = Path(os.environ["VLLM_CACHE_ROOT"]) / "torch_compile_cache"
made = sorted(root.iterdir()) if root.is_dir() else []
if not made or os.environ.get("STANDIN_RECOMPILE"):
    graph = root / f"{{len(made):010d}}" / "rank_0_0" / "backbone" / "computation_graph.py"
    graph.parent.mkdir(parents=True)
    graph.write_text("def forward(x):\\n    return x\\n")


class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({{"object": "list", "data": [{{"id": "model"}}]}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Models).serve_forever()
'''


@pytest.fixture
def standin_serve(tmp_path, monkeypatch, h100_with_vllm):
    """`vllm` on PATH is STANDIN_SERVE; an fp8-hf folder with its packaged options."""
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(STANDIN_SERVE.format(python=sys.executable))
    (bin_dir / "vllm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return write_tree(tmp_path / "fp8-hf", {"config.json": b"{}", "serving/vllm_args.json": json.dumps(OPTIONS).encode()})


def test_the_second_start_on_the_first_starts_cache_is_timed_and_captured(standin_serve, store, tmp_path):
    from trtbuild.bench.server import RuntimeServer, server_spec
    from trtbuild.bench.warmstart import capture_after_runs, runtime_env

    root = tmp_path / "cache-root"
    root.mkdir()
    spec = server_spec("vllm", standin_serve, "fp8-hf", runtime_env("vllm", root))
    with RuntimeServer(spec, 30) as cold:
        pass
    record = capture_after_runs(store, spec, ARTIFACT, "fp8-hf", cold.time_to_ready_s, 30, root)
    assert record.key == CAPTURED.model_copy(update={**HERE, "served_from": str(standin_serve)})  # where it served
    assert record.cold_ready_s == cold.time_to_ready_s
    assert store.warmstart_records(ARTIFACT) == [record]
    assert [e.path for e in store.get_manifest(record.cache.hash).entries] == [
        "torch_compile_cache/0000000000/rank_0_0/backbone/computation_graph.py"]


def test_a_second_start_that_compiles_again_is_not_captured(standin_serve, store, tmp_path, monkeypatch):
    from trtbuild.bench.server import RuntimeServer, server_spec
    from trtbuild.bench.warmstart import capture_after_runs, runtime_env

    monkeypatch.setenv("STANDIN_RECOMPILE", "1")
    root = tmp_path / "cache-root"
    root.mkdir()
    spec = server_spec("vllm", standin_serve, "fp8-hf", runtime_env("vllm", root))
    with RuntimeServer(spec, 30) as cold:
        pass
    with pytest.raises(Exception) as refused:
        capture_after_runs(store, spec, ARTIFACT, "fp8-hf", cold.time_to_ready_s, 30, root)
    assert str(refused.value) == ("fp8-hf: the second start of vllm compiled again into "
                                  "torch_compile_cache/0000000001 instead of reusing the first start's (0000000000); "
                                  "warm-start cache not captured")
    assert store.warmstart_records() == []
