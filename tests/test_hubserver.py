"""The fake hub in hubserver.py, checked with the real huggingface_hub client (in-process and in subprocesses)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder

from hubserver import FakeRepo, HubServer, git_blob_id, lfs_pointer, use_hub

REPO = "org/tiny"
CONFIG = json.dumps({"model_type": "llama", "hidden_size": 64}).encode()
WEIGHTS = bytes(range(256)) * 40  # LFS by suffix
FILES = {
    "config.json": CONFIG,
    "model.safetensors": WEIGHTS,
    "tokenizer/vocab.txt": b"a\nb\nc\n",
    "README.md": b"# tiny\n",
}
TOKEN = "hf_right_token"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def hf_home(tmp_path) -> Path:
    return tmp_path / "hf"


@pytest.fixture
def hub(monkeypatch, hf_home):
    repos = {
        REPO: FakeRepo(dict(FILES), tags={"v1.0": None}),
        "org/gated": FakeRepo({"config.json": CONFIG, "model.safetensors": WEIGHTS}, gated_token=TOKEN),
    }
    with HubServer(repos) as server:
        use_hub(monkeypatch, server, hf_home)
        yield server


def run_py(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run Python in a subprocess with this process's environment (as use_hub left it) plus ``env``."""
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)


def test_model_info_with_files_metadata(hub):
    repo = hub.repos[REPO]
    info = HfApi().model_info(REPO, revision="main", files_metadata=True)
    assert info.id == REPO and info.sha == repo.commit and len(repo.commit) == 40
    siblings = {s.rfilename: s for s in info.siblings}
    assert set(siblings) == set(FILES)
    for path, data in FILES.items():
        assert siblings[path].size == len(data)
    cfg, weights = siblings["config.json"], siblings["model.safetensors"]
    assert cfg.lfs is None and cfg.blob_id == git_blob_id(CONFIG) == hashlib.sha1(
        b"blob %d\0" % len(CONFIG) + CONFIG).hexdigest()
    assert weights.lfs.sha256 == sha256(WEIGHTS) and weights.lfs.size == len(WEIGHTS)
    assert weights.lfs.pointer_size == len(lfs_pointer(WEIGHTS))
    assert weights.blob_id == git_blob_id(lfs_pointer(WEIGHTS))  # git stores the pointer for LFS files
    # without files_metadata the hub lists names only; the server URL is what the client used
    plain = HfApi().model_info(REPO)
    assert plain.sha == repo.commit and plain.siblings[0].size is None
    assert ("GET", f"/api/models/{REPO}/revision/main") in hub.requests
    assert ("GET", f"/api/models/{REPO}") in hub.requests


def test_list_repo_tree_and_refs(hub):
    api = HfApi()
    top = {e.path: e for e in api.list_repo_tree(REPO, revision="v1.0")}
    assert set(top) == {"config.json", "model.safetensors", "tokenizer", "README.md"}
    assert isinstance(top["tokenizer"], RepoFolder) and isinstance(top["config.json"], RepoFile)
    everything = {e.path: e for e in api.list_repo_tree(REPO, recursive=True, expand=True)}
    assert "tokenizer/vocab.txt" in everything
    weights = everything["model.safetensors"]
    assert weights.lfs.sha256 == sha256(WEIGHTS) and weights.size == len(WEIGHTS)
    assert weights.last_commit.oid == hub.repos[REPO].commit
    sub = [e.path for e in api.list_repo_tree(REPO, path_in_repo="tokenizer")]
    assert sub == ["tokenizer/vocab.txt"]
    refs = api.list_repo_refs(REPO)
    assert [(b.name, b.target_commit) for b in refs.branches] == [("main", hub.repos[REPO].commit)]
    assert [(t.name, t.ref) for t in refs.tags] == [("v1.0", "refs/tags/v1.0")]


def test_hf_hub_download_caches_and_second_call_downloads_nothing(hub, hf_home):
    for name in ("config.json", "model.safetensors"):
        path = Path(hf_hub_download(REPO, name, revision="main"))
        assert path.read_bytes() == FILES[name]
        assert str(path).startswith(str(hf_home / "hub" / "models--org--tiny" / "snapshots" / hub.repos[REPO].commit))
    blobs = hf_home / "hub" / "models--org--tiny" / "blobs"
    assert (blobs / git_blob_id(CONFIG)).exists() and (blobs / sha256(WEIGHTS)).exists()
    assert hub.downloads == [f"/{REPO}/resolve/main/config.json", f"/cdn-lfs/{sha256(WEIGHTS)}"]

    hub.clear()
    assert Path(hf_hub_download(REPO, "model.safetensors", revision="main")).read_bytes() == WEIGHTS
    # metadata only: at most the HEAD that checks the branch (under load the client may time it out
    # and use its cache, which is still no download)
    assert hub.downloads == [] and all(method == "HEAD" for method, _ in hub.requests)
    assert hub.downloads == []


def test_snapshot_download_allow_patterns(hub, hf_home):
    folder = Path(snapshot_download(REPO, revision="main", allow_patterns=["*.json", "tokenizer/*"]))
    assert folder == hf_home / "hub" / "models--org--tiny" / "snapshots" / hub.repos[REPO].commit
    got = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert got == {k: v for k, v in FILES.items() if k in ("config.json", "tokenizer/vocab.txt")}
    assert sorted(hub.downloads) == sorted(
        f"/{REPO}/resolve/{hub.repos[REPO].commit}/{p}" for p in ("config.json", "tokenizer/vocab.txt"))

    hub.clear()
    assert Path(snapshot_download(REPO, revision="main", allow_patterns=["*.json", "tokenizer/*"])) == folder
    assert hub.downloads == [] and all(method != "GET" or "/api/" in path for method, path in hub.requests)


def test_revisions_branch_tag_commit(hub):
    commit = hub.repos[REPO].commit
    for rev in ("main", "v1.0", commit):
        assert Path(hf_hub_download(REPO, "config.json", revision=rev)).read_bytes() == CONFIG
        assert HfApi().model_info(REPO, revision=rev).sha == commit
    assert len(hub.downloads) == 1  # one blob, reused for the other revisions


def test_branch_moved_to_new_commit(hub, hf_home):
    old = hub.repos[REPO].commit
    assert Path(hf_hub_download(REPO, "config.json")).read_bytes() == CONFIG
    new_config = json.dumps({"model_type": "llama", "hidden_size": 128}).encode()
    new = hub.push(REPO, {**FILES, "config.json": new_config})
    assert new != old and hub.repos[REPO].branches["main"] == new and hub.repos[REPO].tags["v1.0"] == old

    path = Path(hf_hub_download(REPO, "config.json"))
    assert path.read_bytes() == new_config and new in str(path)
    assert (hf_home / "hub" / "models--org--tiny" / "refs" / "main").read_text() == new
    assert HfApi().model_info(REPO).sha == new
    # the old commit stays reachable by id and through the tag
    assert Path(hf_hub_download(REPO, "config.json", revision="v1.0")).read_bytes() == CONFIG
    assert HfApi().model_info(REPO, revision=old, files_metadata=True).siblings[0].blob_id == git_blob_id(
        FILES["README.md"])


def test_resume_partial_lfs_download_with_range(hub, hf_home):
    blob = hf_home / "hub" / "models--org--tiny" / "blobs" / sha256(WEIGHTS)
    blob.parent.mkdir(parents=True)
    Path(str(blob) + ".incomplete").write_bytes(WEIGHTS[:1000])
    assert Path(hf_hub_download(REPO, "model.safetensors")).read_bytes() == WEIGHTS
    (call,) = [c for c in hub.calls if c.content]
    assert call.headers["range"] == "bytes=1000-" and call.status == 206


def test_offline_subprocess_served_from_cache(hub):
    snapshot_download(REPO, allow_patterns=["config.json"])
    hub.clear()
    code = (
        "from huggingface_hub import hf_hub_download, snapshot_download\n"
        f"print(open(hf_hub_download({REPO!r}, 'config.json')).read())\n"
        f"print(snapshot_download({REPO!r}, revision='main'))\n"
        "try:\n"
        f"    hf_hub_download({REPO!r}, 'README.md')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__)\n"
    )
    out = run_py(code, HF_HUB_OFFLINE="1")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == CONFIG.decode() and lines[1].endswith(hub.repos[REPO].commit)
    assert lines[2] == "LocalEntryNotFoundError"
    assert hub.requests == []


def test_subprocess_reaches_server_through_hf_endpoint(hub):
    out = run_py(f"from huggingface_hub import HfApi; print(HfApi().model_info({REPO!r}).sha)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == hub.repos[REPO].commit
    assert hub.requests == [("GET", f"/api/models/{REPO}")]


def test_errors(hub):
    with pytest.raises(RepositoryNotFoundError) as e:
        hf_hub_download("org/missing", "config.json")
    assert e.value.response.status_code == 401
    with pytest.raises(RepositoryNotFoundError):
        HfApi().model_info("org/missing")
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("org/missing")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        HfApi().model_info(REPO, revision="0" * 40)
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(REPO, revision="no-such-branch")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "missing.json")
    with pytest.raises(LocalEntryNotFoundError):
        hf_hub_download(REPO, "config.json", local_files_only=True)
    assert hub.downloads == []


def test_gated_repo(hub):
    with pytest.raises(GatedRepoError) as e:
        hf_hub_download("org/gated", "config.json")
    assert e.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as e:
        hf_hub_download("org/gated", "config.json", token="hf_wrong")
    assert e.value.response.status_code == 403
    with pytest.raises(GatedRepoError):
        snapshot_download("org/gated", token="hf_wrong")
    assert HfApi().model_info("org/gated").gated == "manual"  # metadata stays public, as on the hub
    assert hub.downloads == []

    path = hf_hub_download("org/gated", "model.safetensors", token=TOKEN)
    assert Path(path).read_bytes() == WEIGHTS
    head = [c for c in hub.calls if c.method == "HEAD" and c.status == 302][-1]
    assert head.headers["authorization"] == f"Bearer {TOKEN}"

    code = ("from huggingface_hub import snapshot_download; import pathlib\n"
            "p = pathlib.Path(snapshot_download('org/gated'))\n"
            "print(sorted(f.name for f in p.iterdir()))\n")
    assert "GatedRepoError" in run_py(code).stderr
    out = run_py(code, HF_TOKEN=TOKEN)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['config.json', 'model.safetensors']"


def test_use_hub_is_undone(monkeypatch, hf_home):
    from huggingface_hub import constants, file_download

    before = (constants.ENDPOINT, file_download.HUGGINGFACE_CO_URL_TEMPLATE, constants.HF_HUB_CACHE)
    with HubServer({}) as server, pytest.MonkeyPatch.context() as mp:
        use_hub(mp, server, hf_home)
        assert constants.ENDPOINT == server.url and os.environ["HF_ENDPOINT"] == server.url
        assert file_download.HUGGINGFACE_CO_URL_TEMPLATE.startswith(server.url + "/")
        assert constants.HF_HUB_CACHE == str(hf_home / "hub")
    assert (constants.ENDPOINT, file_download.HUGGINGFACE_CO_URL_TEMPLATE, constants.HF_HUB_CACHE) == before
