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
    assert (Path(source["path"]) / "logs" / "source.log").exists()
    again = build(recipe, env)
    assert next(t for t in json.loads(again.stdout)["targets"] if t["name"] == "source")["status"] == "cached"


def test_a_malformed_archive_is_one_line_and_leaves_nothing(tmp_path):
    bad = tmp_path / "broken.nemo"
    bad.write_bytes((DATA / CASES[0][0]).read_bytes()[:5000])  # truncated tar
    env = {**os.environ, "TRTBUILD_CACHE": str(tmp_path / "store")}
    result = build(recipe_for(tmp_path, str(bad), CASES[0][1]), env)
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"{bad}: malformed .nemo archive (")
    log = Path(line.rsplit("(log: ", 1)[1].rstrip(")"))  # the stage's log is kept, as for any failure
    assert log.is_dir() and any(p.read_text().strip() for p in log.iterdir())
    assert not list((tmp_path / "store" / "ac").glob("*.json"))
    assert not [p for p in (tmp_path / "store" / "tmp").iterdir()]


def test_a_missing_checkpoint_is_an_input_error(tmp_path):
    env = {**os.environ, "TRTBUILD_CACHE": str(tmp_path / "store")}
    result = build(recipe_for(tmp_path, "nowhere.nemo", CASES[0][1]), env)
    assert result.returncode == 2 and result.stderr.strip() == f"source.nemo: {tmp_path / 'nowhere.nemo'}: no such file or folder"
