"""A lock never carries an answer about another artifact: a validation entry (or any entry) that a
build did not refresh is kept only while what it was made from is still what the lock names
(`inputs`: node id -> digest); a host without vLLM that rebuilds a changed checkpoint drops the
old vLLM validation, and `push` (which publishes from the lock) then publishes none of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import needs_no_trtllm, needs_no_vllm, standin_toolchain_env
from tinymodels import make_model, make_tokenizer
from trtbuild.lock import lockfile
from trtbuild.recipe.schema import load_recipe
from trtbuild.store.local import LocalStore
from trtbuild.store.summaries import parse_summary

from summarykit import validation_summary

D = {name: name * 64 for name in "0123456789abcdef"}  # digests and keys by one hex digit

# what each node is made from, as the graph says: a checkpoint from the source, its validations
# from the checkpoint and the reference
MADE_FROM = {"source": [], "reference": ["source"], "fp8-hf": ["source"],
             "fp8-hf:validate": ["fp8-hf", "reference"], "fp8-hf:validate-vllm": ["fp8-hf", "reference"]}


def result(node_id: str, stage: str, digest: str, key: str, summary: dict | None = None) -> SimpleNamespace:
    return SimpleNamespace(id=node_id, stage=stage, key=D[key], digest=D[digest] if digest else None, size=8,
                           summary=parse_summary(stage, summary or {}))


def validation(node_id: str, digest: str, key: str, runner: str) -> SimpleNamespace:
    return result(node_id, "validate", digest, key, validation_summary(0.01, runner=runner, device="cpu"))


def first_build(source: str = "1", checkpoint: str = "2") -> list:
    """A host with vLLM: everything ran."""
    return [result("source", "source", source, source), result("reference", "reference", "3", "3"),
            result("fp8-hf", "hf-checkpoint", checkpoint, checkpoint),
            validation("fp8-hf:validate", "4", "4", "torch"),
            validation("fp8-hf:validate-vllm", "5", "5", "vllm 0.33.0")]


@pytest.fixture
def loaded(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "recipe.yaml").write_text("schema: 1\nname: tiny\nsource: {path: model}\nbackends: [hf-checkpoint]\n"
                                          "variants: {fp8: {quant: fp8}}\ngpus: [sm90]\n")
    return load_recipe(tmp_path / "recipe.yaml")


def test_an_entry_records_the_artifacts_it_was_made_from(tmp_path, loaded):
    lock = lockfile.write(tmp_path / "recipe.lock", loaded, None, first_build(), {}, made_from=MADE_FROM)
    assert lock.targets["fp8-hf:validate-vllm"].inputs == {"fp8-hf": D["2"], "reference": D["3"]}
    assert lock.targets["fp8-hf"].inputs == {"source": D["1"]}
    assert lock.targets["source"].inputs is None
    written = yaml.safe_load((tmp_path / "recipe.lock").read_text())
    assert written["schema"] == 4
    assert written["targets"]["fp8-hf:validate-vllm"]["inputs"] == {"fp8-hf": D["2"], "reference": D["3"]}
    assert "inputs" not in written["targets"]["source"]


def test_a_validation_of_the_previous_artifact_is_not_carried(tmp_path, loaded):
    """The source changed (the recipe did not): the checkpoint is new, vLLM's validation was skipped
    on this host; the lock no longer names the old checkpoint's vLLM figures."""
    path = tmp_path / "recipe.lock"
    lockfile.write(path, loaded, None, first_build(), {}, made_from=MADE_FROM)
    skipped = result("fp8-hf:validate-vllm", "validate", None, "5")
    second = [*first_build(source="6", checkpoint="7")[:3], validation("fp8-hf:validate", "8", "8", "torch"), skipped]
    lock = lockfile.write(path, loaded, None, second, {}, made_from=MADE_FROM)
    assert sorted(lock.targets) == ["fp8-hf", "fp8-hf:validate", "reference", "source"]
    assert lockfile.read(path).targets == lock.targets


def test_a_validation_of_the_same_artifact_made_elsewhere_is_carried(tmp_path, loaded):
    """A GPU host with vLLM validated; a CPU host rebuilds nothing new: vLLM's entry stays."""
    path = tmp_path / "recipe.lock"
    first = lockfile.write(path, loaded, None, first_build(), {}, made_from=MADE_FROM)
    second = [*first_build()[:4], result("fp8-hf:validate-vllm", "validate", None, "5")]
    lock = lockfile.write(path, loaded, None, second, {}, made_from=MADE_FROM)
    assert lock.targets == first.targets


def test_an_entry_whose_input_went_is_not_carried_either(tmp_path, loaded):
    """Carried entries are checked against each other too: the reference was dropped (its source
    changed and this run did not rebuild it), so what was made from it goes with it."""
    path = tmp_path / "recipe.lock"
    lockfile.write(path, loaded, None, first_build(), {}, made_from=MADE_FROM)
    second = [result("source", "source", "6", "6")]  # --until source
    lock = lockfile.write(path, loaded, None, second, {}, made_from=MADE_FROM)
    assert sorted(lock.targets) == ["source"]


# ---- trtbuild build with the vLLM stand-in, then without vLLM ---------------------------------

RECIPE = """
schema: 1
name: tiny-stale
source: {path: model}
backends: [hf-checkpoint]
variants: {bf16: {}}
gpus: [sm90]
limits: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}
validate: {samples: 2, seq_len: 32}
"""


def trtbuild(env: dict, folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtbuild", *args], capture_output=True, text=True, env=env,
                          cwd=folder, timeout=900)


def build(env: dict, folder: Path) -> dict:
    done = trtbuild(env, folder, "build", "recipe.yaml", "--json")
    assert done.returncode == 0, done.stderr
    return {t["name"]: t for t in json.loads(done.stdout)["targets"]}


@needs_no_vllm
@needs_no_trtllm
def test_a_host_without_vllm_drops_the_old_checkpoints_vllm_validation(tmp_path):
    tokenizer = make_tokenizer(tmp_path / "tokenizer")
    make_model(tmp_path / "model", "llama", tokenizer)
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    base = {**os.environ, "TRTBUILD_CACHE": str(tmp_path / "store")}
    with_vllm = standin_toolchain_env(base, "H100", vllm=True, trtllm=False)
    first = build(with_vllm, tmp_path)
    assert first["bf16-hf:validate-vllm"]["status"] == "built"
    lock = yaml.safe_load((tmp_path / "recipe.lock").read_text())
    assert lock["targets"]["bf16-hf:validate-vllm"]["inputs"]["bf16-hf"] == first["bf16-hf"]["digest"]

    make_model(tmp_path / "model", "llama", tokenizer, seed=4321)  # other weights: the recipe is the same
    without = standin_toolchain_env(base, "H100", trtllm=False)
    second = build(without, tmp_path)
    assert second["bf16-hf"]["status"] == "built" and second["bf16-hf"]["digest"] != first["bf16-hf"]["digest"]
    assert second["bf16-hf:validate-vllm"]["status"] == "skipped"
    lock = yaml.safe_load((tmp_path / "recipe.lock").read_text())
    assert lock["targets"]["bf16-hf"]["digest"] == second["bf16-hf"]["digest"]
    assert "bf16-hf:validate-vllm" not in lock["targets"]
    # every entry left describes what the lock names: its inputs are the artifacts named there
    made_from = {(tid, dep, d) for tid, entry in lock["targets"].items() for dep, d in entry.get("inputs", {}).items()}
    assert ("bf16-hf:validate", "source", second["source"]["digest"]) in made_from
    assert all(lock["targets"][dep]["digest"] == d for _, dep, d in made_from)

    # push publishes from the lock: the new checkpoint with torch's validation, no vLLM figures
    pushed = trtbuild(without, tmp_path, "push", "recipe.yaml", "--store", str(tmp_path / "published"), "--json")
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout)["pushed"] == ["bf16-hf"]
    records = sorted(p.name for p in (tmp_path / "published" / "ac").iterdir())
    assert records == sorted(f"{lock['targets'][t]['key']}.json" for t in ("bf16-hf", "bf16-hf:validate"))
    refs = sorted(target for recipe, target, _ in LocalStore(tmp_path / "published").refs() if recipe == "tiny-stale")
    assert refs == ["bf16-hf", "bf16-hf:validate"]


def test_a_lock_whose_entry_describes_another_artifact_is_refused_in_one_line(tmp_path, loaded):
    path = tmp_path / "recipe.lock"
    lockfile.write(path, loaded, None, first_build(), {}, made_from=MADE_FROM)
    data = yaml.safe_load(path.read_text())
    data["targets"]["fp8-hf"]["digest"] = D["9"]  # edited by hand: the validations describe "2" * 64
    path.write_text(lockfile.HEADER + yaml.safe_dump(data))
    with pytest.raises(lockfile.InvalidInput) as err:
        lockfile.read(path)
    assert str(err.value) == (f"{path}: targets.fp8-hf:validate: made from fp8-hf {D['2']}, but fp8-hf is {D['9']} "
                              "(edited by hand? rebuild without --locked to rewrite it)")
