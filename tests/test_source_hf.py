"""Hugging Face sources against the fake hub in tests/hubserver.py (the real huggingface_hub client)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hubserver import FakeRepo, HubServer, git_blob_id
from conftest import NEMO_DATA

TINY_HF = NEMO_DATA / "hf_tiny_llama_tied_bf16"
REPO = "org/tiny-llama"
TOKEN = "hf_test_token_with_access"


@functools.lru_cache(maxsize=None)
def _model_files() -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in TINY_HF.iterdir()}
    files["README.md"] = b"# a tiny llama\n"
    files["pytorch_model.bin"] = b"the same weights in another format"
    files["original/consolidated.pth"] = b"yet another format"
    return files


def model_files() -> dict[str, bytes]:
    """The repository's files: a real tiny LLaMA (tests/data) and files a model does not need."""
    return dict(_model_files())


SELECTED = {name for name in model_files() if name not in ("README.md", "pytorch_model.bin", "original/consolidated.pth")}


@pytest.fixture
def hub():
    with HubServer({REPO: FakeRepo(model_files(), tags={"v1": None}),
                    "org/gated": FakeRepo(model_files(), gated_token=TOKEN),
                    "org/custom-code": FakeRepo({**model_files(), "config.json": json.dumps(
                        {**json.loads(model_files()["config.json"]), "auto_map": {"AutoModel": "modeling.MyModel"}}).encode()}),
                    }) as server:
        yield server


class Env:
    def __init__(self, tmp_path: Path, hub: HubServer) -> None:
        self.tmp = tmp_path
        self.hub = hub
        self.store = tmp_path / "store"
        self.hf_home = tmp_path / "hf"
        self.vars = {**os.environ, **hub.env(self.hf_home), "TRTBUILD_CACHE": str(self.store)}
        for name in ("HF_TOKEN", "HF_HUB_OFFLINE"):
            self.vars.pop(name, None)

    def recipe(self, repo: str = REPO, revision: str = "main", extra: str = "") -> Path:
        path = self.tmp / "hf.yaml"
        path.write_text(f"schema: 1\nname: hf-tiny\nsource: {{hf: {repo}, revision: '{revision}'{extra}}}\n"
                        "gpus: [sm90]\nlimits: {max_input_len: 128, max_seq_len: 256}\n")
        return path

    def trtbuild(self, *args, **env):
        merged = {**self.vars, **{k: v for k, v in env.items() if v is not None}}
        for name, value in env.items():
            if value is None:
                merged.pop(name, None)
        return subprocess.run([sys.executable, "-m", "trtbuild", *map(str, args)], capture_output=True, text=True,
                              env=merged, timeout=300)

    def build(self, recipe: Path, *args, **env) -> dict:
        result = self.trtbuild("build", recipe, "--until", "source", "--json", *args, **env)
        assert result.returncode == 0, result.stderr
        return next(t for t in json.loads(result.stdout)["targets"] if t["name"] == "source")


@pytest.fixture
def env(tmp_path, hub) -> Env:
    return Env(tmp_path, hub)


def test_build_downloads_only_model_files_and_verifies_them(env, hub):
    source = env.build(env.recipe())
    assert source["status"] == "built"
    folder = Path(source["path"])
    assert {p.name for p in folder.iterdir() if not p.name.startswith(".")} == SELECTED
    for name in SELECTED:
        assert (folder / name).read_bytes() == model_files()[name]
    downloaded = {path.rsplit("/", 1)[-1] for path in hub.downloads}
    assert "README.md" not in downloaded and "pytorch_model.bin" not in downloaded
    assert not any("consolidated" in d for d in downloaded)
    # the files went through the user's Hugging Face cache
    assert (env.hf_home / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs").is_dir()


def test_a_cached_recipe_decides_without_downloading(env, hub):
    first = env.build(env.recipe())
    hub.clear()
    second = env.build(env.recipe())
    assert second["status"] == "cached" and second["key"] == first["key"]
    assert hub.downloads == []  # metadata only
    assert all(path.startswith("/api/") for _, path in hub.requests)


def test_branch_tag_and_commit_resolve_to_one_source(env, hub):
    commit = hub.repos[REPO].commit
    main = env.build(env.recipe(revision="main"))
    assert env.build(env.recipe(revision="v1"))["digest"] == main["digest"]
    by_commit = env.build(env.recipe(revision=commit))
    assert by_commit["digest"] == main["digest"]
    lock = yaml.safe_load(env.recipe(revision=commit).with_suffix(".lock").read_text())["source"]
    assert lock["kind"] == "hf" and lock["location"] == REPO and lock["commit"] == commit and lock["revision"] == commit
    assert set(lock["files"]) == SELECTED
    weights = model_files()["model.safetensors"]
    assert lock["files"]["model.safetensors"] == "sha256:" + hashlib.sha256(weights).hexdigest()
    assert lock["files"]["config.json"] == "git-sha1:" + git_blob_id(model_files()["config.json"])


def test_a_pinned_commit_with_a_lock_never_touches_the_hub(env, hub):
    commit = hub.repos[REPO].commit
    recipe = env.recipe(revision=commit)
    env.build(recipe)
    hub.clear()
    again = env.build(recipe)
    assert again["status"] == "cached" and hub.requests == []


def test_a_moved_branch_is_a_new_source_and_changed_weights_a_new_artifact(env, hub):
    first = env.build(env.recipe())
    files = model_files()
    hub.push(REPO, {**files, "README.md": b"# edited readme only\n"})
    hub.clear()
    readme_only = env.build(env.recipe())
    assert readme_only["key"] != first["key"]  # a new commit is a new source...
    assert readme_only["digest"] == first["digest"]  # ...with the same files: downstream keys do not change
    assert not any(p.endswith(hashlib.sha256(files["model.safetensors"]).hexdigest()) for p in hub.downloads)

    hub.push(REPO, {**files, "model.safetensors": files["model.safetensors"][::-1]})
    new_weights = env.build(env.recipe())
    assert new_weights["status"] == "built" and new_weights["digest"] != first["digest"]


def test_offline_builds_from_the_lock_and_the_cache(env, hub):
    recipe = env.recipe()
    first = env.build(recipe)
    hub.clear()
    offline = env.build(recipe, HF_HUB_OFFLINE="1")
    assert offline["status"] == "cached" and offline["key"] == first["key"] and hub.requests == []
    # no lock: the Hugging Face cache alone answers (blob names are the hashes)
    recipe.with_suffix(".lock").unlink()
    assert env.build(recipe, HF_HUB_OFFLINE="1")["key"] == first["key"]
    # a fresh store, offline: the files come from the Hugging Face cache
    fresh = env.build(recipe, HF_HUB_OFFLINE="1", TRTBUILD_CACHE=str(env.tmp / "store2"))
    assert fresh["status"] == "built" and fresh["digest"] == first["digest"] and hub.requests == []


def test_offline_without_lock_or_cache_is_an_input_error(env):
    (env.tmp / "config.json").write_text(model_files()["config.json"].decode())
    result = env.trtbuild("build", env.recipe(revision="v1", extra=", config: config.json"), "--until", "source",
                          HF_HUB_OFFLINE="1")
    assert result.returncode == 2
    assert result.stderr.strip() == (f"source.hf: {REPO}@v1: HF_HUB_OFFLINE is set and neither the lock file "
                                     "nor the Hugging Face cache knows this revision")


def test_gated_repositories_need_a_token(env, hub):
    recipe = env.recipe(repo="org/gated")
    result = env.trtbuild("build", recipe, "--until", "source")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"source.hf: org/gated is gated: request access at {hub.url}/org/gated and set HF_TOKEN to a token of an "
        "account that has it")
    assert not list(env.store.glob("ac/*.json"))  # nothing recorded, nothing half-written
    wrong = env.trtbuild("build", recipe, "--until", "source", HF_TOKEN="hf_wrong")
    assert wrong.returncode == 2 and wrong.stderr.strip() == result.stderr.strip()
    assert env.build(recipe, HF_TOKEN=TOKEN)["status"] == "built"
    for path in [recipe.with_suffix(".lock"), *env.store.rglob("*.json")]:
        assert TOKEN not in path.read_text()


@pytest.mark.parametrize("repo, revision, message", [
    ("org/missing", "main", "source.hf: org/missing: repository not found at {url}/org/missing (set HF_TOKEN if it is private)"),
    (REPO, "no-such-branch", f"source.hf: {REPO} has no revision 'no-such-branch' (a branch, tag or commit)"),
])
def test_missing_repositories_and_revisions(env, hub, repo, revision, message):
    (env.tmp / "config.json").write_text(model_files()["config.json"].decode())
    recipe = env.recipe(repo=repo, revision=revision, extra=", config: config.json")
    result = env.trtbuild("build", recipe, "--until", "source")
    assert result.returncode == 2
    assert result.stderr.strip() == message.format(url=hub.url)


def test_a_corrupted_download_is_refused(env, hub):
    env.build(env.recipe())
    weights = model_files()["model.safetensors"]
    blob = env.hf_home / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs" / hashlib.sha256(weights).hexdigest()
    blob.chmod(0o644)
    blob.write_bytes(b"\0" + weights[1:])
    result = env.trtbuild("build", env.recipe(), "--until", "source", TRTBUILD_CACHE=str(env.tmp / "store2"))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"source.hf: {REPO}@{hub.repos[REPO].commit[:12]}: model.safetensors does not "
                                     f"match the hub's hash (expected sha256:{hashlib.sha256(weights).hexdigest()}, "
                                     f"got sha256:{hashlib.sha256(blob.read_bytes()).hexdigest()})")
    assert not list((env.tmp / "store2" / "ac").glob("*.json"))


def test_remote_code_is_refused_unless_the_recipe_trusts_it(env):
    result = env.trtbuild("build", env.recipe(repo="org/custom-code"), "--until", "source")
    assert result.returncode == 2
    assert result.stderr.strip() == ("source.hf: org/custom-code runs custom code (config.json has auto_map); "
                                     "set source.trust_remote_code: true only if you trust it")
    trusted = env.recipe(repo="org/custom-code", extra=", trust_remote_code: true")
    assert env.build(trusted)["status"] == "built"


def test_plan_fetches_only_config_json(env, hub):
    result = env.trtbuild("plan", env.recipe(), "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["model"]["architecture"] == "LlamaForCausalLM"
    assert [p.rsplit("/", 1)[-1] for p in hub.downloads] == ["config.json"]


def test_explain_shows_the_commit_and_file_hashes(env, hub):
    recipe = env.recipe()
    env.build(recipe)
    result = env.trtbuild("explain", recipe, "source", "--json")
    assert result.returncode == 0, result.stderr
    fields = {f["field"]: f for f in json.loads(result.stdout)[0]["fields"]}
    assert fields["source.commit"]["value"] == hub.repos[REPO].commit
    assert fields["source.revision"]["value"] == "main"
    weights = hashlib.sha256(model_files()["model.safetensors"]).hexdigest()
    assert fields["source.files.model.safetensors"]["value"] == f"sha256:{weights}"


def test_an_invalid_repository_id_is_one_line(tmp_path):
    """The recipe schema admits ids huggingface_hub refuses (`--`, `..`): plan says so in one line."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("schema: 1\nname: r\nsource: {hf: org/a--b, revision: main}\ngpus: [sm90]\n")
    result = subprocess.run([sys.executable, "-m", "trtbuild", "plan", str(recipe)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr == ("source.hf: 'org/a--b' is not a valid repository id "
                             "(Cannot have -- or .. in repo_id: 'org/a--b'.)\n")
