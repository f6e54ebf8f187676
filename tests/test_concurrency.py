"""Concurrency: four `trtbuild build` processes on overlapping recipes share one local store and
build each key once; two local stores publishing to one S3 store at once lose no ref update and
corrupt nothing. (Four processes on one recipe: tests/test_build.py and tests/test_runner.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import TINY_LLAMA, minimal
from test_crash import dangling
from test_transfer import make_artifact, three_files
from trtbuild.lock import lockfile
from trtbuild.lock.lockfile import LockedRecipe, LockedTarget, LockFile
from trtbuild.recipe.schema import load_recipe
from trtbuild.store.local import LocalStore

TINY_HF = Path(__file__).resolve().parent / "data" / "nemo" / "hf_tiny_llama_tied_bf16"

pytestmark = pytest.mark.reliability


def trtbuild_popen(*args, env: dict, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trtbuild", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **env})


# Four recipes on one source: each shares the source with all, and the bf16 TensorRT-LLM checkpoint
# or the bf16 HF export with some; none is the same recipe as another.
OVERLAPPING = {
    "hf": {"backends": ["hf-checkpoint"], "gpus": ["sm90"]},
    "engine": {"backends": ["engine"], "gpus": ["sm90"]},
    "both": {"backends": ["engine", "hf-checkpoint"], "gpus": ["sm90"]},
    "two-sms": {"backends": ["engine"], "gpus": ["sm89", "sm90"]},
}


def test_four_processes_on_overlapping_recipes_build_each_shared_key_once(tmp_path):
    shutil.copytree(TINY_HF, tmp_path / "model")
    recipes = []
    for name, body in OVERLAPPING.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"schema": 1, "name": name, "source": {"path": "model"},
                                        "variants": {"bf16": {}}, "limits": {"max_input_len": 128, "max_seq_len": 256},
                                        **body}))
        recipes.append(path)
    env = {"TRTBUILD_CACHE": str(tmp_path / "store")}
    procs = [trtbuild_popen("build", r, "--no-validate", "--json", env=env) for r in recipes]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-2000:] for _, err in outputs]

    runs: dict[str, list[tuple[str, str, str]]] = {}  # key -> (recipe, status, digest) of each process that has it
    names: dict[str, set[str]] = {}  # key -> the target names it has
    for recipe, (out, _) in zip(OVERLAPPING, outputs):
        for target in json.loads(out)["targets"]:
            if target["status"] in ("built", "cached"):
                runs.setdefault(target["key"], []).append((recipe, target["status"], target["digest"]))
                names.setdefault(target["key"], set()).add(target["name"])
    shared = {"/".join(sorted(names[key])): sorted(r for r, _, _ in seen) for key, seen in runs.items() if len(seen) > 1}
    assert shared == {"source": sorted(OVERLAPPING), "bf16-tp1": ["both", "engine", "two-sms"],
                      "bf16-hf-export": ["both", "hf"], "bf16-hf": ["both", "hf"]}, runs
    for key, seen in runs.items():
        assert [status for _, status, _ in seen].count("built") == 1, (key, seen)  # built once, the rest waited and hit
        assert len({digest for _, _, digest in seen}) == 1, (key, seen)
    store = LocalStore(tmp_path / "store")
    assert sorted(r.key for r in store.records()) == sorted(runs)  # one record per key
    assert list((store.root / "ac").glob("*.divergent.json")) == []
    verify = subprocess.run([sys.executable, "-m", "trtbuild", "cache", "verify"], capture_output=True, text=True,
                            env={**os.environ, **env})
    assert (verify.returncode, verify.stderr) == (0, "")
    assert dangling(store) == []


# ---- two local stores publishing to one S3 store --------------------------------------------------

class Job:
    """One CI job: a checkout of the same repository (so the same recipe identity), its own local
    store, and a lock naming the artifacts it built for base-tp1 and its validation."""

    def __init__(self, root: Path, name: str, first_key: int) -> None:
        (root / ".git").mkdir(parents=True)
        (root / "recipes").mkdir()
        (root / "recipes" / "config.json").write_text(json.dumps(TINY_LLAMA))
        self.recipe = root / "recipes" / "tiny.yaml"
        self.recipe.write_text(minimal().replace("{config}", "config.json"))
        self.root, self.name, self.n = root, name, first_key
        self.local = LocalStore(root / "store")
        self.local.create()

    def build_round(self, round_: int) -> dict[str, tuple[str, str]]:
        """New artifacts (their bytes name the job and round) under new keys; returns target -> (digest, key)."""
        targets, made = {}, {}
        for target, stage, gates in (("base-tp1", "checkpoint", None), ("base-tp1:validate", "validate", True)):
            self.n += 1
            record = make_artifact(self.local, self.root / "art" / f"{round_}-{target.replace(':', '_')}",
                                   three_files(f"{self.name}-{round_}-{target}"), target, self.n, stage)
            targets[target] = LockedTarget(stage=stage, key=record.key, digest=record.digest, size=record.size,
                                           gates_passed=gates)
            made[target] = (record.digest, record.key)
        lock = LockFile(recipe=LockedRecipe(name="tiny", digest=lockfile.recipe_digest(load_recipe(self.recipe))),
                        source=None, toolchain={}, targets=targets, validation="run")
        self.recipe.with_suffix(".lock").write_text(lockfile.HEADER + yaml.safe_dump(
            lock.model_dump(mode="json", by_alias=True)))
        return made

    def push(self, url: str) -> subprocess.Popen:
        return trtbuild_popen("push", self.recipe, "--store", url, env={"TRTBUILD_CACHE": str(self.local.root)})


@pytest.fixture(scope="module")
def seaweed():
    from s3server import SeaweedS3

    with SeaweedS3() as server:
        yield server


ROUNDS = 4


def test_two_stores_publishing_to_one_s3_store_at_once_lose_no_ref_update(seaweed, tmp_path, monkeypatch):
    from trtbuild.store.s3 import S3Store

    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    seaweed.client().create_bucket(Bucket="two-jobs")
    url = "s3://two-jobs/team"
    jobs = [Job(tmp_path / "sm89-job", "sm89", 0), Job(tmp_path / "sm90-job", "sm90", 1000)]
    published: dict[str, list[tuple[str, str]]] = {"base-tp1": [], "base-tp1:validate": []}
    for round_ in range(ROUNDS):
        for job in jobs:
            for target, entry in job.build_round(round_).items():
                published[target].append(entry)
        procs = [job.push(url) for job in jobs]  # started together
        outputs = [p.communicate(timeout=300) for p in procs]
        assert [(p.returncode, err) for p, (_, err) in zip(procs, outputs)] == [(0, "")] * 2, f"round {round_}"

    remote = S3Store(url)
    for target, entries in published.items():
        ref = remote.read_ref("tiny", target)
        history = [(e.digest, e.key) for e in ref.history]
        assert sorted(history) == sorted(entries), target  # every publish of both jobs, none lost, none twice
        assert (ref.digest, ref.key) == history[-1]
    for digest, key in [e for entries in published.values() for e in entries]:
        assert remote.get_record(key).digest == digest
        assert remote.artifact_problem(digest) is None
    assert dangling(remote) == []
    verify = subprocess.run([sys.executable, "-m", "trtbuild", "cache", "verify", "--store", url], capture_output=True,
                            text=True, env={**os.environ})
    assert (verify.returncode, verify.stderr) == (0, ""), verify.stderr


def test_many_writers_moving_one_s3_ref_at_once_keep_every_entry_of_its_history(seaweed, tmp_path, monkeypatch):
    """update_ref's conditional writes under a real race: 6 writers x 4 updates of one ref, each
    writer with its own client, all released at once; every update is in the history exactly once."""
    import threading

    from trtbuild.store.s3 import S3Store, S3Transport

    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    seaweed.client().create_bucket(Bucket="one-ref")
    writers, updates = 6, 4
    stores = [S3Store("s3://one-ref/team") for _ in range(writers)]
    for store in stores:
        store.read_ref("tiny", "base-tp1")  # clients made before the start
    refused = []  # conditional writes the server turned down: the race was real
    put_if_match, put_if_absent = S3Transport.put_if_match, S3Transport.put_if_absent

    def counted_if_match(self, rel, data, tag):
        written = put_if_match(self, rel, data, tag)
        if not written:
            refused.append(rel)
        return written

    def counted_if_absent(self, rel, data):
        written = put_if_absent(self, rel, data)
        if not written:
            refused.append(rel)
        return written

    monkeypatch.setattr(S3Transport, "put_if_match", counted_if_match)
    monkeypatch.setattr(S3Transport, "put_if_absent", counted_if_absent)
    start, failures = threading.Barrier(writers), []

    def write(w: int) -> None:
        start.wait()
        try:
            for u in range(updates):
                stores[w].update_ref("tiny", "base-tp1", f"{w:032x}{u:032x}", f"{w * 100 + u:064x}")
        except Exception as exc:  # reported below, with the writer
            failures.append(f"writer {w}: {exc}")

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == []
    assert len(refused) > 0, "no write was refused: the writers did not race"
    history = [(e.digest, e.key) for e in stores[0].read_ref("tiny", "base-tp1").history]
    assert sorted(history) == sorted((f"{w:032x}{u:032x}", f"{w * 100 + u:064x}")
                                     for w in range(writers) for u in range(updates))
    for w in range(writers):  # each writer's updates in the order it made them
        assert [k for _, k in history if int(k, 16) // 100 == w] == [f"{w * 100 + u:064x}" for u in range(updates)]
