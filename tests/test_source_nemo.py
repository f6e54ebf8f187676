"""`nemo:` sources through `trtbuild build`: the real NeMo checkpoints in tests/data/nemo become
the Hugging Face folders they came from, locally and from S3."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NEMO_DATA

DATA = NEMO_DATA

CASES = [("nemo1_tiny_llama_gqa_fp32_torch_dist.nemo", "hf_tiny_llama_gqa_fp32"),
         ("nemo2_tiny_llama_tied_bf16", "hf_tiny_llama_tied_bf16")]


def recipe_for(tmp_path: Path, location: str, twin: str) -> Path:
    shutil.copyfile(DATA / twin / "config.json", tmp_path / "config.json")
    recipe = tmp_path / "nemo.yaml"
    recipe.write_text(f"schema: 1\nname: nemo-tiny\nsource: {{nemo: '{location}', config: config.json}}\n"
                      "gpus: [sm90]\nlimits: {max_input_len: 128, max_seq_len: 256}\n")
    return recipe


def build(recipe: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtbuild", "build", str(recipe), "--until", "source", "--json"],
                          capture_output=True, text=True, env=env, timeout=300)


def assert_same_model(folder: Path, twin: Path) -> None:
    from safetensors.torch import load_file
    import torch

    ours, theirs = load_file(folder / "model.safetensors"), load_file(twin / "model.safetensors")
    assert set(ours) == set(theirs)
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name
    config, expected = json.loads((folder / "config.json").read_text()), json.loads((twin / "config.json").read_text())
    for key in ("architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "rms_norm_eps", "rope_theta", "tie_word_embeddings"):
        assert config.get(key) == expected.get(key), key


@pytest.mark.parametrize("checkpoint, twin", CASES)
def test_a_nemo_checkpoint_builds_into_its_hugging_face_twin(tmp_path, checkpoint, twin):
    env = {**os.environ, "TRTBUILD_CACHE": str(tmp_path / "store")}
    recipe = recipe_for(tmp_path, str(DATA / checkpoint), twin)
    first = build(recipe, env)
    assert first.returncode == 0, first.stderr
    source = next(t for t in json.loads(first.stdout)["targets"] if t["name"] == "source")
    assert source["status"] == "built"
    assert_same_model(Path(source["path"]), DATA / twin)
    assert not (Path(source["path"]) / "logs").exists()  # a stage's log is the action record's
    again = build(recipe, env)
    assert next(t for t in json.loads(again.stdout)["targets"] if t["name"] == "source")["status"] == "cached"


def test_a_malformed_archive_is_one_line_and_leaves_nothing(tmp_path):
    bad = tmp_path / "broken.nemo"
    bad.write_bytes((DATA / CASES[0][0]).read_bytes()[:5000])  # truncated tar
    env = {**os.environ, "TRTBUILD_CACHE": str(tmp_path / "store")}
    result = build(recipe_for(tmp_path, str(bad), CASES[0][1]), env)
    assert result.returncode == 2 and result.stdout == ""
    # the store is new, and keeps the failed stage's log: it says so, then the one line of the error
    new_store, line = result.stderr.strip().splitlines()
    assert new_store == f"new store at {tmp_path / 'store'}"
    assert line.startswith(f"{bad}: malformed .nemo archive (")
    log = Path(line.rsplit("(log: ", 1)[1].rstrip(")"))  # the stage's log is kept, as for any failure
    assert log.is_dir() and any(p.read_text().strip() for p in log.iterdir())
    assert not list((tmp_path / "store" / "ac").glob("*.json"))
    assert not [p for p in (tmp_path / "store" / "tmp").iterdir()]


def test_a_missing_checkpoint_is_an_input_error(tmp_path):
    env = {**os.environ, "TRTBUILD_CACHE": str(tmp_path / "store")}
    result = build(recipe_for(tmp_path, "nowhere.nemo", CASES[0][1]), env)
    assert result.returncode == 2 and result.stderr.strip() == f"source.nemo: {tmp_path / 'nowhere.nemo'}: no such file or folder"


def plain_recipe(tmp_path: Path, location: str) -> Path:
    recipe = tmp_path / "plain.yaml"
    recipe.write_text(f"schema: 1\nname: nemo-tiny\nsource: {{nemo: '{location}'}}\n"
                      "gpus: [sm90]\nlimits: {max_input_len: 128, max_seq_len: 256}\n")
    return recipe


@pytest.mark.parametrize("checkpoint, twin", CASES)
def test_plan_reads_the_model_config_inside_the_checkpoint(tmp_path, checkpoint, twin):
    """No source.config: the .nemo's model_config.yaml (and the tokenizer it names, for the
    vocabulary size) or the NeMo 2 context/model.yaml give the plan the twin's config.json."""
    import dataclasses

    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe

    ours = plan_recipe(load_recipe(plain_recipe(tmp_path, str(DATA / checkpoint))))
    theirs = plan_recipe(load_recipe(recipe_for(tmp_path, str(DATA / checkpoint), twin)))
    assert ours.config_origin == f"NeMo model config in {DATA / checkpoint}"
    assert theirs.config_origin == f"source.config {tmp_path / 'config.json'}"
    assert dataclasses.replace(ours.model, source="") == dataclasses.replace(theirs.model, source="")
    assert [t.as_json() for t in ours.targets] == [t.as_json() for t in theirs.targets]


def test_plan_of_a_broken_archive_is_one_line_naming_it(tmp_path):
    bad = tmp_path / "broken.nemo"
    bad.write_bytes((DATA / CASES[0][0]).read_bytes()[:5000])  # cut inside the tokenizer member
    result = subprocess.run([sys.executable, "-m", "trtbuild", "plan", str(plain_recipe(tmp_path, str(bad)))],
                            capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"{bad}: malformed .nemo archive (ReadError: unexpected end of data)\n"


def test_plan_stops_reading_an_archive_at_its_weights(tmp_path):
    """Cut inside model_weights/: the config and tokenizer members come first (NeMo tars are
    sorted), so planning never reaches the damage; building would."""
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe

    whole = (DATA / CASES[0][0]).read_bytes()
    cut = tmp_path / "cut.nemo"
    cut.write_bytes(whole[:100_000])
    assert whole.index(b"__0_0.distcp") < 100_000 < len(whole)
    ours = plan_recipe(load_recipe(plain_recipe(tmp_path, str(cut))))
    assert ours.model.num_layers == 2 and ours.model.vocab_size == 1000
    empty = tmp_path / "empty.nemo"
    empty.write_bytes(b"")
    plain = tarfile_with(tmp_path / "plain.nemo", {"README.md": b"no config here"})
    for path, message in ((empty, f"{empty}: not a .nemo archive (neither a tar nor a gzipped tar): empty file"),
                          (plain, f"source.nemo: {plain}: not a NeMo checkpoint (no model_config.yaml, no context/)")):
        result = subprocess.run([sys.executable, "-m", "trtbuild", "plan", str(plain_recipe(tmp_path, str(path)))],
                                capture_output=True, text=True, timeout=120)
        assert (result.returncode, result.stderr) == (2, message + "\n")


def tarfile_with(path: Path, files: dict[str, bytes]) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w:") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_planning_nemo_and_gguf_sources_imports_no_torch(tmp_path):
    # The import hook of test_cli's plan test, on the sources whose configs plan now reads itself.
    recipe = plain_recipe(tmp_path, str(DATA / CASES[0][0]))
    script = f"""
import sys
attempted = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers', 'modelopt'):
            attempted.append(name)
        return None
sys.meta_path.insert(0, Spy())
from trtbuild.cli import cli
for args in (['plan', {str(recipe)!r}], ['plan', {str(DATA.parent.parent.parent / 'trtbuild' / 'recipes' / 'smollm2-demo.yaml')!r}]):
    try:
        cli(args, standalone_mode=False)
    except SystemExit:
        pass
print('ATTEMPTED', attempted)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    out = " ".join(result.stdout.split())
    assert "ATTEMPTED []" in out, out[-2000:]
    assert f"(config: NeMo model config in {DATA / CASES[0][0]})" in out and "(config: GGUF header of " in out
