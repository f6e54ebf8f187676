"""`trtbuild build --store s3://...` (the local store in front of a remote one: a local miss is
pulled, verified, from the remote's action cache instead of built) and `build --push`, against a real
S3 server (SeaweedFS on 127.0.0.1, credentials enforced), with the tiny real model as a path source."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import NEMO_DATA
from trtbuild.keys import canonical_json
from trtbuild.store.records import dump
from trtbuild.store.hash import atomic_write
from trtbuild.store.local import LocalStore

TINY_HF = NEMO_DATA / "hf_tiny_llama_tied_bf16"
URL = "s3://artifacts/ci"
FAST = ("--until", "checkpoint", "--no-validate", "--json")


@pytest.fixture(scope="module")
def seaweed():
    from s3server import SeaweedS3

    with SeaweedS3() as server:
        server.client().create_bucket(Bucket="artifacts")
        yield server


@pytest.fixture
def s3env(seaweed, monkeypatch):
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield seaweed
    bucket = seaweed.client().list_objects_v2(Bucket="artifacts").get("Contents", [])
    for obj in bucket:  # each test starts from an empty bucket
        seaweed.client().delete_object(Bucket="artifacts", Key=obj["Key"])


class Host:
    """A CI checkout (a git work tree holding the recipe and the model) and its own local store."""

    def __init__(self, root: Path, monkeypatch) -> None:
        self.repo = root / "repo"
        (self.repo / ".git").mkdir(parents=True)
        shutil.copytree(TINY_HF, self.repo / "model")
        self.recipe = self.repo / "tiny.yaml"
        self.recipe.write_text("schema: 1\nname: tiny\nsource: {path: model}\nvariants: {bf16: {}}\ngpus: [sm90]\n"
                               "limits: {max_input_len: 128, max_seq_len: 256}\nbackends: [engine]\n")
        self.store = LocalStore(root / "cache")
        self.monkeypatch = monkeypatch

    def build(self, run, *args):
        self.monkeypatch.setenv("TRTBUILD_CACHE", str(self.store.root))
        return run("build", self.recipe, *args)


PROGRESS = re.compile(r" *(built|cached|failed|skipped|impossible) \S+ \(")


def messages(result) -> str:
    """stderr without the progress reporter's one line per node (their seconds vary)."""
    return "".join(line for line in result.stderr.splitlines(keepends=True) if not PROGRESS.match(line))


def by_name(result) -> dict[str, dict]:
    return {t["name"]: t for t in json.loads(result.stdout)["targets"]}


def host(tmp_path, name, monkeypatch) -> Host:
    return Host(tmp_path / name, monkeypatch)


def built_on_a(tmp_path, monkeypatch, run):
    a = host(tmp_path, "a", monkeypatch)
    result = a.build(run, *FAST, "--store", URL, "--push", "--allow-unvalidated")
    assert (result.exit_code, messages(result)) == (0, f"new store at {a.store.root}\n")
    return a, json.loads(result.stdout)


def test_host_b_pulls_every_node_host_a_pushed_and_builds_nothing(s3env, tmp_path, monkeypatch, run):
    a, first = built_on_a(tmp_path, monkeypatch, run)
    done_a = {t["name"]: t for t in first["targets"] if t["digest"]}
    assert {n: (t["status"], t["origin"], t["pulled"]) for n, t in done_a.items()} == {
        "source": ("built", "built", None), "bf16-tp1": ("built", "built", None)}
    blobs = {e.sha256 for d in done_a.values() for e in a.store.get_manifest(d["digest"]).entries}
    assert first["push"] == {"store": URL, "pushed": ["bf16-tp1"], "refused": [], "moved": {
        "blobs": len(blobs), "bytes": sum(a.store.blob_path(b).stat().st_size for b in blobs), "skipped_blobs": 0,
        "records": 2, "refs": 2, "divergences": []}}
    from trtbuild.store.s3 import S3Store

    # the lock file goes up last, so a remote `cache gc` keeps what it pins
    assert S3Store(URL).transport.get("locks/tiny.lock").data == a.recipe.with_suffix(".lock").read_bytes()

    b = host(tmp_path, "b", monkeypatch)
    result = b.build(run, *FAST, "--store", URL)  # b's local store is new: pulled nodes are stored in it
    assert (result.exit_code, messages(result)) == (0, f"new store at {b.store.root}\n")
    targets = by_name(result)
    done_b = {n: t for n, t in targets.items() if t["digest"]}
    assert set(done_b) == set(done_a) and not any(t["status"] == "built" for t in targets.values())
    for name, target in done_b.items():
        entries = b.store.get_manifest(target["digest"]).entries
        assert (target["status"], target["origin"], target["note"], target["key"], target["digest"]) == (
            "cached", "remote", None, done_a[name]["key"], done_a[name]["digest"])
        assert target["pulled"] == {"store": URL, "blobs": len({e.sha256 for e in entries}),
                                    "bytes": sum(e.size for e in {e.sha256: e for e in entries}.values()),
                                    "skipped_blobs": 0, "records": 0, "refs": 0, "divergences": []}
        for entry in entries:  # every byte on host B is what host A built
            assert hashlib.sha256(b.store.blob_path(entry.sha256).read_bytes()).hexdigest() == entry.sha256
        assert b.store.get_record(target["key"]).digest == target["digest"]
        assert b.store.artifact_problem(target["digest"]) is None
        ref = b.store.read_ref("tiny", name)  # a --no-validate build publishes no target (publication.py)
        assert (ref is None) if target["stage"] == "checkpoint" else ref.digest == target["digest"]

    human = host(tmp_path, "d", monkeypatch).build(run, "--until", "checkpoint", "--no-validate", "--store", URL)
    assert human.exit_code == 0
    assert f"tiny: 2 cached, 1 skipped ({len(done_a)} pulled from {URL})" in human.stdout
    assert "Nothing was built" in human.stdout

    again = b.build(run, *FAST, "--store", URL)  # now the local store has it all: nothing is pulled
    assert {n: (t["status"], t["origin"], t["pulled"]) for n, t in by_name(again).items() if t["digest"]} == {
        n: ("cached", "local", None) for n in done_a}


def test_a_blob_damaged_in_the_bucket_is_not_served_the_node_is_built_here(s3env, tmp_path, monkeypatch, run):
    a, first = built_on_a(tmp_path, monkeypatch, run)
    checkpoint = next(t for t in first["targets"] if t["name"] == "bf16-tp1")
    victim = max(a.store.get_manifest(checkpoint["digest"]).entries, key=lambda e: e.size)
    key = f"ci/cas/sha256/{victim.sha256[:2]}/{victim.sha256}"
    tampered = b"X" * victim.size
    s3env.client().put_object(Bucket="artifacts", Key=key, Body=tampered)

    c = host(tmp_path, "c", monkeypatch)
    result = c.build(run, *FAST, "--store", URL)
    assert (result.exit_code, messages(result)) == (0, f"new store at {c.store.root}\n")
    targets = by_name(result)
    assert (targets["source"]["status"], targets["source"]["origin"]) == ("cached", "remote")
    rebuilt = targets["bf16-tp1"]
    blob = f"s3://artifacts/{key}"
    assert (rebuilt["status"], rebuilt["origin"], rebuilt["pulled"]) == ("built", "built", None)
    assert rebuilt["note"] == (f"not pulled from {URL}: its artifact is damaged there (blob {blob} is corrupt: its "
                               f"sha256 is {hashlib.sha256(tampered).hexdigest()}; run `trtbuild cache verify --store {URL}`)")
    assert rebuilt["digest"] == checkpoint["digest"]  # the same bytes, built here
    assert hashlib.sha256(c.store.blob_path(victim.sha256).read_bytes()).hexdigest() == victim.sha256


def test_push_refuses_an_unvalidated_build_and_a_stand_in_like_trtbuild_push(s3env, tmp_path, monkeypatch, run):
    a = host(tmp_path, "a", monkeypatch)
    refused = a.build(run, *FAST, "--store", URL, "--push")
    assert refused.exit_code == 1
    assert messages(refused) == f"new store at {a.store.root}\n" \
        "bf16-tp1: held back: built with --no-validate; not pushed without --allow-unvalidated\n"
    assert json.loads(refused.stdout)["push"]["moved"]["blobs"] == 0
    assert s3env.client().list_objects_v2(Bucket="artifacts").get("KeyCount") == 0  # not even its source

    checkpoint = a.store.get_record(by_name(refused)["bf16-tp1"]["key"])  # as if a stand-in had made it
    standin = checkpoint.model_copy(update={"toolchain": {**checkpoint.toolchain, "tensorrt_llm": "1.2.1+standin"}})
    atomic_write(a.store.record_path(checkpoint.key), canonical_json(dump(standin)) + b"\n")
    again = a.build(run, *FAST, "--store", URL, "--push", "--allow-unvalidated")
    assert (again.exit_code, messages(again)) == (
        1, "bf16-tp1: made by a stand-in toolchain (tensorrt_llm); stand-ins are never pushed\n")
    assert s3env.client().list_objects_v2(Bucket="artifacts").get("KeyCount") == 0


def test_push_without_a_remote_store_is_one_line_and_exit_2(tmp_path, monkeypatch, run):
    a = host(tmp_path, "a", monkeypatch)
    result = a.build(run, *FAST, "--store", tmp_path / "folder", "--push")
    assert (result.exit_code, result.stdout, result.stderr) == (
        2, "", "--push: needs a remote store to publish to (--store s3://BUCKET/PREFIX, or the recipe's `publish.store`)\n")
    assert not (tmp_path / "folder").exists()


def test_wrong_credentials_for_the_remote_are_one_line_before_anything_is_built(s3env, tmp_path, monkeypatch, run):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    a = host(tmp_path, "a", monkeypatch)
    result = a.build(run, *FAST, "--store", URL)
    assert (result.exit_code, result.stdout, result.stderr) == (
        2, "", f"{URL}/: access denied (403): check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and the bucket policy\n")
    assert not a.store.root.exists()


def test_a_malformed_record_in_the_bucket_is_a_miss_the_node_is_built_here(s3env, tmp_path, monkeypatch, run):
    _, first = built_on_a(tmp_path, monkeypatch, run)
    source = next(t for t in first["targets"] if t["name"] == "source")
    s3env.client().put_object(Bucket="artifacts", Key=f"ci/ac/{source['key']}.json", Body=b"not json")
    c = host(tmp_path, "c", monkeypatch)
    result = c.build(run, *FAST, "--store", URL)
    assert (result.exit_code, messages(result)) == (0, f"new store at {c.store.root}\n")
    built = by_name(result)["source"]
    assert (built["status"], built["origin"], built["digest"]) == ("built", "built", source["digest"])
    assert built["note"] == (f"not pulled from {URL}: action record {URL}/ac/{source['key']}.json is not valid JSON; "
                             "run `trtbuild cache verify --repair`")
    assert by_name(result)["bf16-tp1"]["origin"] == "remote"  # its input is the same artifact: still pulled
