"""`trtbuild lock merge A.lock B.lock ... -o recipe.lock`: the per-job locks of a CI matrix become
one lock, the same bytes whatever the order; locks that disagree are refused in one line (exit 2)
and -o is left as it was. `build --lock-out` writes the partial lock a job uploads."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from conftest import NEMO_DATA
from trtbuild.cli import cli

HEADER = "# Written by `trtbuild build`: commit it; `trtbuild build --locked` checks against it. Do not edit.\n"
MERGED = "# Written by `trtbuild lock merge`: commit it; `trtbuild build --locked` checks against it. Do not edit.\n"
RECIPE = {"name": "tiny", "digest": "a" * 64}
SOURCE = {"kind": "path", "location": "model", "digest": "5" * 64,
          "files": {"config.json": "6" * 64, "model.safetensors": "7" * 64}}
IMAGE = {"image": "nvcr.io/nvidia/tensorrt-llm/release@sha256:" + "8" * 64}


def entry(stage: str, key: str, digest: str, **extra) -> dict:
    return {"stage": stage, "key": key * 64, "digest": digest * 64, "size": 1000, **extra}


def platform(sm: str) -> dict:
    return {"sm": sm, "tp": 1, "pp": 1, "world_size": 1, "tensorrt_llm": "1.2.1", "tensorrt": "10.13.2",
            "image": IMAGE["image"], "quantization": None, "engine_bytes_per_rank": 5000, "standin": False}


SHARED = {  # every job builds its engine from the same source and checkpoint
    "source": entry("source", "1", "1"),
    "base-tp1": entry("checkpoint", "2", "2"),
    "base-tp1:validate": entry("validate", "3", "3", metrics={"kld_mean": 0.0123}, gates_passed=True),
}
SM80 = {"base-tp1-sm80": entry("engine", "4", "4", platform=platform("sm80")),
        "base-tp1-sm80:validate": entry("validate", "9", "9", metrics={"kld_mean": 0.0131}, gates_passed=True)}
SM90 = {"base-tp1-sm90": entry("engine", "b", "b", platform=platform("sm90"))}
HF = {"base-hf": entry("hf-checkpoint", "c", "c", serves={"vllm": ["sm80", "sm90"]})}


def lock(targets: dict, toolchain: dict | None = None, **fields) -> dict:
    data = {"schema": 4, "recipe": RECIPE, "source": SOURCE, "validation": "run", "targets": targets,
            "toolchain": toolchain if toolchain is not None else {"checkpoint:convert": {"safetensors": "0.8.0"}}}
    return {**data, **fields}


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + yaml.safe_dump(data, sort_keys=True, default_flow_style=False))
    return path


def merge(*args):
    return CliRunner().invoke(cli, ["lock", "merge", *map(str, args)], catch_exceptions=False)


@pytest.fixture
def jobs(tmp_path) -> list[Path]:
    """Three jobs' locks as a CI run downloads them: one folder per job artifact."""
    engine = {"checkpoint:convert": {"safetensors": "0.8.0"}, "engine": IMAGE}
    return [write(tmp_path / "job-sm80" / "tiny.lock", lock({**SHARED, **SM80}, engine)),
            write(tmp_path / "job-sm90" / "tiny.lock", lock({**SHARED, **SM90}, engine)),
            write(tmp_path / "job-hf" / "tiny.lock", lock({"source": SHARED["source"], **HF},
                                                          {"checkpoint:export": {"modelopt": "0.47.0"}}))]


def test_the_merge_is_the_union_of_the_jobs_and_the_same_bytes_in_any_order(tmp_path, jobs):
    expected = lock({**SHARED, **SM80, **SM90, **HF},
                    {"checkpoint:convert": {"safetensors": "0.8.0"}, "checkpoint:export": {"modelopt": "0.47.0"},
                     "engine": IMAGE})
    outputs = set()
    for i, order in enumerate(itertools.permutations(jobs)):
        out = tmp_path / f"merged-{i}.lock"
        result = merge(*order, "-o", out)
        assert (result.exit_code, result.stderr) == (0, "")
        assert result.stdout == f"merged 3 lock files (7 targets) into {out}\n"
        outputs.add(out.read_bytes())
    assert len(outputs) == 1
    assert outputs.pop().decode() == MERGED + yaml.safe_dump(expected, sort_keys=True, default_flow_style=False)


def test_the_merged_lock_reads_back_as_a_lock(tmp_path, jobs):
    from trtbuild.lock import lockfile

    out = tmp_path / "tiny.lock"
    assert merge(*jobs, "-o", out).exit_code == 0
    merged = lockfile.read(out)
    assert sorted(merged.targets) == sorted({**SHARED, **SM80, **SM90, **HF})
    assert merged.recipe.digest == RECIPE["digest"] and merged.source == SOURCE


def test_one_lock_is_rewritten_as_the_lock_writer_writes_it(tmp_path, jobs):
    out = tmp_path / "one.lock"
    assert merge(jobs[1], "-o", out).exit_code == 0
    assert out.read_text() == MERGED + jobs[1].read_text().removeprefix(HEADER)


def refused(tmp_path, *inputs, line: str, existing: bytes | None = b"the lock committed before\n"):
    """Merge `inputs` into an -o that holds `existing` (or none): one line, exit 2, -o untouched."""
    out = tmp_path / "out" / "tiny.lock"
    if existing is not None:
        out.parent.mkdir(exist_ok=True)
        out.write_bytes(existing)
    for order in (inputs, inputs[::-1]):  # the same line whatever the order
        result = merge(*order, "-o", out)
        assert (result.exit_code, result.stdout, result.stderr) == (2, "", line + "\n")
    if existing is None:
        assert not out.parent.exists()
    else:
        assert out.read_bytes() == existing
        assert os.listdir(out.parent) == ["tiny.lock"]  # and no temp file beside it


def test_two_digests_for_one_target_are_refused_naming_the_target_and_both(tmp_path):
    a = write(tmp_path / "a" / "tiny.lock", lock({**SHARED, **SM80}))
    rebuilt = {**SHARED, "base-tp1": entry("checkpoint", "2", "e")}  # same key, another artifact
    b = write(tmp_path / "b" / "tiny.lock", lock({**rebuilt, **SM90}))
    refused(tmp_path, a, b, line=f"lock merge: target base-tp1: {a} has artifact {'2' * 64}, {b} has {'e' * 64} "
                                 f"(same key {'2' * 64}: a stage that is not bit-reproducible built it in both jobs)")


def test_a_validation_of_another_artifact_than_the_merged_lock_names_is_refused(tmp_path):
    """One job's lock carries vLLM's validation of a checkpoint other than the one another job's
    lock names: merged, the lock would hold an answer about another artifact."""
    stale = entry("validate", "d", "d", metrics={"kld_mean": 0.02}, gates_passed=True, runner="vllm 0.26.0",
                  device="cuda:0", inputs={"base-hf": "e" * 64, "source": "1" * 64})
    a = write(tmp_path / "a" / "tiny.lock", lock({"source": SHARED["source"], "base-hf:validate-vllm": stale}))
    b = write(tmp_path / "b" / "tiny.lock", lock({"source": SHARED["source"], **HF}))
    refused(tmp_path, a, b, line=f"lock merge: target base-hf:validate-vllm: {a} records it as made from base-hf "
                                 f"{'e' * 64}, {b} has base-hf {'c' * 64}; merge the --lock-out locks of one CI run")


def test_a_validation_of_the_artifact_the_merged_lock_names_is_kept(tmp_path):
    fresh = entry("validate", "d", "d", metrics={"kld_mean": 0.02}, gates_passed=True, runner="vllm 0.26.0",
                  device="cuda:0", inputs={"base-hf": "c" * 64, "source": "1" * 64})
    a = write(tmp_path / "a" / "tiny.lock", lock({"source": SHARED["source"], "base-hf:validate-vllm": fresh}))
    b = write(tmp_path / "b" / "tiny.lock", lock({"source": SHARED["source"], **HF}))
    out = tmp_path / "tiny.lock"
    result = merge(a, b, "-o", out)
    assert (result.exit_code, result.stderr) == (0, "")
    assert yaml.safe_load(out.read_text())["targets"] == {"source": SHARED["source"], "base-hf:validate-vllm": fresh,
                                                          **HF}


def test_two_keys_for_one_target_are_refused_naming_both_digests(tmp_path):
    a = write(tmp_path / "a" / "tiny.lock", lock({**SHARED, **SM80}))
    other = {**SHARED, "base-tp1": entry("checkpoint", "f", "e")}
    b = write(tmp_path / "b" / "tiny.lock", lock({**other, **SM90}))
    refused(tmp_path, a, b, existing=None,
            line=f"lock merge: target base-tp1: {a} has artifact {'2' * 64}, {b} has {'e' * 64} "
                 f"(keys {'2' * 64} and {'f' * 64}: built from different inputs)")


def test_locks_of_different_recipe_versions_are_refused(tmp_path):
    a = write(tmp_path / "a" / "tiny.lock", lock(SHARED))
    b = write(tmp_path / "b" / "tiny.lock", lock(SHARED, recipe={"name": "tiny", "digest": "d" * 64}))
    refused(tmp_path, a, b, line=f"lock merge: {b} is of recipe tiny at {'d' * 64}, {a} of tiny at {'a' * 64}; "
                                 "merge the locks of one CI run (one version of the recipe)")


def test_locks_of_different_sources_are_refused(tmp_path):
    a = write(tmp_path / "a" / "tiny.lock", lock(SHARED))
    b = write(tmp_path / "b" / "tiny.lock", lock(SHARED, source={**SOURCE, "digest": "0" * 64}))
    refused(tmp_path, a, b, line=f"lock merge: {b} pins source path model at {'0' * 64}, {a} at {'5' * 64}; "
                                 "every job must build from one source (build --locked)")


def test_a_validated_and_an_unvalidated_lock_are_refused(tmp_path):
    a = write(tmp_path / "a" / "tiny.lock", lock({**SHARED, **SM80}))
    b = write(tmp_path / "b" / "tiny.lock", lock({**SHARED, **SM90}, validation="skipped (--no-validate)"))
    refused(tmp_path, a, b, line=f"lock merge: {b} records validation 'skipped (--no-validate)', {a} 'run'; "
                                 "merge locks of builds that all validated, or all ran --no-validate")


def test_two_toolchains_for_one_stage_are_refused(tmp_path):
    a = write(tmp_path / "a" / "tiny.lock", lock({**SHARED, **SM80}, {"engine": IMAGE}))
    b = write(tmp_path / "b" / "tiny.lock", lock({**SHARED, **SM90}, {"engine": {"image": "other@sha256:" + "9" * 64}}))
    refused(tmp_path, a, b, line=f"lock merge: toolchain of stage engine: {b} has image other@sha256:{'9' * 64}, "
                                 f"{a} has image {IMAGE['image']}; every job must build in the same image")


def test_a_missing_or_broken_input_is_one_line(tmp_path):
    a = write(tmp_path / "a" / "tiny.lock", lock(SHARED))
    missing = tmp_path / "b" / "tiny.lock"
    out = tmp_path / "out.lock"
    result = merge(a, missing, "-o", out)
    assert (result.exit_code, result.stderr) == (2, f"lock merge: {missing}: no such lock file\n")
    broken = tmp_path / "broken.lock"
    broken.write_text("- targets\n")
    result = merge(a, broken, "-o", out)
    assert (result.exit_code, result.stderr) == (2, f"{broken}: not a trtbuild lock file (not a mapping)\n")
    assert not out.exists()


def test_a_write_that_fails_leaves_the_old_lock_whole(tmp_path, jobs, monkeypatch):
    out = tmp_path / "out" / "tiny.lock"
    out.parent.mkdir()
    out.write_bytes(b"the lock committed before\n")

    def no_space(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("trtbuild.store.hash.os.replace", no_space)
    result = merge(*jobs, "-o", out)
    assert (result.exit_code, result.stderr) == (2, f"lock merge: cannot write {out}: No space left on device\n")
    assert out.read_bytes() == b"the lock committed before\n"
    assert os.listdir(out.parent) == ["tiny.lock"]  # no temp file left beside it


# --- the partial locks of real jobs: `build --lock-out` -------------------------------------------

TINY = """schema: 1
name: tiny
source: {path: model}
gpus: [sm80, sm90]
parallelism: [{tp: 1}, {tp: 2}]
limits: {max_input_len: 128, max_seq_len: 256}
"""


def build(project: Path, store: str, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {}), "TRTBUILD_CACHE": str(project / store), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "trtbuild", "build", "tiny.yaml", "--until", "checkpoint", *args],
                          capture_output=True, text=True, env=env, cwd=project, timeout=600)


def test_each_job_writes_only_its_slice_and_the_merge_is_the_whole_build(tmp_path):
    from trtbuild.lock import lockfile

    shutil.copytree(NEMO_DATA / "hf_tiny_llama_tied_bf16", tmp_path / "model")
    (tmp_path / "tiny.yaml").write_text(TINY)
    first = build(tmp_path, "dev-store", "--until", "source")  # the committed lock: the source, pinned
    assert first.returncode == 0, first.stderr
    committed = (tmp_path / "tiny.lock").read_bytes()
    for job, target in (("tp1", "base-tp1"), ("tp2", "base-tp2")):  # each CI job: a fresh runner's store
        result = build(tmp_path, f"store-{job}", "--locked", "--target", target, "--json",
                       "--lock-out", f"out/{job}.lock")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["lock"] == f"out/{job}.lock"
        assert sorted(lockfile.read(tmp_path / "out" / f"{job}.lock").targets) == sorted(["source", target])
    assert (tmp_path / "tiny.lock").read_bytes() == committed  # what --locked checks stays as committed
    assert merge(tmp_path / "out" / "tp2.lock", tmp_path / "out" / "tp1.lock", "-o", tmp_path / "merged.lock").exit_code == 0
    whole = build(tmp_path, "dev-store", "--target", "base-tp*")  # one host building both
    assert whole.returncode == 0, whole.stderr
    assert lockfile.read(tmp_path / "merged.lock") == lockfile.read(tmp_path / "tiny.lock")


@pytest.fixture
def bucket():
    from s3server import SeaweedS3

    with SeaweedS3() as server:
        server.client().create_bucket(Bucket="artifacts")
        yield server


def test_a_job_pushes_and_publishes_only_its_slice(tmp_path, bucket):
    """A CI runner's checkout holds the lock of a whole earlier build; the job's --push publishes
    its own targets, and the lock it uploads is its partial one."""
    shutil.copytree(NEMO_DATA / "hf_tiny_llama_tied_bf16", tmp_path / "model")
    (tmp_path / "tiny.yaml").write_text(TINY)
    # both unvalidated (--no-validate, which --allow-unvalidated publishes anyway): a build that stops
    # before its validations (--until checkpoint) holds its targets back (trtbuild/lock/publication.py)
    earlier = build(tmp_path, "dev-store", "--target", "base-tp*", "--no-validate")  # the committed lock: both
    assert earlier.returncode == 0, earlier.stderr
    result = build(tmp_path, "runner-store", "--locked", "--target", "base-tp2", "--no-validate", "--store",
                   "s3://artifacts/ci", "--push", "--allow-unvalidated", "--json", "--lock-out", "out/tp2.lock",
                   env={**bucket.env(), "AWS_EC2_METADATA_DISABLED": "true"})
    assert result.returncode == 0, result.stderr
    pushed = json.loads(result.stdout)["push"]
    assert (pushed["pushed"], pushed["refused"]) == (["base-tp2"], [])
    job_lock = (tmp_path / "out" / "tp2.lock").read_bytes()
    name = f"ci/locks/tiny/{hashlib.sha256(job_lock).hexdigest()}.lock"
    assert bucket.client().get_object(Bucket="artifacts", Key=name)["Body"].read() == job_lock


def test_a_recipe_given_for_a_lock_is_one_line_naming_what_merge_takes(tmp_path, jobs):
    """`lock merge RECIPE`: the advice is what lock merge takes, not a rebuild with --locked."""
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY)
    out = tmp_path / "out.lock"
    result = merge(jobs[0], recipe, "-o", out)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"lock merge: {recipe} is a recipe, not a lock file; lock merge takes the lock files "
                             "`trtbuild build --lock-out PATH` writes (one per CI job)\n")
    assert not out.exists()
