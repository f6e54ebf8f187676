"""Where a build's outputs are (issue #23 item 3): a plain `trtbuild build` prints each target's
folder after its table, `trtbuild check` takes it as it is, and `trtbuild path [RECIPE] TARGET`
prints it again (checking it out if needed), exit 1 for a target not built, 2 for an unknown one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import NEMO_DATA

TINY_HF = NEMO_DATA / "hf_tiny_llama_tied_bf16"
RECIPE = """schema: 1
name: tiny-out
source: {path: model}
gpus: [sm90]
backends: [engine, hf-checkpoint]
limits: {max_input_len: 128, max_seq_len: 256}
validate: {samples: 2, seq_len: 32}
"""
HEADER = "folders (read-only; `trtbuild check FOLDER` checks one):"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    from trtbuild.host import hardware

    if hardware.detect_gpus():
        pytest.skip("on a host with an NVIDIA GPU the engine targets would be built too")
    root = tmp_path_factory.mktemp("outputs")
    shutil.copytree(TINY_HF, root / "model")
    for path in (root / "model").iterdir():
        path.chmod(0o644)
    (root / "tiny.yaml").write_text(RECIPE)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def trtbuild(root: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtbuild", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "TRTBUILD_CACHE": str(root / "store")}, cwd=root, timeout=900)


def folders(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = lines.index(HEADER) + 1
    return lines[start:start + next(i for i, line in enumerate(lines[start:]) if not line.startswith("  "))]


def test_a_plain_build_prints_each_targets_folder_and_path_prints_it_again(project):
    first = trtbuild(project, "build", "tiny.yaml")
    assert first.returncode == 0, first.stderr
    lock = yaml.safe_load((project / "tiny.lock").read_text())["targets"]
    store = project / "store" / "checkouts"
    expected = [f"  base-tp1  {store / lock['base-tp1']['digest']}", f"  base-hf   {store / lock['base-hf']['digest']}"]
    assert folders(first.stdout) == expected
    again = trtbuild(project, "build", "tiny.yaml")  # a no-op build: the same folders, found in the store
    assert (again.returncode, folders(again.stdout)) == (0, expected)

    hf = store / lock["base-hf"]["digest"]
    checked = trtbuild(project, "check", hf)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for target in ("base-hf", "base-tp1"):
        printed = trtbuild(project, "path", "tiny.yaml", target)
        assert (printed.returncode, printed.stdout, printed.stderr) == (0, f"{store / lock[target]['digest']}\n", "")

    shutil.rmtree(hf)  # a checkout that is gone is made again from the store's blobs
    printed = trtbuild(project, "path", "tiny.yaml", "base-hf")
    assert (printed.returncode, printed.stdout) == (0, f"{hf}\n") and (hf / "config.json").is_file()


def test_path_of_a_target_not_built_or_unknown_is_one_line(project):
    if not (project / "tiny.lock").exists():
        assert trtbuild(project, "build", "tiny.yaml").returncode == 0
    engine = trtbuild(project, "path", "tiny.yaml", "base-tp1-sm90")  # planned; this host builds no engine
    assert (engine.returncode, engine.stdout, engine.stderr) == (
        1, "", f"base-tp1-sm90: not built (not in {Path('tiny.lock')}); run `trtbuild build tiny.yaml --target "
               "base-tp1-sm90`\n")
    unknown = trtbuild(project, "path", "tiny.yaml", "fp8-hf")
    assert (unknown.returncode, unknown.stdout, unknown.stderr) == (
        2, "", "fp8-hf: not a target of tiny-out (base-tp1, base-tp1-sm90, base-hf)\n")
    fresh = project / "fresh.yaml"  # another recipe, nothing built: not built, naming its build
    fresh.write_text(RECIPE.replace("tiny-out", "tiny-fresh"))
    none = trtbuild(project, "path", "fresh.yaml", "base-hf")
    assert (none.returncode, none.stderr) == (
        1, f"base-hf: not built (not in {Path('fresh.lock')}); run `trtbuild build fresh.yaml --target base-hf`\n")
    fresh.unlink()
