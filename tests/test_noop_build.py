"""A no-op `trtbuild build` runs in full every time (issue #22): nothing replays an earlier run's
answer. The three ways a replayed answer went stale, each now answered as a full run answers it:
an input file edited after a no-op run read it, `docker` appearing on PATH (which no record saw),
and a store made read-only. And the no-op run stays light: it imports none of the stages' heavy
packages, nor rich on a pipe, filelock or the transfer code."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import NEMO_DATA

TINY_HF = NEMO_DATA / "hf_tiny_llama_tied_bf16"
IMAGE = "nvcr.io/nvidia/tensorrt-llm/release@sha256:" + "0123456789abcdef" * 4
RECIPE = f"""schema: 1
name: tiny
source: {{path: model}}
variants: {{bf16: {{}}}}
gpus: [sm90]
limits: {{max_input_len: 128, max_seq_len: 256}}
toolchain: {{image: '{IMAGE}'}}
"""
NOTHING_BUILT = "Nothing was built: every buildable artifact was already in the store."
# A progress line on stderr: `   skipped bf16-tp1-sm90 (engine, 0.0s)  needs ...`
PROGRESS = re.compile(r"^ *(\w+) (\S+) \(([\w-]+), \d+\.\ds\)(?: ([0-9a-f]{12}))?(?:  (.*))?$")


def docker_free_path() -> str:
    """$PATH without the folders that hold a `docker` (this host may have one)."""
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not os.access(os.path.join(d, "docker"), os.X_OK))


class Project:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = root / "store"
        self.model = root / "model"
        shutil.copytree(TINY_HF, self.model)
        for path in self.model.iterdir():
            path.chmod(0o644)
        (root / "tiny.yaml").write_text(RECIPE)
        self.tools = root / "tools"  # on PATH, empty: where a test installs a docker
        self.tools.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
        self.env = {**env, "TRTBUILD_CACHE": str(self.store), "PATH": f"{self.tools}{os.pathsep}{docker_free_path()}"}

    def build(self, *python: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *python, "-m", "trtbuild", "build", "tiny.yaml", "--no-validate"],
                              cwd=self.root, env=self.env, capture_output=True, text=True, timeout=600)


def progress(result: subprocess.CompletedProcess) -> dict[str, tuple]:
    """name -> (status, stage, digest, why) from the build's progress lines."""
    rows = {}
    for line in result.stderr.splitlines():
        match = PROGRESS.match(line)
        if match:
            status, name, stage, digest, why = match.groups()
            rows[name] = (status, stage, digest, why)
    return rows


def tree_digest(folder: Path) -> str:
    """The folder's tree digest, computed without any stat cache."""
    from trtbuild.store.state import StatCache
    from trtbuild.store.tree import build_manifest

    return build_manifest(folder, StatCache(None))[0].digest


def no_docker_gpu_check() -> None:
    from trtbuild.host import hardware

    hardware.clear_probe_cache()
    if hardware.detect_gpus():
        pytest.skip("this host has an NVIDIA GPU: with docker on PATH the engine would be built in the image")


@pytest.fixture
def project(tmp_path) -> Project:
    no_docker_gpu_check()
    project = Project(tmp_path)
    first = project.build()
    assert first.returncode == 0, first.stderr
    assert [row[0] for row in progress(first).values()] == ["built", "built", "skipped"]
    second = project.build()
    assert (second.returncode, second.stdout.splitlines()[-1]) == (0, NOTHING_BUILT), second.stderr
    project.noop = second
    return project


def unsettled_write(path: Path, data: bytes) -> None:
    """Write `data` in place of `path`'s bytes (the same size) and put its mtime back, on a later
    tick of the file system's clock than its last change: only the ctime tells."""
    st = path.stat()
    assert len(data) == st.st_size
    probe = path.parent / ".tick"
    probe.touch()
    while probe.stat().st_ctime_ns <= st.st_ctime_ns:
        os.utime(probe)
    probe.unlink()
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_an_input_edited_after_a_noop_build_is_built_again(project):
    weights = project.model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # the last byte of the last tensor: the same size and header
    unsettled_write(weights, bytes(data))
    edited = tree_digest(project.model)

    after = project.build()
    assert after.returncode == 0, after.stderr
    rows = progress(after)
    assert rows["source"] == ("built", "source", edited[:12], None)
    assert rows["bf16-tp1"][0] == "built"
    assert NOTHING_BUILT not in after.stdout

    again = project.build()  # and the next run finds what this one stored
    assert again.stdout.splitlines()[-1] == NOTHING_BUILT
    assert progress(again)["source"] == ("cached", "source", edited[:12], None)


def test_docker_appearing_on_path_is_seen_by_the_next_build(project):
    # Installed into a folder already on PATH: the environment is the same, only a lookup finds more.
    why = f"needs sm90 GPU and docker to build in {IMAGE} (this machine: no GPU, {{}})"
    assert progress(project.noop)["bf16-tp1-sm90"] == ("skipped", "engine", None, why.format("no docker"))
    docker = project.tools / "docker"
    docker.write_text("#!/bin/sh\nexit 1\n")  # only found, never run: this host has no GPU
    docker.chmod(0o755)
    with_docker = project.build()
    assert with_docker.returncode == 0, with_docker.stderr
    assert progress(with_docker)["bf16-tp1-sm90"] == ("skipped", "engine", None, why.format("docker"))
    docker.unlink()
    assert progress(project.build())["bf16-tp1-sm90"] == ("skipped", "engine", None, why.format("no docker"))


# ---- a read-only store: a read-only bind mount (root ignores permission bits) ------------------

def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@functools.lru_cache(maxsize=None)
def _cannot_mount() -> str | None:
    probe = Path(tempfile.mkdtemp(prefix="trtbuild-mount-probe-"))
    try:
        _mount("--bind", str(probe), str(probe))
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"cannot bind-mount here ({getattr(exc, 'stderr', b'') or exc})"
    finally:
        subprocess.run(["umount", "-l", str(probe)], check=False, capture_output=True)
        probe.rmdir()
    return None


def test_a_store_made_read_only_fails_the_noop_build_as_a_full_run_does(project):
    if _cannot_mount():
        pytest.skip(_cannot_mount())
    _mount("--bind", str(project.store), str(project.store))
    try:
        _mount("-o", "remount,bind,ro", str(project.store))
        result = project.build()
    finally:
        subprocess.run(["umount", "-l", str(project.store)], check=False, capture_output=True)
    assert (result.returncode, result.stdout, result.stderr) == (
        2, "", f"{project.store}/locks/store.lock: read-only file system\n")


# ---- nothing replays, and the full no-op run stays light ---------------------------------------

HEAVY = ("torch", "transformers", "modelopt", "numpy", "gguf", "safetensors", "rich", "filelock")


def test_a_noop_build_imports_nothing_heavy_and_keeps_no_record(project):
    result = project.build("-X", "importtime")
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == NOTHING_BUILT
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "trtbuild.builder.pipeline" in imported  # it planned: a full run
    assert sorted(m for m in imported if m.split(".")[0] in HEAVY) == []
    assert sorted(imported & {"trtbuild.deploy.push", "trtbuild.store.transfer"}) == []
    assert importlib.util.find_spec("trtbuild.replay") is None
    assert sorted(p.name for p in project.store.iterdir() if p.name == "replay") == []
