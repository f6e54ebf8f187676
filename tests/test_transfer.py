"""push / pull between two stores (two LocalStores: the code is the one an S3 store goes through),
materialize_to, and the `trtbuild push` / `trtbuild pull` commands. Tiny artifacts only."""

from __future__ import annotations

import errno
import hashlib
import os
import re
from pathlib import Path

import pytest
import yaml

from conftest import minimal, key_fields
from trtbuild.deploy.select import package_words
from trtbuild.host.toolchain import package_version
from trtbuild.lock import lockfile
from trtbuild.lock.lockfile import LockedPlatform, LockedRecipe, LockedTarget, LockFile
from trtbuild.store.records import ActionRecord, Digest, Execution
from trtbuild.recipe.schema import load_recipe
from trtbuild.store.base import CorruptStore
from trtbuild.store.local import LocalStore
from trtbuild.store.transfer import PushItem, materialize_to, pull, push

TRTLLM, TRT = "1.2.1", "10.13.2"

# this host's llama-cpp-python, as Host.describe ends (probed like the other packages; not faked here)
LLAMACPP = package_words("llama_cpp_python", package_version("llama_cpp"))


def make_artifact(store: LocalStore, folder: Path, files: dict[str, bytes], target: str, n: int,
                  stage: str = "checkpoint", toolchain: dict | None = None, fields: dict | None = None) -> ActionRecord:
    """Store `files` as an artifact with an action record under key n (a few small files)."""
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    manifest = store.ingest(folder)
    record = ActionRecord(key=f"{n:064x}", artifact=Digest(hash=manifest.digest, size_bytes=manifest.size),
                          stage=stage, stage_version=1, target=target, recipe="tiny", created="2026-12-01T00:00:00Z",
                          toolchain=toolchain or {}, fields=key_fields(**(fields or {})), execution=Execution(seconds=0.0, host="builder"))
    return store.put_record(record)


def three_files(tag: str) -> dict[str, bytes]:
    return {"config.json": f'{{"tag": "{tag}"}}'.encode(), "rank0.safetensors": tag.encode() * 1000,
            "sub/notes.txt": b"shared bytes"}


def count_put_blob(monkeypatch, store: LocalStore) -> list[str]:
    calls: list[str] = []
    original = store.transport.put_blob  # where every blob a store takes goes in (put_blobs too)

    def counted(source, digest, owned=False, link=False):
        calls.append(digest)
        return original(source, digest, owned, link)

    monkeypatch.setattr(store.transport, "put_blob", counted)
    return calls


@pytest.fixture
def stores(tmp_path):
    local, remote = LocalStore(tmp_path / "local"), LocalStore(tmp_path / "remote")
    local.create()
    return local, remote


def test_push_then_pull_into_a_fresh_store_verifies_every_blob(stores, tmp_path):
    local, remote = stores
    record = make_artifact(local, tmp_path / "a", three_files("a"), "base-tp1", 1)
    moved = push(local, remote, [PushItem(record, ("tiny", "base-tp1"))])
    assert (moved.blobs, moved.records, moved.refs, moved.divergences) == (3, 1, 1, [])
    assert remote.read_ref("tiny", "base-tp1").digest == record.digest

    fresh = LocalStore(tmp_path / "fresh")
    digest, pulled = pull(remote, fresh, record.key)
    assert digest == record.digest and pulled.blobs == 3
    assert fresh.get_record(record.key) == record
    for entry in fresh.get_manifest(digest).entries:
        assert hashlib.sha256(fresh.blob_path(entry.sha256).read_bytes()).hexdigest() == entry.sha256
        fresh.verify_blob(entry.sha256, use_state=False)
    assert fresh.artifact_problem(digest) is None


def test_a_re_push_moves_no_blob_bytes(stores, tmp_path, monkeypatch):
    local, remote = stores
    first = make_artifact(local, tmp_path / "a", three_files("a"), "base-tp1", 1)
    calls = count_put_blob(monkeypatch, remote)
    push(local, remote, [PushItem(first, ("tiny", "base-tp1"))])
    assert len(calls) == 3
    again = push(local, remote, [PushItem(first, ("tiny", "base-tp1"))])
    assert len(calls) == 3 and (again.blobs, again.bytes, again.skipped_blobs) == (0, 0, 3)
    # another artifact sharing one file sends only the two new blobs
    second = make_artifact(local, tmp_path / "b", three_files("b"), "fp8-tp1", 2)
    other = push(local, remote, [PushItem(second, ("tiny", "fp8-tp1"))])
    assert len(calls) == 5 and (other.blobs, other.skipped_blobs) == (2, 1)


def test_a_different_record_for_a_pushed_key_is_reported_never_written_over(stores, tmp_path):
    local, remote = stores
    theirs = make_artifact(LocalStore(tmp_path / "other"), tmp_path / "o", three_files("o"), "base-tp1", 1)
    push(LocalStore(tmp_path / "other"), remote, [PushItem(theirs)])
    mine = make_artifact(local, tmp_path / "a", three_files("a"), "base-tp1", 1)
    moved = push(local, remote, [PushItem(mine, ("tiny", "base-tp1"))])
    assert moved.divergences == [
        f"base-tp1: {remote.describe_record(mine.key)} already records artifact {theirs.digest} for key {mine.key}; "
        f"this store's {mine.digest} was kept beside it as a divergence, not written over it"]
    assert remote.get_record(mine.key).digest == theirs.digest
    assert remote.has_manifest(mine.digest)  # the ref names bytes that are there


def tamper(remote: LocalStore, digest: str) -> Path:
    blob = remote.blob_path(digest)
    blob.chmod(0o644)
    blob.write_bytes(b"X" * blob.stat().st_size)
    return blob


def test_a_tampered_remote_blob_is_detected_at_pull_and_nothing_is_recorded(stores, tmp_path):
    local, remote = stores
    record = make_artifact(local, tmp_path / "a", three_files("a"), "base-tp1", 1)
    push(local, remote, [PushItem(record)])
    victim = next(e for e in remote.get_manifest(record.digest).entries if e.path == "rank0.safetensors")
    blob = tamper(remote, victim.sha256)
    fresh = LocalStore(tmp_path / "fresh")
    with pytest.raises(CorruptStore) as caught:
        pull(remote, fresh, record.key)
    actual = hashlib.sha256(blob.read_bytes()).hexdigest()
    assert str(caught.value) == f"blob {blob} is corrupt: its content hashes to {actual}; nothing was pulled"
    assert fresh.get_record(record.key) is None and not fresh.has_manifest(record.digest)
    assert list(fresh.iter_blobs()) == []  # not even the sound blobs: nothing is half there
    assert list((fresh.root / "tmp").iterdir()) == []


def test_materialize_to_builds_dest_atomically_and_a_failure_midway_leaves_none(stores, tmp_path, monkeypatch):
    local, _ = stores
    record = make_artifact(local, tmp_path / "a", three_files("a"), "base-tp1", 1)
    dest = tmp_path / "deploy" / "model"
    placed = []
    original = local.place_blob

    def fail_second(digest, target, executable):
        placed.append(digest)
        if len(placed) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(digest, target, executable)

    monkeypatch.setattr(local, "place_blob", fail_second)
    with pytest.raises(Exception) as caught:
        materialize_to(local, record.digest, dest)
    assert str(caught.value) == f"--dest {dest}: cannot write it (No space left on device)"
    assert list(dest.parent.iterdir()) == []  # no DEST, no half-built sibling
    monkeypatch.setattr(local, "place_blob", original)
    assert materialize_to(local, record.digest, dest) == dest
    assert {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == three_files("a")
    assert [p.name for p in dest.parent.iterdir()] == ["model"]


def test_materialize_to_refuses_an_existing_dest_unless_it_is_the_same_artifact(stores, tmp_path):
    local, _ = stores
    record = make_artifact(local, tmp_path / "a", three_files("a"), "base-tp1", 1)
    dest = tmp_path / "model"
    materialize_to(local, record.digest, dest)
    assert materialize_to(local, record.digest, dest) == dest  # the same artifact: nothing to do
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    with pytest.raises(Exception) as caught:
        materialize_to(local, record.digest, other)
    assert str(caught.value) == (f"--dest {other}: already exists and is not artifact {record.digest}; "
                                 "remove it or pick another folder")



HOLD_AFTER_ONE_FILE = """
import sys, time
from pathlib import Path
from trtbuild.store.local import LocalStore
from trtbuild.store.transfer import materialize_to

store = LocalStore(sys.argv[1])
place = store.place_blob

def place_then_hang(digest, target, executable):
    place(digest, target, executable)
    print("placed", flush=True)
    time.sleep(600)

store.place_blob = place_then_hang
materialize_to(store, sys.argv[2], Path(sys.argv[3]))
"""


def test_a_pull_to_dest_removes_the_partial_folders_of_killed_pulls_and_never_a_live_ones(stores, tmp_path):
    """Each pull of --dest assembles it in a hidden sibling; a SIGKILL leaves that folder behind.
    The next materialize_to of the same dest removes those no live process owns; a pull still
    writing (here: hung after its first file) keeps its folder, and a folder of another dest is
    left alone."""
    import signal
    import subprocess
    import sys

    local, _ = stores
    record = make_artifact(local, tmp_path / "a", three_files("a"), "base-tp1", 1)
    dest = tmp_path / "deploy" / "model"

    def hung_pull() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLD_AFTER_ONE_FILE, local.root, record.digest, dest],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "placed\n"
        return proc

    def partials() -> set[str]:
        return {p.name for p in dest.parent.iterdir() if p.name.startswith(".model.partial-")}

    killed = hung_pull()
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    left_by_kill = partials()
    assert left_by_kill  # the folder of the killed pull (and whatever marks it as being written)
    live = hung_pull()
    try:
        of_live = partials() - left_by_kill
        assert of_live
        gone = subprocess.Popen([sys.executable, "-c", "pass"])  # a pid that no longer runs
        gone.wait()
        (dest.parent / f".model.partial-{gone.pid}-0badc0de").mkdir()  # an older trtbuild's, dead
        (dest.parent / f".model.partial-{os.getpid()}-0badc0de").mkdir()  # an older trtbuild's, alive
        (dest.parent / ".other.partial-1-0badc0de").mkdir()  # another dest's
        assert materialize_to(local, record.digest, dest) == dest
        assert {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == three_files("a")
        assert partials() == of_live | {f".model.partial-{os.getpid()}-0badc0de"}
        assert (dest.parent / ".other.partial-1-0badc0de").is_dir()
    finally:
        live.kill()
        live.wait()
    (dest.parent / f".model.partial-{os.getpid()}-0badc0de").rmdir()
    assert materialize_to(local, record.digest, dest) == dest  # dest is whole: the killed one's is removed still
    assert sorted(p.name for p in dest.parent.iterdir()) == [".other.partial-1-0badc0de", "model"]


# ---- the commands ---------------------------------------------------------------------------------------

class Project:
    """A recipe, its hand-written lock file, and the local store ($TRTBUILD_CACHE) holding what it names."""

    def __init__(self, ws, tmp_path: Path, monkeypatch) -> None:
        self.recipe = ws.recipe(minimal())
        self.lock_path = self.recipe.with_suffix(".lock")
        self.local = LocalStore(tmp_path / "local")
        self.local.create()
        monkeypatch.setenv("TRTBUILD_CACHE", str(self.local.root))
        self.remote = tmp_path / "remote"
        self.tmp = tmp_path
        self.targets: dict[str, LockedTarget] = {}
        self.n = 0

    def add(self, target: str, stage: str = "checkpoint", gates_passed=None, platform=None, toolchain=None,
            fields=None) -> ActionRecord:
        self.n += 1
        record = make_artifact(self.local, self.tmp / "art" / target.replace(":", "_"), three_files(target), target,
                               self.n, stage, toolchain, fields)
        self.targets[target] = LockedTarget(stage=stage, key=record.key, digest=record.digest, size=record.size,
                                            gates_passed=gates_passed, platform=platform)
        return record

    def write_lock(self, validation: str = "run") -> None:
        lock = LockFile(recipe=LockedRecipe(name="tiny", digest=lockfile.recipe_digest(load_recipe(self.recipe))),
                        source=None, toolchain={}, targets=self.targets, validation=validation)
        self.lock_path.write_text(lockfile.HEADER + yaml.safe_dump(lock.model_dump(mode="json", by_alias=True)))


@pytest.fixture
def project(ws, tmp_path, monkeypatch):
    return Project(ws, tmp_path, monkeypatch)


def sm90_platform(standin: bool = False) -> LockedPlatform:
    version = (f"{TRTLLM}+standin", f"{TRT}+standin") if standin else (TRTLLM, TRT)
    return LockedPlatform(sm="sm90", tp=1, pp=1, world_size=1, tensorrt_llm=version[0], tensorrt=version[1],
                          engine_bytes_per_rank=4096, standin=standin)


def test_push_publishes_validated_targets_and_refuses_failed_gates_and_stand_ins_one_line_each(project, run):
    project.add("base-tp1")
    project.add("base-tp1:validate", "validate", gates_passed=True)
    project.add("fp8-tp1")
    project.add("fp8-tp1:validate", "validate", gates_passed=False)
    project.add("base-tp1-sm90", "engine", platform=sm90_platform(standin=True),
                toolchain={"tensorrt_llm": f"{TRTLLM}+standin", "tensorrt": f"{TRT}+standin"})
    project.add("base-tp1-sm90:validate", "validate", gates_passed=True)
    project.write_lock()
    result = run("push", project.recipe, "--store", project.remote)
    assert result.exit_code == 1
    assert result.stderr == (  # the folder it made for base-tp1, then the refusals in the lock's order
        f"new store at {project.remote}\n"
        "base-tp1-sm90: made by a stand-in toolchain (tensorrt, tensorrt_llm); stand-ins are never pushed\n"
        "fp8-tp1: held back: fp8-tp1:validate failed its gates; not pushed\n")
    # 8000 + 17000 bytes of rank files, 19 + 28 of configs, 12 of the notes both share (sent once)
    assert result.stdout == f"pushed base-tp1\n5 blobs (24.5 KiB) sent, 1 already there; 2 records, 2 refs -> {project.remote}\n"
    remote = LocalStore(project.remote)
    assert sorted((r, t) for r, t, _ in remote.refs()) == [("tiny", "base-tp1"), ("tiny", "base-tp1:validate")]
    assert [r.target for r in remote.records()] == sorted(["base-tp1", "base-tp1:validate"],
                                                         key=lambda t: project.targets[t].key)
    again = run("push", project.recipe, "--target", "base-*", "--store", project.remote)
    assert again.exit_code == 1 and again.stdout.splitlines()[1].startswith("0 blobs (0 B) sent, 6 already there")


def test_push_refuses_a_no_validate_build_unless_allow_unvalidated(project, run):
    project.add("base-tp1")
    project.write_lock(validation="skipped (--no-validate)")
    refused = run("push", project.recipe, "--store", project.remote)
    assert (refused.exit_code, refused.stdout) == (1, f"0 blobs (0 B) sent, 0 already there; 0 records, 0 refs -> {project.remote}\n")
    assert refused.stderr == "base-tp1: held back: built with --no-validate; not pushed without --allow-unvalidated\n"
    assert not project.remote.exists()
    allowed = run("push", project.recipe, "--store", project.remote, "--allow-unvalidated")
    assert (allowed.exit_code, allowed.stderr) == (0, f"new store at {project.remote}\n")
    assert LocalStore(project.remote).read_ref("tiny", "base-tp1").digest == project.targets["base-tp1"].digest


def test_push_and_pull_refuse_what_is_not_there_with_exit_2(project, run, tmp_path):
    result = run("push", project.recipe, "--store", project.remote)
    assert (result.exit_code, result.stderr) == (2, f"{project.lock_path}: no lock file; run `trtbuild build {project.recipe}` first\n")
    project.add("base-tp1")
    project.write_lock()
    bad = run("push", project.recipe, "--target", "nope*", "--store", project.remote)
    assert (bad.exit_code, bad.stderr) == (2, f"--target nope*: matches no built target of {project.lock_path} (base-tp1)\n")
    missing = run("pull", project.lock_path, "--store", tmp_path / "nowhere")
    assert (missing.exit_code, missing.stderr) == (2, f"store {tmp_path / 'nowhere'}: no such store (nothing has been built there)\n")


def engine_project(project) -> None:
    project.add("base-tp1")
    project.add("base-tp1:validate", "validate", gates_passed=True)
    project.add("base-tp1-sm90", "engine", platform=sm90_platform(), toolchain={"tensorrt_llm": TRTLLM, "tensorrt": TRT})
    project.add("base-tp1-sm90:validate", "validate", gates_passed=True)
    project.write_lock()


def test_pull_auto_on_a_recorded_h100_materializes_the_sm90_engine_into_dest(project, run, recorded_gpu,
                                                                              installed_packages, tmp_path, monkeypatch):
    engine_project(project)
    assert run("push", project.recipe, "--store", project.remote).exit_code == 0
    recorded_gpu("H100")
    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "deploy-store"))  # a deploy host: a fresh local store
    dest = tmp_path / "serve" / "engine"
    result = run("pull", project.lock_path, "--store", project.remote, "--dest", dest)
    assert (result.exit_code, result.stdout, result.stderr) == (0, f"{dest}\n", f"new store at {tmp_path / 'deploy-store'}\n")
    assert {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == three_files("base-tp1-sm90")
    deploy = LocalStore(tmp_path / "deploy-store")
    assert deploy.get_record(project.targets["base-tp1-sm90"].key).digest == project.targets["base-tp1-sm90"].digest
    again = run("pull", project.recipe, "--store", project.remote)  # a recipe beside its lock; the store's checkout
    assert (again.exit_code, again.stdout) == (0, f"{deploy.workspace().checkout_path(project.targets['base-tp1-sm90'].digest)}\n")


def test_pull_dry_run_prints_the_choice_and_downloads_nothing(project, run, recorded_gpu, installed_packages,
                                                             tmp_path, monkeypatch):
    import json

    engine_project(project)
    assert run("push", project.recipe, "--store", project.remote).exit_code == 0
    recorded_gpu("H100")
    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "deploy-store"))
    dest = tmp_path / "serve"
    digest = project.targets["base-tp1-sm90"].digest
    result = run("pull", project.lock_path, "--store", project.remote, "--dest", dest, "--dry-run")
    assert (result.exit_code, result.stdout, result.stderr) == (
        0, f"would pull base-tp1-sm90 (trtllm-engine, 1 GPU): artifact {digest}\n", "")
    as_json = run("pull", project.lock_path, "--store", project.remote, "--dry-run", "--json")
    out = json.loads(as_json.stdout)
    assert (as_json.exit_code, out["target"], out["digest"], out["runtime"], out["path"], out["moved"]) == (
        0, "base-tp1-sm90", digest, "trtllm-engine", None, None)
    assert [(c["target"], c["fits"]) for c in out["candidates"]] == [("base-tp1", False), ("base-tp1-sm90", True)]
    assert not dest.exists() and not (tmp_path / "deploy-store").exists()  # nothing downloaded, no store made
    # choosing an engine reads only the lock: the store is not even opened (a deploy script's quick question)
    nowhere = tmp_path / "no-such-store"
    offline = run("pull", project.lock_path, "--store", nowhere, "--dry-run")
    assert (offline.exit_code, offline.stdout, offline.stderr) == (
        0, f"would pull base-tp1-sm90 (trtllm-engine, 1 GPU): artifact {digest}\n", "")
    missing = run("pull", project.lock_path, "--store", nowhere)
    assert (missing.exit_code, missing.stderr) == (2, f"store {nowhere}: no such store (nothing has been built there)\n")


def test_pull_exits_1_listing_every_target_when_nothing_fits(project, run, recorded_gpu, installed_packages):
    engine_project(project)
    run("push", project.recipe, "--store", project.remote)
    recorded_gpu("L40S")
    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    result = run("pull", project.lock_path, "--store", project.remote)
    assert result.exit_code == 1
    assert result.stderr == (
        f"no target of {project.lock_path} fits this host (1x NVIDIA L40S (sm89, 45.0 GiB), tensorrt_llm {TRTLLM}, "
        f"tensorrt {TRT}, no vllm, no sglang, {LLAMACPP}):\n"
        "  base-tp1: a TensorRT-LLM checkpoint: no runtime serves it as it is (the engines built from it do)\n"
        "  base-tp1-sm90: sm: the engine is for sm90; this host has sm89 (1x NVIDIA L40S)\n"
        f"to make one: add sm89 to the recipe's `gpus:`, then run `trtbuild build {project.recipe} --gpu auto` on this host\n")


def test_pull_json_when_nothing_fits_prints_every_candidate_and_the_same_lines(project, run, recorded_gpu,
                                                                             installed_packages):
    import json

    engine_project(project)
    run("push", project.recipe, "--store", project.remote)
    recorded_gpu("L40S")
    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    text = run("pull", project.lock_path, "--store", project.remote)
    result = run("pull", project.lock_path, "--store", project.remote, "--json")
    assert (result.exit_code, result.stderr) == (1, text.stderr)
    out = json.loads(result.stdout)
    assert {k: out[k] for k in ("target", "digest", "path", "runtime", "moved")} == dict.fromkeys(
        ("target", "digest", "path", "runtime", "moved"))
    assert [(c["target"], c["fits"], c["reasons"]) for c in out["candidates"]] == [
        ("base-tp1", False, ["a TensorRT-LLM checkpoint: no runtime serves it as it is (the engines built from it do)"]),
        ("base-tp1-sm90", False, ["sm: the engine is for sm90; this host has sm89 (1x NVIDIA L40S)"])]
    assert out["host"]["gpus"] == [{"index": 0, "name": "NVIDIA L40S", "sm": "sm89", "memory_bytes": 46068 * 2**20}]


def test_pull_of_a_tampered_blob_fails_and_leaves_no_dest(project, run, tmp_path, monkeypatch):
    engine_project(project)
    run("push", project.recipe, "--store", project.remote)
    remote = LocalStore(project.remote)
    entry = next(e for e in remote.get_manifest(project.targets["base-tp1"].digest).entries if e.path == "config.json")
    blob = tamper(remote, entry.sha256)
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "deploy-store"))
    dest = tmp_path / "serve"
    result = run("pull", project.lock_path, "--target", "base-tp1", "--store", project.remote, "--dest", dest)
    actual = hashlib.sha256(blob.read_bytes()).hexdigest()
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == f"blob {blob} is corrupt: its content hashes to {actual}; nothing was pulled\n"
    assert not dest.exists() and not (tmp_path / "deploy-store").exists()  # the store it made stored nothing: gone


def test_pull_auto_reads_an_hf_checkpoints_format_from_the_stores_record_and_prints_json(
        project, run, recorded_gpu, installed_packages, tmp_path, monkeypatch):
    import json

    project.add("fp8-hf", "hf-checkpoint", fields={"params": {"quant": "fp8", "kv_cache": None}})
    project.add("fp8-hf:validate", "validate", gates_passed=True)
    project.add("awq-hf", "hf-checkpoint", fields={"params": {"quant": "int4_awq", "kv_cache": None}})
    project.add("awq-hf:validate", "validate", gates_passed=True)
    project.write_lock()
    assert run("push", project.recipe, "--store", project.remote).exit_code == 0
    recorded_gpu("A100")
    installed_packages(vllm="0.33.0")
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "deploy-store"))
    result = run("pull", project.lock_path, "--store", project.remote, "--json")
    assert (result.exit_code, result.stderr) == (0, f"new store at {tmp_path / 'deploy-store'}\n")
    out = json.loads(result.stdout)
    digest = project.targets["fp8-hf"].digest
    assert (out["target"], out["runtime"], out["digest"]) == ("fp8-hf", "vllm", digest)
    assert out["path"] == str(LocalStore(tmp_path / "deploy-store").workspace().checkout_path(digest))
    assert [(c["target"], c["fits"], c["reasons"]) for c in out["candidates"]] == [
        ("awq-hf", False, ["trtllm: not installed", "vllm: does not serve int4_awq on sm80", "sglang: not installed"]),
        ("fp8-hf", True, [])]


def test_pull_refuses_a_bad_gpu_or_target_with_exit_2(project, run):
    from trtbuild.facts import gpus

    project.add("base-tp1")
    project.write_lock()
    with pytest.raises(ValueError) as why:
        gpus.resolve_gpu("sm99")
    gpu = run("pull", project.lock_path, "--gpu", "sm99", "--store", project.local.root)
    assert (gpu.exit_code, gpu.stderr) == (2, f"--gpu: {why.value}\n")
    target = run("pull", project.lock_path, "--target", "nope", "--store", project.local.root)
    assert (target.exit_code, target.stderr) == (2, f"--target nope: not a target of {project.lock_path} (base-tp1)\n")


def test_push_refuses_a_target_the_local_store_lost(project, run):
    record = project.add("base-tp1")
    project.add("base-tp1:validate", "validate", gates_passed=True)
    project.write_lock()
    project.local.delete_record(record.key)
    result = run("push", project.recipe, "--store", project.remote)
    assert result.exit_code == 1
    assert result.stderr == (f"base-tp1: not in the local store as {project.lock_path} records it "
                             f"({project.local.describe_record(record.key)}); build it first\n")


def test_push_refuses_a_target_whose_validation_a_stand_in_made(project, run):
    project.add("base-hf", "hf-checkpoint")
    project.add("base-hf:validate", "validate", gates_passed=True)
    project.add("base-hf:validate-trtllm", "validate", gates_passed=True,
                toolchain={"tensorrt_llm": f"{TRTLLM}+standin", "tensorrt": f"{TRT}+standin", "cuda": None})
    project.write_lock()
    result = run("push", project.recipe, "--store", project.remote)
    assert (result.exit_code, result.stderr) == (1, "base-hf: its validation base-hf:validate-trtllm: made by a stand-in "
                                                    "toolchain (tensorrt, tensorrt_llm); stand-ins are never pushed\n")
    assert not project.remote.exists()


def test_push_refuses_a_target_whose_vllm_validation_a_stand_in_made(project, run):
    project.add("base-hf", "hf-checkpoint")
    project.add("base-hf:validate", "validate", gates_passed=True)
    project.add("base-hf:validate-vllm", "validate", gates_passed=True,
                toolchain={"vllm": "0.33.0+standin", "torch": "2.13.0", "cuda": None})
    project.write_lock()
    result = run("push", project.recipe, "--store", project.remote)
    assert (result.exit_code, result.stderr) == (1, "base-hf: its validation base-hf:validate-vllm: made by a stand-in "
                                                    "toolchain (vllm); stand-ins are never pushed\n")
    assert not project.remote.exists()


# ---- through a real S3 server (SeaweedFS on 127.0.0.1, credentials enforced) ----------------------------

@pytest.fixture(scope="module")
def seaweed():
    from s3server import SeaweedS3

    with SeaweedS3() as server:
        yield server


@pytest.fixture
def bucket(seaweed, monkeypatch, request):
    """A fresh bucket of the module's SeaweedFS for this test, the variables a client of the server
    needs set; returns the store URL in it."""
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.replace("_", "-").lower())[:50].strip("-")
    seaweed.client().create_bucket(Bucket=name)
    return f"s3://{name}/team"


def test_a_pull_from_s3_hashes_each_blob_once_in_the_stores_verifying_stream(seaweed, tmp_path, monkeypatch):
    """S3Store streams a blob verified against its name; pull must not hash the same bytes again."""
    import types
    import uuid

    from trtbuild.store import transfer
    from trtbuild.store.s3 import S3Store

    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    bucket = f"once-{uuid.uuid4().hex[:12]}"
    seaweed.client().create_bucket(Bucket=bucket)
    remote = S3Store(f"s3://{bucket}/store")
    local = LocalStore(tmp_path / "local")
    record = make_artifact(local, tmp_path / "a", three_files("a"), "base-tp1", 1)
    push(local, remote, [PushItem(record)])

    def second_hash(*_args, **_kwargs):
        raise AssertionError("pull hashed bytes the store had already verified")

    monkeypatch.setattr(transfer, "hashlib", types.SimpleNamespace(sha256=second_hash))
    fresh = LocalStore(tmp_path / "fresh")
    digest, moved = pull(remote, fresh, record.key)
    assert (digest, moved.blobs) == (record.digest, 3) and fresh.artifact_problem(digest) is None

    victim = next(e for e in local.get_manifest(record.digest).entries if e.path == "rank0.safetensors")
    seaweed.client().put_object(Bucket=bucket, Key=remote.transport.blob_key(victim.sha256), Body=b"X" * victim.size)
    with pytest.raises(CorruptStore) as caught:
        pull(remote, LocalStore(tmp_path / "second"), record.key)
    actual = hashlib.sha256(b"X" * victim.size).hexdigest()
    assert str(caught.value) == (f"blob {remote.describe_blob(victim.sha256)} is corrupt: its sha256 is {actual}; "
                                 f"run `trtbuild cache verify --store {remote.url}`")


def test_push_and_pull_through_s3_verify_every_blob_and_move_nothing_twice(project, run, recorded_gpu, installed_packages,
                                                                           seaweed, tmp_path, monkeypatch):
    """The CI job pushes to the bucket; a deploy host with no hub access and a fresh store pulls the
    engine that fits it; a blob altered in the bucket is caught before anything is materialized."""
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    seaweed.client().create_bucket(Bucket="artifacts")
    url = "s3://artifacts/team/trtbuild"
    engine_project(project)
    first = run("push", project.recipe, "--store", url)
    assert (first.exit_code, first.stderr) == (0, "")
    assert first.stdout == ("pushed base-tp1\npushed base-tp1-sm90\n"
                            f"9 blobs (58.7 KiB) sent, 6 already there; 5 records, 5 refs -> {url}\n")
    again = run("push", project.recipe, "--store", url)
    assert again.exit_code == 0
    assert again.stdout.splitlines()[-1] == f"0 blobs (0 B) sent, 15 already there; 5 records, 5 refs -> {url}"

    recorded_gpu("H100")
    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "deploy-store"))
    dest = tmp_path / "serve" / "engine"
    pulled = run("pull", project.lock_path, "--store", url, "--dest", dest)
    assert (pulled.exit_code, pulled.stdout, pulled.stderr) == (0, f"{dest}\n", f"new store at {tmp_path / 'deploy-store'}\n")
    assert {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == three_files("base-tp1-sm90")

    entry = next(e for e in LocalStore(tmp_path / "local").get_manifest(project.targets["base-tp1-sm90"].digest).entries
                 if e.path == "config.json")
    seaweed.client().put_object(Bucket="artifacts", Key=f"team/trtbuild/cas/sha256/{entry.sha256[:2]}/{entry.sha256}",
                                Body=b'{"tag": "tampered!!!!!!"}')
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "second-deploy-store"))
    other = tmp_path / "serve2"
    refused = run("pull", project.lock_path, "--store", url, "--dest", other)
    assert (refused.exit_code, refused.stdout) == (1, "")
    blob = f"{url}/cas/sha256/{entry.sha256[:2]}/{entry.sha256}"
    actual = hashlib.sha256(b'{"tag": "tampered!!!!!!"}').hexdigest()
    assert refused.stderr == f"blob {blob} is corrupt: its sha256 is {actual}; run `trtbuild cache verify --store {url}`\n"
    assert not other.exists() and not (tmp_path / "second-deploy-store").exists()  # it stored nothing: gone
    verify = run("cache", "verify", "--store", url)  # what that message asks for, on the bucket
    assert verify.exit_code == 1
    assert verify.stderr.splitlines()[0] == f"{blob}: corrupt blob (content hashes to {actual})"

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    denied = run("pull", project.lock_path, "--store", url)
    assert (denied.exit_code, denied.stderr) == (2, f"{url}/: access denied (403): check AWS_ACCESS_KEY_ID/"
                                                    "AWS_SECRET_ACCESS_KEY and the bucket policy\n")


def test_blobs_of_many_ranges_come_down_together_whole(seaweed, tmp_path, monkeypatch):
    """Two blobs of 12 ranges each, pulled at once by one transfer manager: more ranges per object
    than s3transfer's max_in_memory_download_chunks (10). With a download target that cannot seek,
    s3transfer 0.19 deadlocks here (the completion of an object's first range waits for a window the
    same range holds); pull writes in place and hashes in order instead. Run in a thread so that a
    hang fails the test instead of the suite."""
    import threading
    import uuid

    from trtbuild.store.checkout import materialize
    from trtbuild.store.s3 import S3Store

    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    bucket = f"ranges-{uuid.uuid4().hex[:12]}"
    seaweed.client().create_bucket(Bucket=bucket)
    remote = S3Store(f"s3://{bucket}/store", concurrency=4, download_chunk=128 * 1024)
    local = LocalStore(tmp_path / "local")
    files = {f"rank{i}.safetensors": os.urandom(12 * 128 * 1024 - i) for i in range(2)}
    record = make_artifact(local, tmp_path / "a", files, "base-tp1", 1)
    push(local, remote, [PushItem(record, ("tiny", "base-tp1"))])
    fresh = LocalStore(tmp_path / "fresh")
    outcome = []
    pulling = threading.Thread(target=lambda: outcome.append(pull(remote, fresh, record.key)), daemon=True)
    pulling.start()
    pulling.join(timeout=120)
    assert outcome, "the pull did not finish in 120 s"
    assert outcome[0][0] == record.digest
    out = materialize(fresh, record.digest)
    assert {name: (out / name).read_bytes() for name in files} == files


def test_large_blobs_go_up_in_parts_and_come_down_in_ranges_and_nothing_is_hashed_again_after(
        seaweed, tmp_path, monkeypatch):
    """Push sends every blob through one transfer manager (a multi-part upload for a blob above
    part_size, SHA-256 per part) reading the local store's own files in place; pull fetches a large
    blob as parallel ranged GETs, hashed once. Afterwards neither store re-hashes a byte to trust
    its blobs: the pushing store's stat cache still vouches for them, and so does the pulling one's."""
    import uuid

    from trtbuild.store import state as state_module
    from trtbuild.store.checkout import materialize
    from trtbuild.store.s3 import MiB, S3Store

    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    bucket = f"parts-{uuid.uuid4().hex[:12]}"
    seaweed.client().create_bucket(Bucket=bucket)
    remote = S3Store(f"s3://{bucket}/store", part_size=5 * MiB, concurrency=4,
                     download_chunk=2 * MiB)
    local = LocalStore(tmp_path / "local")
    big = os.urandom(13 * MiB + 17)
    files = {"config.json": b'{"a": 1}', "rank0.safetensors": big, "rank1.safetensors": big[::-1]}
    record = make_artifact(local, tmp_path / "a", files, "base-tp1", 1)
    gets = []  # the blob GETs the pull makes: (key, the byte range asked for or None for all of it, If-Match)
    remote.transport.client.meta.events.register(
        "before-parameter-build.s3.GetObject",
        lambda params, **kwargs: gets.append((params["Key"], params.get("Range"), params.get("IfMatch")))
        if "/cas/" in params["Key"] else None)
    heads = []
    remote.transport.client.meta.events.register("before-parameter-build.s3.HeadObject",
                                                 lambda params, **kwargs: heads.append(params["Key"]))
    monkeypatch.setattr(state_module.time, "time_ns", lambda: 2**62)  # every stat cache entry is settled
    hashed = []
    real_file_sha256 = state_module.file_sha256
    monkeypatch.setattr(state_module, "file_sha256", lambda p, progress=None: hashed.append(Path(p).name)
                        or real_file_sha256(p, progress))

    moved = push(local, remote, [PushItem(record, ("tiny", "base-tp1"))])
    assert (moved.blobs, moved.bytes) == (3, sum(len(v) for v in files.values()))
    head = seaweed.client().head_object(Bucket=bucket, Key=remote.transport.blob_key(hashlib.sha256(big).hexdigest()),
                                        ChecksumMode="ENABLED")
    assert head["ETag"].strip('"').endswith("-3")  # 13 MiB in 5 MiB parts
    for entry in local.get_manifest(record.digest).entries:
        local.verify_blob(entry.sha256)
    assert hashed == []  # the pushing store still trusts its blobs

    fresh = LocalStore(tmp_path / "fresh")
    gets.clear(), heads.clear()
    digest, pulled = pull(remote, fresh, record.key)
    assert (digest, pulled.blobs) == (record.digest, 3)
    # every large blob in ranges of download_chunk, each range of the one ETag the first answer gave:
    # a HEAD before the ranges, or, from s3transfer 0.19 on, the first range itself (the rest then ask
    # If-Match its ETag), as boto3's download_file does it; config.json (8 bytes) in one GET
    import s3transfer.download

    first_range_first = hasattr(s3transfer.download, "GetObjectFirstChunkOnDoneCallback")
    expected = [f"bytes={first}-{first + 2 * MiB - 1}" for first in range(0, 12 * MiB, 2 * MiB)] + [f"bytes={12 * MiB}-"]
    for blob in (big, big[::-1]):
        key = remote.transport.blob_key(hashlib.sha256(blob).hexdigest())
        etag = seaweed.client().head_object(Bucket=bucket, Key=key)["ETag"]
        ranges = [(r, match) for k, r, match in gets if k == key]
        assert sorted(r for r, _ in ranges) == sorted(expected)
        assert [r for r, match in ranges if match != etag] == (["bytes=0-2097151"] if first_range_first else [])
        assert heads.count(key) == (0 if first_range_first else 1)
    small = remote.transport.blob_key(hashlib.sha256(files["config.json"]).hexdigest())
    assert len([k for k, _, _ in gets if k == small]) == 1
    out = materialize(fresh, digest)
    assert (out / "rank0.safetensors").read_bytes() == big and (out / "rank1.safetensors").read_bytes() == big[::-1]
    assert hashed == []  # the pulled blobs were hashed as they arrived, once


def test_a_re_push_sends_the_small_requests_of_all_its_artifacts_together(bucket, tmp_path, monkeypatch):
    """Re-pushing N unchanged artifacts costs about one round trip per kind of request, not N: the
    manifest checks, then each artifact's record and ref, go out at once (S3Store.requests_at_once)."""
    import threading
    import time

    from trtbuild.store.s3 import S3Store

    remote = S3Store(bucket)
    local = LocalStore(tmp_path / "local")
    items = [PushItem(make_artifact(local, tmp_path / f"a{i}", three_files(f"a{i}"), f"t{i}-tp1", i + 1), ("tiny", f"t{i}"))
             for i in range(4)]
    push(local, remote, items)
    busy, most = [0], [0]
    lock = threading.Lock()
    original = remote.has_manifest

    def slow_has_manifest(digest):  # held open long enough that requests sent together overlap
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        time.sleep(0.2)
        with lock:
            busy[0] -= 1
        return original(digest)

    monkeypatch.setattr(remote, "has_manifest", slow_has_manifest)
    moved = push(local, remote, items)
    assert (most[0], moved.blobs, moved.skipped_blobs, moved.records, moved.refs) == (4, 0, 12, 4, 4)
    assert [remote.read_ref("tiny", f"t{i}").digest for i in range(4)] == [item.record.digest for item in items]


def test_a_pull_asks_for_the_next_blobs_ranges_before_the_last_one_is_done_and_fsyncs_each(bucket, tmp_path,
                                                                                            monkeypatch):
    """One transfer manager takes every blob of a pull: no drain between files. Here the
    first blob's ranges are held until a range of the second has begun, which happens only when
    both are in one window; each blob is fsynced (off the hashing thread) before it is recorded."""
    import threading

    from trtbuild.store import s3_blobs as s3_module
    from trtbuild.store.s3 import S3Store

    MiB = 1024 * 1024
    remote = S3Store(bucket, concurrency=4, download_chunk=MiB)
    local = LocalStore(tmp_path / "local")
    first_blob, second_blob = os.urandom(2 * MiB), os.urandom(2 * MiB)
    record = make_artifact(local, tmp_path / "a", {"a.safetensors": first_blob, "b.safetensors": second_blob},
                           "base-tp1", 1)
    push(local, remote, [PushItem(record)])
    keys = {remote.transport.blob_key(hashlib.sha256(first_blob).hexdigest()): "first",
            remote.transport.blob_key(hashlib.sha256(second_blob).hexdigest()): "second"}
    second_began = threading.Event()
    first_held = []

    def held(params, **kwargs):  # each GET of a blob, before it is sent
        if params["Key"] not in keys:
            return
        if keys[params["Key"]] == "second":
            second_began.set()
        else:
            first_held.append(second_began.wait(10))

    remote.transport.client.meta.events.register("before-parameter-build.s3.GetObject", held)
    synced = []
    original_sync = s3_module._fsync_and_close
    monkeypatch.setattr(s3_module, "_fsync_and_close", lambda out: (synced.append(Path(out.name).name),
                                                                    original_sync(out))[1])
    fresh = LocalStore(tmp_path / "fresh")
    digest, moved = pull(remote, fresh, record.key)
    assert (digest, moved.blobs, second_began.is_set()) == (record.digest, 2, True)
    assert first_held and all(first_held), "the second blob's ranges were not asked for while the first's were out"
    assert sorted(synced) == sorted(hashlib.sha256(b).hexdigest() for b in (first_blob, second_blob))
    out = materialize_to(fresh, digest, tmp_path / "dest")
    assert ((out / "a.safetensors").read_bytes(), (out / "b.safetensors").read_bytes()) == (first_blob, second_blob)


@pytest.mark.parametrize("damage", ["middle", "truncated", "missing"])
def test_a_damaged_large_blob_is_refused(seaweed, bucket, tmp_path, damage):
    """A large blob comes down in ranges through the transfer manager; one whose bytes differ in the
    middle of a range (the same length: every range succeeds), one shorter than its manifest lists,
    and one that is gone are each refused in one line naming it, and the pulling store records
    nothing: no blob, no manifest, no record, and no partial file left in its tmp/."""
    from trtbuild.store.s3 import MiB, S3Store

    remote = S3Store(f"{bucket}/{damage}", concurrency=4, download_chunk=MiB)
    local = LocalStore(tmp_path / "local")
    big = os.urandom(5 * MiB + 3)
    record = make_artifact(local, tmp_path / "a", {"config.json": b'{"a": 1}', "rank0.safetensors": big},
                           "base-tp1", 1)
    push(local, remote, [PushItem(record)])
    digest = hashlib.sha256(big).hexdigest()
    key, client = remote.transport.blob_key(digest), remote.transport.client
    url = remote.describe_blob(digest)
    if damage == "middle":
        bad = big[:2 * MiB + 100] + bytes([big[2 * MiB + 100] ^ 1]) + big[2 * MiB + 101:]
        client.put_object(Bucket=remote.bucket, Key=key, Body=bad)
        expected = (f"blob {url} is corrupt: its sha256 is {hashlib.sha256(bad).hexdigest()}; "
                    f"run `trtbuild cache verify --store {remote.url}`")
    elif damage == "truncated":
        client.put_object(Bucket=remote.bucket, Key=key, Body=big[:3 * MiB])
        expected = (f"blob {url} is corrupt: its sha256 is {hashlib.sha256(big[:3 * MiB]).hexdigest()}; "
                    f"run `trtbuild cache verify --store {remote.url}`")
    else:
        client.delete_object(Bucket=remote.bucket, Key=key)
        expected = f"blob {digest} is missing from {remote.transport.describe('cas')}"
    fresh = LocalStore(tmp_path / "fresh")
    with pytest.raises(CorruptStore) as caught:
        pull(remote, fresh, record.key)
    assert str(caught.value) == expected
    assert not fresh.has_blob(digest) and not fresh.has_manifest(record.digest)
    assert fresh.get_record(record.key) is None
    assert not [p for p in (tmp_path / "fresh" / "tmp").rglob("*") if p.is_file()]
