"""A no-op `trtbuild build`, replayed from its record (trtbuild.replay): the full run's bytes and exit
status without importing pydantic, click or the planner; and a full run whenever anything the record
depended on changed, which then does what a full run does (a deleted blob is built again, a removed
lock file or ref written again). Whether a run replayed: the record is rewritten (a new inode) by
every full no-op run and left alone by a replay."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import NEMO_DATA

TINY_HF = NEMO_DATA / "hf_tiny_llama_tied_bf16"
RECIPE = """schema: 1
name: tiny
source: {path: model}
variants: {bf16: {}}
gpus: [sm90]
limits: {max_input_len: 128, max_seq_len: 256}
"""
NOT_IMPORTED_BY_A_REPLAY = ("pydantic", "pydantic_core", "click", "yaml", "rich", "trtbuild.cli", "trtbuild.graph",
                            "trtbuild.recipe", "trtbuild.records", "trtbuild.store.local", "filelock")


class Project:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = root / "store"
        shutil.copytree(TINY_HF, root / "model")
        for path in (root / "model").iterdir():
            path.chmod(0o644)
        (root / "tiny.yaml").write_text(RECIPE)
        self.env = {**os.environ, "TRTBUILD_CACHE": str(self.store)}

    def build(self, *args: str, env: dict | None = None, python: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *python, "-m", "trtbuild", "build", "tiny.yaml", "--until", "source", *args],
                              cwd=self.root, env=env or self.env, capture_output=True, text=True, timeout=600)

    def records(self) -> list[Path]:
        folder = self.store / "replay"
        return sorted(folder.iterdir()) if folder.is_dir() else []

    def record(self) -> Path:
        (only,) = self.records()
        return only

    def record_inode(self) -> int | None:
        records = self.records()
        assert len(records) <= 1
        return records[0].stat().st_ino if records else None

    def noop(self, *args: str, **kw) -> tuple[subprocess.CompletedProcess, bool]:
        """A build that exits 0, and whether it was replayed (its record there and left as it was)."""
        before = self.record_inode()
        result = self.build(*args, **kw)
        assert result.returncode == 0, result.stderr
        return result, before is not None and self.record_inode() == before

    def source_blobs(self) -> list[Path]:
        """The blobs of the source artifact (the ref's), largest first."""
        from trtbuild.store.local import LocalStore

        store = LocalStore(self.store)
        digest = json.loads((self.store / "refs" / "tiny" / "source").read_text())["digest"]
        entries = sorted(store.get_manifest(digest).entries, key=lambda e: -e.size)
        return [store.blob_path(e.sha256) for e in entries]


@pytest.fixture
def project(tmp_path) -> Project:
    project = Project(tmp_path)
    first = project.build()
    assert first.returncode == 0, first.stderr
    assert " built source " in first.stderr
    assert project.records() == []  # something was built: nothing to replay
    second = project.build()
    assert second.returncode == 0 and "Nothing was built" in second.stdout
    project.record()  # the no-op run recorded itself
    project.full = second
    return project


@pytest.mark.parametrize("store_arg", [None, "--store", "--store="], ids=["env", "store-option", "store-equals"])
def test_a_noop_build_replays_the_full_runs_bytes(tmp_path, store_arg):
    project = Project(tmp_path)
    args = () if store_arg is None else (("--store", "store") if store_arg == "--store" else ("--store=store",))
    env = {k: v for k, v in project.env.items() if k != "TRTBUILD_CACHE"} if store_arg else project.env
    assert project.build(*args, env=env).returncode == 0
    full = project.build(*args, env=env)
    assert "Nothing was built: every buildable artifact was already in the store." in full.stdout
    for _ in range(2):
        replayed, was_replay = project.noop(*args, env=env)
        assert was_replay
        assert (replayed.returncode, replayed.stdout, replayed.stderr) == (0, full.stdout, full.stderr)


def test_a_replay_imports_none_of_the_planner(project):
    result, was_replay = project.noop(python=("-X", "importtime"))
    assert was_replay
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "trtbuild.replay" in imported
    assert sorted(imported & set(NOT_IMPORTED_BY_A_REPLAY)) == []
    shown = "".join(line + "\n" for line in result.stderr.splitlines() if not line.startswith("import time:"))
    assert (result.stdout, shown) == (project.full.stdout, project.full.stderr)


def _rewrite_a_blob_keeping_its_times(project: Project) -> None:
    blob = project.source_blobs()[0]
    before = blob.stat()
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    blob.chmod(before.st_mode)
    os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns))  # the ctime moves all the same


CHANGES = {
    "blob deleted": lambda p: p.source_blobs()[0].unlink(),
    "blob rewritten, times put back": _rewrite_a_blob_keeping_its_times,
    "recipe edited": lambda p: (p.root / "tiny.yaml").write_text(RECIPE + "# a comment\n"),
    "lock file removed": lambda p: (p.root / "tiny.lock").unlink(),
    "gc root removed": lambda p: [root.unlink() for root in (p.store / "roots").iterdir()],
    "ref removed": lambda p: (p.store / "refs" / "tiny" / "source").unlink(),
    "source file rewritten": lambda p: (p.root / "model" / "config.json").write_text(
        (p.root / "model" / "config.json").read_text().replace("}", ', "extra": 1}', 1)),
}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_a_changed_input_runs_the_build_in_full(project, change):
    blobs = project.source_blobs()
    CHANGES[change](project)
    result, was_replay = project.noop()
    assert not was_replay
    if change.startswith("blob") or change.startswith("source"):  # built again (the same bytes for a blob)
        assert " built source " in result.stderr
        assert project.records() == []  # not a no-op: the out-of-date record is gone
        if change.startswith("blob"):
            assert project.source_blobs() == blobs
        assert not project.noop()[1]  # the next run is a no-op, in full, and recorded
    else:
        assert "Nothing was built" in result.stdout
    assert (project.root / "tiny.lock").is_file() and (project.store / "refs" / "tiny" / "source").is_file()
    assert len(list((project.store / "roots").iterdir())) == 1
    assert project.noop()[1]  # replayed again


def test_another_environment_runs_the_build_in_full(project):
    env = {**project.env, "SOMETHING_ELSE": "1"}
    assert not project.noop(env=env)[1]
    assert project.noop(env=env)[1]
    assert not project.noop()[1]  # one record per command line and folder: the last run's


@pytest.mark.parametrize("damage", ["not json", "another schema", "truncated", "a file entry of another shape"])
def test_a_damaged_record_runs_the_build_in_full(project, damage):
    record = project.record()
    text = record.read_text()
    data = json.loads(text)
    if damage == "not json":
        record.write_text("{\"schema\": 1, ")
    elif damage == "another schema":
        record.write_text(json.dumps({**data, "schema": 99}))
    elif damage == "truncated":
        record.write_text(text[: len(text) // 2])
    else:
        record.write_text(json.dumps({**data, "files": [[1, 2]]}))
    result, was_replay = project.noop()
    assert not was_replay
    assert (result.stdout, result.stderr) == (project.full.stdout, project.full.stderr)
    assert json.loads(project.record().read_text())["schema"] == 1


def test_runs_that_are_not_recorded(project):
    record = project.record()
    shutil.rmtree(record.parent)
    assert project.build("--json").returncode == 0
    assert project.records() == []
    (project.root / "tiny.yaml").write_text(RECIPE.replace("{bf16: {}}", "{fp8: {quant: fp8}}").replace("sm90", "sm80"))
    assert project.build().returncode == 0  # a no-op (the source is the same), recorded
    assert project.noop()[1]
    failed = project.build("--require-all")  # FP8 on sm80 is impossible: with --require-all, a failure
    assert failed.returncode == 1 and "impossible fp8-tp1-sm80 " in failed.stderr
    assert len(project.records()) == 1  # the other command line's
    shutil.rmtree(project.store / "replay")
    (project.root / "tiny.yaml").write_text(RECIPE.replace("{bf16: {}}", "{bf16: {}, fp8: {quant: fp8}}"))
    assert project.build("--until", "calibration").returncode == 0  # built the calibration set
    assert project.records() == []


NVML_STANDIN = '''
"""TEST STAND-IN for pynvml, for test_replay only: one sm90 GPU per byte of the file $REPLAY_NVML_GPUS
names, read with a stat (no open, so the record cannot see the answer change: only the probe can)."""
import os

class NVMLError(Exception):
    pass

def nvmlInit():
    pass

def nvmlShutdown():
    pass

def nvmlDeviceGetCount():
    return os.stat(os.environ["REPLAY_NVML_GPUS"]).st_size

def nvmlDeviceGetHandleByIndex(index):
    return index

def nvmlDeviceGetCudaComputeCapability(handle):
    return 9, 0

def nvmlDeviceGetName(handle):
    return "NVIDIA H100 80GB HBM3"

class _Memory:
    total = 85520809984

def nvmlDeviceGetMemoryInfo(handle):
    return _Memory()

def nvmlSystemGetDriverVersion():
    return "550.90.07"

def nvmlSystemGetCudaDriverVersion():
    return 12040
'''


def test_a_gpu_that_appears_is_probed_and_runs_the_build_in_full(project, tmp_path):
    standin = tmp_path / "nvml"
    standin.mkdir()
    (standin / "pynvml.py").write_text(textwrap.dedent(NVML_STANDIN))
    gpus = tmp_path / "gpus"
    gpus.write_bytes(b"")
    env = {**project.env, "PYTHONPATH": os.pathsep.join([str(standin), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "REPLAY_NVML_GPUS": str(gpus)}
    shutil.rmtree(project.store / "replay")  # (the fixture's record, of another command line)
    # --gpu auto: what the build does depends on the GPUs NVML finds
    assert not project.noop("--gpu", "auto", env=env)[1]
    assert project.noop("--gpu", "auto", env=env)[1]
    assert json.loads(project.record().read_text())["probes"]["gpus"] == []
    gpus.write_bytes(b"x")  # a GPU now: nothing the build opened changed
    result, was_replay = project.noop("--gpu", "auto", env=env)
    assert not was_replay
    assert json.loads(project.record().read_text())["probes"]["gpus"] == [[0, "NVIDIA H100 80GB HBM3", "sm90", 85520809984]]


STAT_LOG = r'''
import json, os, sys
stated = set()
real_stat, real_lstat = os.stat, os.lstat
def logged(real):
    def stat(path, *args, **kwargs):
        if isinstance(path, (str, bytes, os.PathLike)):
            stated.add(os.path.abspath(os.fsdecode(path)))
        return real(path, *args, **kwargs)
    return stat
os.stat, os.lstat = logged(real_stat), logged(real_lstat)
def dump():
    os.stat, os.lstat = real_stat, real_lstat
    with open(os.environ["STAT_LOG"], "w") as f:
        json.dump(sorted(stated), f)
import atexit
atexit.register(dump)  # the command ends with os._exit, after the atexit functions
sys.argv = ["trtbuild", *sys.argv[1:]]
import trtbuild.__main__
trtbuild.__main__.main()
'''


def test_every_file_a_noop_build_stats_is_an_input_of_its_record(project, tmp_path):
    """A file the build looks at only through a stat (os.stat, Path.exists, is_dir: no audit event)
    is an input too: it must be in the record, or be a folder above one that is (which a recorded
    path goes through), or belong to the interpreter (the record's executable and version stand for
    those). Without this, a build that decides on a stat alone would be replayed after the file went."""
    project.record().unlink()
    script = tmp_path / "statlog.py"
    script.write_text(STAT_LOG)
    log = tmp_path / "stated.json"
    result = subprocess.run([sys.executable, str(script), "build", "tiny.yaml", "--until", "source"], cwd=project.root,
                            env={**project.env, "STAT_LOG": str(log)}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "Nothing was built" in result.stdout, result.stderr
    recorded = {path for path, _ in json.loads(project.record().read_text())["files"]}
    above = {str(parent) for path in recorded for parent in Path(path).parents}
    interpreter = Path(sys.base_prefix)
    uncovered = [path for path in json.loads(log.read_text())
                 if path not in recorded and path not in above and not path.startswith(str(project.store / "replay"))
                 and not (Path(path).is_relative_to(interpreter) and "site-packages" not in path)]
    assert uncovered == []


def test_a_record_that_cannot_be_written_fails_nothing(project):
    """Recording is a cache: where it cannot be written (here replay/ is a file), the build says
    what it always says, exits 0, and the next run builds in full again."""
    shutil.rmtree(project.store / "replay")
    (project.store / "replay").write_text("not a folder")
    for _ in range(2):
        result = project.build()
        assert (result.returncode, result.stdout, result.stderr) == (0, project.full.stdout, project.full.stderr)
    assert (project.store / "replay").read_text() == "not a folder"
