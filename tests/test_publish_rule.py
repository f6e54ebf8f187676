"""One rule for what a store publishes (issue #23 item 4): a build of a tiny real model with one
target that passes its gates and one that fails them, then the build's human output, `ls --store`,
`push` and `pull --dry-run` agree target by target; a held-back target says why everywhere, in the
same words. On a host with an NVIDIA GPU the runtime validations would run here: skipped there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import NEMO_DATA
from trtbuild.lock import verdict
from trtbuild.lock.publication import ELSEWHERE, FAILED, NOT_RUN, PASSED, Check, held_back

TINY_HF = NEMO_DATA / "hf_tiny_llama_tied_bf16"
# base (the source's weights) matches the reference exactly: KL 0 passes `kld_mean: 0.0`; fp8 does not
RECIPE = """schema: 1
name: tiny-pub
source: {path: model}
gpus: [sm90]
backends: [hf-checkpoint]
variants: {base: {}, fp8: {quant: fp8}}
calibration: {samples: 2, seq_len: 32}
limits: {max_input_len: 128, max_seq_len: 256}
validate: {samples: 2, seq_len: 32, gates: {kld_mean: 0.0}}
"""
HELD = "held back: fp8-hf:validate failed its gates"


def _gpu_here() -> bool:
    from trtbuild.host import hardware

    return bool(hardware.detect_gpus())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if _gpu_here():
        pytest.skip("a host with an NVIDIA GPU runs the runtime validations this test expects skipped")
    project = tmp_path_factory.mktemp("publish-rule")
    shutil.copytree(TINY_HF, project / "model")
    for path in (project / "model").iterdir():
        path.chmod(0o644)
    (project / "tiny.yaml").write_text(RECIPE)
    env = {**os.environ, "TRTBUILD_CACHE": str(project / "store")}
    build = trtbuild(project, env, "build", "tiny.yaml")
    yield project, env, build
    shutil.rmtree(project, ignore_errors=True)


def trtbuild(project: Path, env: dict, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtbuild", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=project, timeout=900)


def row_note(stdout: str, target: str) -> str:
    """The table's `why / notes` cell of a target's row (one line: the pipe's table is 160 wide)."""
    row = next(line for line in stdout.splitlines() if line.startswith(f"│ {target} "))
    return row.rstrip("│ ").rsplit("│", 1)[1].strip()


def test_the_build_ls_push_and_pull_agree_on_what_is_published(built, tmp_path):
    project, env, build = built
    assert build.returncode == 1, build.stderr  # a gate failed
    # the build: the passing target is published, the other held back, saying why (table and folders)
    assert row_note(build.stdout, "base-hf") == "published: gates passed on torch (cpu)"
    assert row_note(build.stdout, "fp8-hf") == HELD
    folders = build.stdout.split("folders (read-only; `trtbuild check FOLDER` checks one):\n")[1].splitlines()
    store = project / "store"
    lock = yaml.safe_load((project / "tiny.lock").read_text())
    base, fp8 = lock["targets"]["base-hf"], lock["targets"]["fp8-hf"]
    assert folders[:2] == [f"  base-hf  {store / 'checkouts' / base['digest']}",
                           f"  fp8-hf   {store / 'checkouts' / fp8['digest']}  ({HELD})"]  # ids padded to one width
    # the lock records the verdict: push and pull read it
    assert "held_back" not in base and fp8["held_back"] == "fp8-hf:validate failed its gates"

    # ls: the local store publishes base-hf only
    listed = trtbuild(project, env, "ls", "--store", store, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [p["target"] for p in json.loads(listed.stdout)["published"]] == ["base-hf"]

    # push: base-hf goes, fp8-hf is refused in the build's words
    shared = tmp_path / "shared"
    pushed = trtbuild(project, env, "push", "tiny.yaml", "--store", shared)
    assert pushed.returncode == 1
    assert pushed.stdout.splitlines()[0] == "pushed base-hf"
    assert pushed.stderr == f"new store at {shared}\nfp8-hf: {HELD}; not pushed\n"  # the folder it made for base-hf
    shared_ls = json.loads(trtbuild(project, env, "ls", "--store", shared, "--json").stdout)
    assert [p["target"] for p in shared_ls["published"]] == ["base-hf"]

    # pull: the held-back target never fits, for the same reason; the published one is pulled by name
    dry = trtbuild(project, env, "pull", "tiny.yaml", "--store", shared, "--dry-run", "--json")
    candidates = {c["target"]: c for c in json.loads(dry.stdout)["candidates"]}
    assert candidates["fp8-hf"]["reasons"] == [HELD]
    assert HELD not in candidates["base-hf"]["reasons"]
    named = trtbuild(project, env, "pull", "tiny.yaml", "--store", shared, "--target", "fp8-hf", "--dry-run")
    assert (named.returncode, named.stdout, named.stderr) == (
        1, "", f"--target fp8-hf: {HELD}; not published, so not pulled\n")
    ok = trtbuild(project, env, "pull", "tiny.yaml", "--store", shared, "--target", "base-hf", "--dry-run")
    assert (ok.returncode, ok.stdout) == (0, f"would pull base-hf: artifact {base['digest']}\n"), ok.stderr


def test_a_no_validate_build_publishes_nothing_and_says_why(built, tmp_path):
    project, env, _ = built
    other = tmp_path / "p"
    shutil.copytree(project / "model", other / "model")
    (other / "tiny.yaml").write_text(RECIPE.replace("name: tiny-pub", "name: tiny-nv"))
    env = {**env, "TRTBUILD_CACHE": str(other / "store")}
    build = trtbuild(other, env, "build", "tiny.yaml", "--no-validate", "--target", "base-hf")
    assert build.returncode == 0, build.stderr
    assert row_note(build.stdout, "base-hf") == "held back: built with --no-validate"
    listed = trtbuild(other, env, "ls", "--store", other / "store")
    assert listed.stdout == f"nothing is published in {other / 'store'}\n"
    pushed = trtbuild(other, env, "push", "tiny.yaml", "--store", tmp_path / "shared")
    assert pushed.stderr == "base-hf: held back: built with --no-validate; not pushed without --allow-unvalidated\n"
    allowed = trtbuild(other, env, "push", "tiny.yaml", "--store", tmp_path / "shared", "--allow-unvalidated")
    assert (allowed.returncode, allowed.stdout.splitlines()[0]) == (0, "pushed base-hf"), allowed.stderr
    # published with the override: ls lists it, and pull takes it only when asked the same way
    listed = json.loads(trtbuild(other, env, "ls", "--store", tmp_path / "shared", "--json").stdout)
    assert [p["target"] for p in listed["published"]] == ["base-hf"]
    refused = trtbuild(other, env, "pull", "tiny.yaml", "--store", tmp_path / "shared", "--target", "base-hf",
                       "--dry-run")
    assert (refused.returncode, refused.stdout, refused.stderr) == (
        1, "", "--target base-hf: held back: built with --no-validate; not published, so not pulled without "
               "--allow-unvalidated\n")
    pulled = trtbuild(other, env, "pull", "tiny.yaml", "--store", tmp_path / "shared", "--target", "base-hf",
                      "--dry-run", "--allow-unvalidated")
    digest = yaml.safe_load((other / "tiny.lock").read_text())["targets"]["base-hf"]["digest"]
    assert (pulled.returncode, pulled.stdout, pulled.stderr) == (0, f"would pull base-hf: artifact {digest}\n", "")


@pytest.mark.parametrize("checks, validated, standin, allow, why", [
    ([Check("t:validate", PASSED)], True, (), False, None),
    ([Check("t:validate-vllm", ELSEWHERE), Check("t:validate", PASSED)], True, (), False, None),
    ([Check("t:validate-vllm", FAILED, "its gates"), Check("t:validate", PASSED)], True, (), True,
     "t:validate-vllm failed its gates"),
    ([Check("t:validate-vllm", FAILED), Check("t:validate", PASSED)], True, (), False, "t:validate-vllm failed"),
    ([Check("t:validate", NOT_RUN, "skipped")], True, (), False, "t:validate was skipped"),
    ([], True, (), False, "no validation of it ran"),
    ([], True, (), True, None),
    ([], False, (), False, "built with --no-validate"),
    ([], False, (), True, None),
    ([], False, ("tensorrt",), True, "made by a stand-in toolchain (tensorrt)"),
    ([Check("t:validate-vllm", PASSED, standin=("vllm",))], True, (), False,
     "its validation t:validate-vllm was made by a stand-in toolchain (vllm)"),
], ids=["passed", "elsewhere", "failed-gates", "failed", "not-run", "none", "none-allowed", "no-validate",
        "no-validate-allowed", "standin", "standin-validation"])
def test_the_rule(checks, validated, standin, allow, why):
    assert held_back(validated, checks, standin, allow) == why


def test_a_lock_without_the_builds_verdict_is_judged_by_what_it_shows():
    from trtbuild.lock.lockfile import LockedRecipe, LockedTarget, LockFile

    digest = "0" * 64
    lock = LockFile(recipe=LockedRecipe(name="r", digest=""), source=None, toolchain={}, validation="run", targets={
        "a-hf": LockedTarget(stage="hf-checkpoint", key=digest, digest=digest, size=1),
        "a-hf:validate": LockedTarget(stage="validate", key=digest, digest=digest, size=1, gates_passed=False),
        "b-hf": LockedTarget(stage="hf-checkpoint", key=digest, digest=digest, size=1),
        "c-hf": LockedTarget(stage="hf-checkpoint", key=digest, digest=digest, size=1, held_back="c-hf:validate was skipped"),
        "c-hf:validate-vllm": LockedTarget(stage="validate", key=digest, digest=digest, size=1, gates_passed=True)})
    assert [verdict.lock_verdict(lock, t) for t in ("a-hf", "b-hf", "c-hf")] == [
        "a-hf:validate failed its gates", "no validation of it ran", "c-hf:validate was skipped"]
    assert verdict.lock_verdict(lock, "b-hf", allow_unvalidated=True) is None
    assert verdict.lock_verdict(lock, "c-hf", allow_unvalidated=True) == "c-hf:validate was skipped"
