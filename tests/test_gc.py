"""`trtbuild cache gc` as a user runs it: what a lock file alone keeps, and `--dry-run`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import NEMO_DATA

TINY_HF = NEMO_DATA / "hf_tiny_llama_tied_bf16"


def trtbuild(*args, store: Path) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "trtbuild", *map(str, args)], capture_output=True, text=True,
                            env={**os.environ, "TRTBUILD_CACHE": str(store)}, timeout=600)
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture
def two_versions(tmp_path):
    """A source built twice (config.json edited in between): (recipe, store, old digest, new digest, old lock).
    The ref now names the new artifact; its history holds both."""
    model = tmp_path / "model"
    shutil.copytree(TINY_HF, model)
    for path in model.iterdir():
        path.chmod(0o644)
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("schema: 1\nname: tiny\nsource: {path: model}\ngpus: [sm90]\n")
    store = tmp_path / "store"

    def build_source() -> str:
        data = json.loads(trtbuild("build", recipe, "--until", "source", "--json", store=store).stdout)
        [source] = [t for t in data["targets"] if t["name"] == "source"]
        assert source["status"] == "built"
        return source["digest"]

    old = build_source()
    old_lock = recipe.with_suffix(".lock").read_bytes()
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-6}))
    new = build_source()
    assert old != new
    return recipe, store, old, new, old_lock


def records(store: Path) -> dict[str, str]:
    """digest -> key of every action record."""
    return {r["artifact"]["hash"]: r["key"] for r in json.loads(trtbuild("cache", "ls", "--json", store=store).stdout)}


def gc(store: Path, *args) -> dict:
    return json.loads(trtbuild("cache", "gc", "--keep-last", "1", "--json", *args, store=store).stdout)


def test_gc_keeps_what_only_a_lock_file_pins_and_drops_it_once_the_lock_file_goes(two_versions):
    recipe, store, old, new, old_lock = two_versions
    lock = recipe.with_suffix(".lock")
    # The lock file as an older commit has it (git checkout): it pins the old artifact, which the ref
    # moved away from and which --keep-last 1 drops from the ref's history. Only the lock protects it.
    lock.write_bytes(old_lock)
    assert yaml.safe_load(lock.read_text())["targets"]["source"]["digest"] == old
    keys = records(store)
    assert set(keys) == {old, new}

    kept = gc(store)
    assert (kept["records"], kept["manifests"], kept["blobs"]) == ([], 0, 0)
    assert set(records(store)) == {old, new}
    assert trtbuild("cache", "verify", store=store).returncode == 0

    lock.unlink()
    removed = gc(store)
    assert removed["records"] == [keys[old]]
    assert (removed["manifests"], removed["blobs"]) == (1, 1)  # only config.json differs between the two
    assert set(records(store)) == {new}
    assert trtbuild("cache", "verify", store=store).returncode == 0


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root: folders as None, files as (size, sha256)."""
    return {p.relative_to(root).as_posix(): None if p.is_dir() else (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*"))}


def test_gc_dry_run_reports_what_gc_then_removes_and_removes_nothing(two_versions):
    recipe, store, old, new, _ = two_versions
    recipe.with_suffix(".lock").unlink()  # nothing pins the old artifact now but the ref's history
    keys = records(store)
    before = snapshot(store)

    dry = gc(store, "--dry-run")
    text = trtbuild("cache", "gc", "--keep-last", "1", "--dry-run", store=store).stdout
    assert snapshot(store) == before  # not a byte moved
    assert text.startswith(f"would remove 1 records, {dry['manifests']} manifests, {dry['blobs']} blobs (")

    real = gc(store)
    assert dry == real
    assert real["records"] == [keys[old]] and (real["manifests"], real["blobs"], real["checkouts"]) == (1, 1, 1)
    assert set(records(store)) == {new}


def test_gc_dry_run_counts_the_leftovers_gc_removes(two_versions):
    _, store, _, _, _ = two_versions
    (store / "tmp" / "blob-of-a-killed-build").write_bytes(b"partial")
    dry = gc(store, "--dry-run")
    assert (store / "tmp" / "blob-of-a-killed-build").exists()
    assert dry == gc(store)


def test_gc_keeps_the_logs_of_the_records_it_keeps(tmp_path):
    """A stage's log is a blob named in its action record, not a file of the artifact: gc must keep
    it as long as the record stays."""
    model = tmp_path / "model"
    shutil.copytree(TINY_HF, model)
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("schema: 1\nname: tiny\nsource: {path: model}\ngpus: [sm90]\n")
    store = tmp_path / "store"
    trtbuild("build", recipe, "--until", "checkpoint", "--no-validate", store=store)
    listed = json.loads(trtbuild("cache", "ls", "--json", store=store).stdout)
    logs = [log["hash"] for r in listed for log in r["execution"]["logs"].values()]
    assert logs, "no stage wrote a log"
    gc(store)
    blobs = store / "cas" / "sha256"
    assert [h for h in logs if not (blobs / h[:2] / h).is_file()] == []


def test_a_fresh_build_leaves_no_manifest_that_nothing_names(tmp_path):
    """Issue #23: a fresh build of the demo left 3 manifests no record, ref or lock names (what
    `cache gc --dry-run` would remove at once): each hf-checkpoint's serving/ overlay, stored as an
    artifact of its own before being merged with its export into the hf-checkpoint."""
    model = tmp_path / "model"
    shutil.copytree(TINY_HF, model)
    for path in model.iterdir():
        path.chmod(0o644)
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("schema: 1\nname: tiny\nsource: {path: model}\ngpus: [sm90]\nbackends: [hf-checkpoint]\n"
                      "variants: {bf16: {}}\nlimits: {max_input_len: 128, max_seq_len: 256}\n")
    store = tmp_path / "store"
    built = json.loads(trtbuild("build", recipe, "--target", "bf16-hf", "--no-validate", "--json", store=store).stdout)
    assert {t["name"]: t["status"] for t in built["targets"]} == {
        "source": "built", "bf16-hf-export": "built", "bf16-hf": "built"}
    named = set(records(store))
    stored = {path.name.removesuffix(".json") for path in (store / "manifests").iterdir()}
    assert len(named) == 3 and stored == named
    dry = json.loads(trtbuild("cache", "gc", "--dry-run", "--json", store=store).stdout)
    assert (dry["records"], dry["manifests"], dry["blobs"]) == ([], 0, 0)
