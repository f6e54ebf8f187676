"""The recipe's `publish.store`: the default store of push, pull and ls, and the read-through
remote of build when it is s3:// (`--store` always wins); the lock records it for `pull LOCK`.
Against a real S3 server (SeaweedFS on 127.0.0.1, credentials enforced) like test_build_remote."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import minimal
from test_build_remote import FAST, TINY_HF, messages
from test_transfer import bucket, project, seaweed  # noqa: F401 (fixtures)
from trtbuild.lock import lockfile
from trtbuild.recipe.schema import load_recipe
from trtbuild.store.local import LocalStore

RECIPE = ("schema: 1\nname: tiny\nsource: {path: model}\nvariants: {bf16: {}}\ngpus: [sm90]\n"
          "limits: {max_input_len: 128, max_seq_len: 256}\nbackends: [engine]\n"
          "validate: {samples: 2, seq_len: 32}\n")
# the checkpoint and its torch validation: a target only a validation that ran and passed publishes
# (trtbuild/lock/publication.py), and only a published one is pulled
VALIDATED = ("--until", "validate", "--json")


@pytest.mark.parametrize("value, why", [
    ("http://bucket/prefix", "'http://bucket/prefix' is not a store: a folder or s3://BUCKET/PREFIX"),
    ("s3://", "'s3://' is not a store: a folder or s3://BUCKET/PREFIX"),
    ("s3://Bad_Bucket/x", "'s3://Bad_Bucket/x' is not a store: a folder or s3://BUCKET/PREFIX"),
])
def test_a_malformed_publish_store_is_one_line_naming_the_file_and_the_key(ws, run, value, why):
    recipe = ws.recipe(minimal(f"publish:\n  store: '{value}'"))
    result = run("plan", recipe)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == f"{recipe}:8:10: publish.store: {why}\n"


def test_push_without_store_or_publish_store_is_one_line_naming_the_recipe(project, run):  # noqa: F811
    project.add("base-tp1")
    project.write_lock()
    result = run("push", project.recipe)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"{project.recipe}: no store to push to: pass --store URL or set `publish.store` "
                             "in the recipe\n")
    result = run("pull", project.recipe)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"{project.recipe}: no store to pull from: pass --store URL or set `publish.store` "
                             "in the recipe\n")
    result = run("pull", project.lock_path)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"{project.lock_path}: no store to pull from: pass --store URL (the lock records no "
                             "`publish.store`)\n")


def test_a_folder_publish_store_is_relative_to_the_recipe_and_push_pull_ls_use_it(project, run, tmp_path):  # noqa: F811
    project.recipe.write_text(project.recipe.read_text() + "publish:\n  store: shared\n")
    project.add("base-tp1")
    project.add("base-tp1:validate", "validate", gates_passed=True)
    project.write_lock()
    shared = project.recipe.parent / "shared"
    pushed = run("push", project.recipe)  # the first push makes the folder store
    assert (pushed.exit_code, pushed.stderr) == (0, f"new store at {shared}\n")
    assert pushed.stdout.splitlines()[-1].endswith(f"-> {shared}")
    assert LocalStore(shared).read_ref("tiny", "base-tp1").digest == project.targets["base-tp1"].digest
    listed = run("ls", project.recipe, "--json")
    assert (listed.exit_code, json.loads(listed.stdout)["store"]) == (0, str(shared))
    fresh = tmp_path / "fresh"
    pulled = run("pull", project.recipe, "--target", "base-tp1", "--dest", fresh)
    assert (pulled.exit_code, pulled.stderr, pulled.stdout) == (0, "", f"{fresh}\n")


class Host:
    """A CI checkout (a git work tree holding the recipe and the model) and its own local store."""

    def __init__(self, root, monkeypatch, body: str) -> None:
        self.repo = root / "repo"
        (self.repo / ".git").mkdir(parents=True)
        shutil.copytree(TINY_HF, self.repo / "model")
        self.recipe = self.repo / "tiny.yaml"
        self.recipe.write_text(body)
        self.store = LocalStore(root / "cache")
        self.monkeypatch = monkeypatch

    def run(self, run, command, *args):
        self.monkeypatch.setenv("TRTBUILD_CACHE", str(self.store.root))
        return run(command, self.recipe, *args)


def test_build_reads_through_and_pushes_to_an_s3_publish_store_and_pull_lock_defaults_to_it(
        bucket, tmp_path, monkeypatch, run, seaweed):
    configured = RECIPE + f"publish: {{store: '{bucket}'}}\n"
    a = Host(tmp_path / "a", monkeypatch, configured)
    first = a.run(run, "build", *VALIDATED, "--push")
    assert (first.exit_code, messages(first)) == (0, f"new store at {a.store.root}\n")
    out = json.loads(first.stdout)
    assert (out["push"]["store"], out["push"]["pushed"]) == (bucket, ["bf16-tp1"])
    lock = lockfile.read(a.recipe.with_suffix(".lock"))
    assert lock.recipe.publish_store == bucket

    # publish.store is no action key's input: the keys are those of the recipe without it
    plain = Host(tmp_path / "plain", monkeypatch, RECIPE)
    alone = plain.run(run, "build", *VALIDATED)
    assert alone.exit_code == 0
    assert {t["name"]: t["key"] for t in json.loads(alone.stdout)["targets"]} == \
        {t["name"]: t["key"] for t in out["targets"]}
    assert "publish_store" not in plain.recipe.with_suffix(".lock").read_text()  # a lock without it: unchanged

    b = Host(tmp_path / "b", monkeypatch, configured)
    second = b.run(run, "build", *FAST)
    assert (second.exit_code, messages(second)) == (0, f"new store at {b.store.root}\n")
    done = [t for t in json.loads(second.stdout)["targets"] if t["digest"]]
    assert {(t["status"], t["origin"]) for t in done} == {("cached", "remote")}

    # a deploy host with only the lock file: pull defaults to the store the lock records
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    shutil.copy(a.recipe.with_suffix(".lock"), deploy / "tiny.lock")
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "deploy-cache"))
    pulled = run("pull", deploy / "tiny.lock", "--target", "bf16-tp1", "--dest", deploy / "model", "--json")
    assert (pulled.exit_code, pulled.stderr) == (0, f"new store at {tmp_path / 'deploy-cache'}\n")
    assert json.loads(pulled.stdout)["digest"] == lock.targets["bf16-tp1"].digest

    # --store wins over publish.store: an empty bucket has nothing
    seaweed.client().create_bucket(Bucket="empty")
    other = run("pull", deploy / "tiny.lock", "--target", "bf16-tp1", "--store", "s3://empty/x")
    assert (other.exit_code, other.stdout) == (2, "")
    assert other.stderr == "store s3://empty/x: not a trtbuild store (nothing has been pushed there)\n"


def test_build_with_a_folder_publish_store_builds_into_the_local_store_and_push_refuses_it_one_line(
        tmp_path, monkeypatch, run):
    a = Host(tmp_path / "a", monkeypatch, RECIPE + "publish: {store: shared}\n")
    result = a.run(run, "build", *FAST, "--push")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"--push: {a.recipe}: publish.store {a.repo / 'shared'} is a folder; build --push "
                             f"publishes to s3:// only (`trtbuild push {a.recipe}` publishes to the folder)\n")
    built = a.run(run, "build", *FAST)
    assert built.exit_code == 0
    assert a.store.exists() and not (a.repo / "shared").exists()


def test_the_lock_records_publish_store_verbatim_and_no_field_without_it(ws):
    recipe = ws.recipe(minimal("publish: {store: ../shared}"))
    loaded = load_recipe(recipe)
    lock = lockfile.write(recipe.with_suffix(".lock"), loaded, None, [], {})
    assert lock.recipe.publish_store == "../shared"
    assert "publish_store: ../shared\n" in recipe.with_suffix(".lock").read_text()
