"""`trtbuild build --locked`: whenever the build would change the lock, exit 2 with one line naming
the lock file, the node and both sides (the lock's digest and the one this build found or built),
and the lock left byte for byte as it was. A build that would not change it passes and leaves it
alone too (a lock `lock merge` wrote keeps its own header line)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import NEMO_DATA

ADVICE = "rebuild without --locked and commit the new lock"

TINY = """schema: 1
name: tiny
source: {path: model}
gpus: [sm90]
parallelism: [{tp: 1}, {tp: 2}]
limits: {max_input_len: 128, max_seq_len: 256}
"""


def trtbuild(project: Path, *args: str, store: str = "store") -> subprocess.CompletedProcess:
    env = {**os.environ, "TRTBUILD_CACHE": str(project / store), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "trtbuild", *args], capture_output=True, text=True, env=env,
                          cwd=project, timeout=600)


def build(project: Path, *args: str, store: str = "store") -> subprocess.CompletedProcess:
    return trtbuild(project, "build", "tiny.yaml", "--until", "checkpoint", *args, store=store)


def refusal(result: subprocess.CompletedProcess) -> str:
    """The one line a refused build ends with (the lines before it are the progress of the nodes it
    finished first); exit 2, nothing on stdout."""
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    lines = result.stderr.splitlines()
    assert [line for line in lines if "--locked" in line] == lines[-1:], result.stderr
    return lines[-1]


@pytest.fixture
def project(tmp_path) -> Path:
    """tiny.lock as a plain build writes it: the source and both checkpoints (`--until checkpoint`)."""
    shutil.copytree(NEMO_DATA / "hf_tiny_llama_tied_bf16", tmp_path / "model")
    (tmp_path / "tiny.yaml").write_text(TINY)
    first = build(tmp_path, "--json")
    assert first.returncode == 0, first.stderr
    tmp_path.joinpath("first.json").write_text(first.stdout)
    return tmp_path


def built(project: Path) -> dict:
    """The first (plain) build's nodes by name: their keys and digests."""
    return {t["name"]: t for t in json.loads((project / "first.json").read_text())["targets"]}


def edit(project: Path, change) -> bytes:
    """Edit tiny.lock's data with `change(data)`, write it back as the build writes it; its bytes."""
    lock = project / "tiny.lock"
    header = lock.read_text().splitlines(keepends=True)[0]
    data = yaml.safe_load(lock.read_text())
    change(data)
    lock.write_text(header + yaml.safe_dump(data, sort_keys=True, default_flow_style=False))
    return lock.read_bytes()


def test_an_unchanged_lock_passes_and_stays_as_it_is(project):
    before = (project / "tiny.lock").read_bytes()
    result = build(project, "--locked")
    assert result.returncode == 0, result.stderr
    assert (project / "tiny.lock").read_bytes() == before


def test_a_merged_lock_keeps_its_own_bytes(project):
    """The lock CI commits is `lock merge`'s (its own header line): the same content is no change."""
    from click.testing import CliRunner

    from trtbuild.cli import cli

    lock = project / "tiny.lock"
    merged = CliRunner().invoke(cli, ["lock", "merge", str(lock), "-o", str(lock)], catch_exceptions=False)
    assert merged.exit_code == 0, merged.output
    before = lock.read_bytes()
    assert before.startswith(b"# Written by `trtbuild lock merge`")
    for args in (("--locked",), ()):
        result = build(project, *args)
        assert result.returncode == 0, result.stderr
        assert lock.read_bytes() == before


def test_an_edited_target_digest_is_refused_naming_both_digests(project):
    nodes = built(project)
    edited = edit(project, lambda d: d["targets"]["base-tp1"].update(digest="f" * 64))
    line = refusal(build(project, "--locked"))
    assert line == (f"--locked: tiny.lock records base-tp1 as {'f' * 64}; this build found "
                    f"{nodes['base-tp1']['digest']} under the same key {nodes['base-tp1']['key']}; {ADVICE}")
    assert (project / "tiny.lock").read_bytes() == edited


def test_an_artifact_built_anew_under_the_locks_key_is_compared_after_the_build(project):
    """A fresh store (a CI runner): the key is the lock's, so the stage runs; the bytes it made are
    not the lock's, and the build stops there. The artifact stays in the store (content-addressed,
    named by no ref and by no lock: `cache gc` may take it)."""
    nodes = built(project)
    edited = edit(project, lambda d: d["targets"]["base-tp1"].update(digest="f" * 64))
    line = refusal(build(project, "--locked", store="fresh-store"))
    assert line == (f"--locked: tiny.lock records base-tp1 as {'f' * 64}; this build built "
                    f"{nodes['base-tp1']['digest']} under the same key {nodes['base-tp1']['key']}; {ADVICE}")
    assert (project / "tiny.lock").read_bytes() == edited
    assert (project / "fresh-store" / "ac" / f"{nodes['base-tp1']['key']}.json").exists()
    assert not (project / "fresh-store" / "refs" / "tiny" / "base-tp1").exists()  # no ref moved


def test_another_key_found_in_the_store_is_refused_naming_both_keys(project):
    nodes = built(project)
    edited = edit(project, lambda d: d["targets"]["base-tp2"].update(key="e" * 64))
    line = refusal(build(project, "--locked"))
    assert line == (f"--locked: tiny.lock records base-tp2 as {nodes['base-tp2']['digest']} (key {'e' * 64}); "
                    f"this build found {nodes['base-tp2']['digest']} (key {nodes['base-tp2']['key']}); {ADVICE}")
    assert (project / "tiny.lock").read_bytes() == edited


def test_another_key_not_in_the_store_is_refused_before_building(project):
    """Nothing the lock does not record is built: the build stops before the stage runs."""
    nodes = built(project)
    edited = edit(project, lambda d: d["targets"]["base-tp1"].update(key="e" * 64))
    line = refusal(build(project, "--locked", store="fresh-store"))
    assert line == (f"--locked: tiny.lock records base-tp1 as {nodes['base-tp1']['digest']} (key {'e' * 64}); "
                    f"this build's key {nodes['base-tp1']['key']} is not in the store (--locked builds only what "
                    f"the lock records); {ADVICE}")
    assert (project / "tiny.lock").read_bytes() == edited
    assert not (project / "fresh-store" / "ac" / f"{nodes['base-tp1']['key']}.json").exists()


def test_a_target_missing_from_the_lock_is_refused(project):
    nodes = built(project)
    edited = edit(project, lambda d: d["targets"].pop("base-tp2"))
    line = refusal(build(project, "--locked"))
    assert line == (f"--locked: tiny.lock has no base-tp2; this build found {nodes['base-tp2']['digest']} "
                    f"(key {nodes['base-tp2']['key']}); {ADVICE}")
    assert (project / "tiny.lock").read_bytes() == edited
    line = refusal(build(project, "--locked", store="fresh-store"))
    assert line == (f"--locked: tiny.lock has no base-tp2; this build's key {nodes['base-tp2']['key']} is not in "
                    f"the store (--locked builds only what the lock records); {ADVICE}")
    assert (project / "tiny.lock").read_bytes() == edited


def test_a_target_the_recipe_no_longer_has_is_refused_and_a_plain_build_drops_it(project):
    """The lock names a node this recipe's graph has not (a hand edit, or a trtbuild whose graph
    changed): refused before anything runs; the advice holds, a plain build drops the entry."""
    nodes = built(project)

    def add(data):
        data["targets"]["base-tp4"] = {**data["targets"]["base-tp2"]}
    edited = edit(project, add)
    result = build(project, "--locked", store="fresh-store")
    assert refusal(result) == (f"--locked: tiny.lock records base-tp4 as {nodes['base-tp2']['digest']}; the recipe "
                               f"has no such node; {ADVICE}")
    assert result.stderr.splitlines() == [refusal(result)]  # before any node ran
    assert not (project / "fresh-store" / "ac").exists()
    assert (project / "tiny.lock").read_bytes() == edited
    assert build(project).returncode == 0
    assert "base-tp4" not in yaml.safe_load((project / "tiny.lock").read_text())["targets"]
    assert build(project, "--locked").returncode == 0


def test_another_field_of_an_entry_is_refused_naming_both_values(project):
    """Key and digest are the lock's, its recorded size is not: the lock would still change."""
    nodes = built(project)
    edited = edit(project, lambda d: d["targets"]["base-tp1"].update(size=1))
    line = refusal(build(project, "--locked"))
    assert line == f"--locked: tiny.lock records targets.base-tp1.size as 1; this build's is {nodes['base-tp1']['size']}; {ADVICE}"
    assert (project / "tiny.lock").read_bytes() == edited


def test_an_edited_recipe_digest_names_the_lock_as_the_side_that_differs(project):
    recorded = yaml.safe_load((project / "tiny.lock").read_text())["recipe"]["digest"]
    edited = edit(project, lambda d: d["recipe"].update(digest="d" * 64))
    result = build(project, "--locked")
    assert refusal(result) == f"--locked: tiny.lock records recipe digest {'d' * 64}; the recipe tiny.yaml is {recorded}; {ADVICE}"
    assert result.stderr.splitlines() == [refusal(result)]
    assert (project / "tiny.lock").read_bytes() == edited


def test_a_changed_recipe_names_both_recipe_digests(project):
    lock = project / "tiny.lock"
    recorded = yaml.safe_load(lock.read_text())["recipe"]["digest"]
    before = lock.read_bytes()
    (project / "tiny.yaml").write_text(TINY.replace("max_seq_len: 256", "max_seq_len: 200"))
    line = refusal(build(project, "--locked"))
    assert re.fullmatch(rf"--locked: tiny\.lock records recipe digest {recorded}; the recipe tiny\.yaml is "
                        rf"(?!{recorded})[0-9a-f]{{64}}; {ADVICE}", line), line
    assert lock.read_bytes() == before


def test_a_changed_source_is_refused_and_the_lock_left_alone(project):
    before = (project / "tiny.lock").read_bytes()
    (project / "model" / "model.safetensors").write_bytes(b"other weights")
    line = refusal(build(project, "--locked"))
    assert line.startswith("--locked: the source resolves to ") and " but tiny.lock pins " in line, line
    assert (project / "tiny.lock").read_bytes() == before


def test_a_build_that_would_record_another_validation_mode_is_refused(project):
    before = (project / "tiny.lock").read_bytes()
    result = build(project, "--locked", "--no-validate")
    assert refusal(result) == f"--locked: tiny.lock records validation 'run'; this build's is 'skipped (--no-validate)'; {ADVICE}"
    assert result.stderr.splitlines() == [refusal(result)]
    assert (project / "tiny.lock").read_bytes() == before


def test_a_target_slice_compares_only_the_targets_it_builds(project):
    nodes = built(project)
    edited = edit(project, lambda d: d["targets"]["base-tp2"].update(digest="f" * 64))
    result = build(project, "--locked", "--target", "base-tp1")
    assert result.returncode == 0, result.stderr
    assert (project / "tiny.lock").read_bytes() == edited
    line = refusal(build(project, "--locked", "--target", "base-tp2"))
    assert line == (f"--locked: tiny.lock records base-tp2 as {'f' * 64}; this build found "
                    f"{nodes['base-tp2']['digest']} under the same key {nodes['base-tp2']['key']}; {ADVICE}")
    assert (project / "tiny.lock").read_bytes() == edited


def test_with_lock_out_the_recipe_and_source_are_checked_against_the_committed_lock(project):
    """A CI job's --lock-out: RECIPE.lock is never written; --locked checks the recipe and the
    source against it (the job's targets go to the slice, which `lock merge` compares)."""
    nodes = built(project)
    edited = edit(project, lambda d: d["targets"]["base-tp1"].update(digest="f" * 64))
    result = build(project, "--locked", "--lock-out", "out/job.lock")
    assert result.returncode == 0, result.stderr
    assert (project / "tiny.lock").read_bytes() == edited
    assert yaml.safe_load((project / "out" / "job.lock").read_text())["targets"]["base-tp1"]["digest"] == nodes["base-tp1"]["digest"]
    edited = edit(project, lambda d: d["recipe"].update(digest="d" * 64))
    (project / "out" / "job.lock").unlink()
    line = refusal(build(project, "--locked", "--lock-out", "out/job.lock"))
    assert line.startswith(f"--locked: tiny.lock records recipe digest {'d' * 64}; the recipe tiny.yaml is "), line
    assert (project / "tiny.lock").read_bytes() == edited
    assert not (project / "out" / "job.lock").exists()


def test_a_build_that_validates_nothing_keeps_the_verdict_the_lock_records_for_the_same_artifact(project):
    """The lock records why a target is held back (publication.held_back). A build that ran none of a
    target's validations (`--until checkpoint`) and found the same artifact keeps the recorded
    verdict: its validations are carried in the lock, so the verdict is what it was; it neither
    rewrites the lock nor is refused by --locked."""
    full = trtbuild(project, "build", "tiny.yaml", "--target", "base-tp1")
    assert full.returncode == 0, full.stderr
    lock = yaml.safe_load((project / "tiny.lock").read_text())
    assert (lock["targets"]["base-tp1"].get("held_back"), lock["targets"]["base-tp1:validate"]["gates_passed"]) == (
        None, True)
    before = (project / "tiny.lock").read_bytes()
    assert build(project, "--locked").returncode == 0
    plain = build(project)
    assert plain.returncode == 0, plain.stderr
    assert (project / "tiny.lock").read_bytes() == before
