"""One model load per variant (issue #15): quantize, both exports and validation of a variant run in
the build's shared worker and start from the model quantize made; the artifacts are the same bytes
as when a stage restores the model from the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tinymodels import make_model, make_tokenizer, pydoc_text
from trtbuild.store.local import LocalStore

RECIPE = """
schema: 1
name: shared-worker
source: {path: model}
dtype: bfloat16
variants:
  fp8: {quant: fp8, kv_cache: fp8}
  awq: {quant: int4_awq, group_size: 32}
calibration: {text: calibration.txt, samples: 4, seq_len: 32}
validate: {text: evaluation.txt, samples: 2, seq_len: 32}
parallelism: [{tp: 1}]
gpus: [sm90]
limits: {max_input_len: 128, max_seq_len: 256}
backends: [engine, hf-checkpoint]
"""
# the nodes that load a model, with the loads each costs when it runs in the shared worker
COLD_LOADS = {"reference": 1, "fp8-quantized": 1, "fp8-tp1": 0, "fp8-hf-export": 0, "fp8-tp1:validate": 0,
              "awq-quantized": 1, "awq-tp1": 0, "awq-hf-export": 0, "awq-tp1:validate": 0}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("shared-worker")
    make_model(folder / "model", "llama", make_tokenizer(folder / "tokenizer"))
    text = pydoc_text()
    (folder / "calibration.txt").write_text(text[:20000])
    (folder / "evaluation.txt").write_text(text[20000:40000])
    (folder / "recipe.yaml").write_text(RECIPE)
    return folder


def build(project: Path, store: Path, *args: str) -> dict:
    """`trtbuild build --until validate --json` run in-process, into `store`; its targets by name."""
    from click.testing import CliRunner

    from trtbuild.cli import cli

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRTBUILD_CACHE", str(store))
        result = CliRunner().invoke(cli, ["build", str(project / "recipe.yaml"), "--until", "validate", "--json", *args],
                                    catch_exceptions=False)
    assert result.exit_code == 0, result.output[-3000:]
    return {t["name"]: t for t in json.loads(result.stdout)["targets"]}


def figures(store: Path, targets: dict) -> dict[str, dict]:
    local = LocalStore(store)
    return {name: local.get_record(t["key"]).execution.figures for name, t in targets.items() if t["status"] == "built"}


@pytest.fixture(scope="module")
def cold(project, tmp_path_factory):
    store = tmp_path_factory.mktemp("cold") / "store"
    return store, build(project, store)


def test_a_cold_build_loads_each_variants_model_once(cold):
    store, targets = cold
    loads = {name: f["model_loads"] for name, f in figures(store, targets).items() if name in COLD_LOADS}
    assert loads == COLD_LOADS
    assert all(targets[name]["status"] == "built" for name in COLD_LOADS)


def test_stages_that_restore_the_model_from_the_store_make_the_same_bytes(cold, tmp_path, project):
    """What quantize kept in memory is what a later run restores from the store: exports and
    validation rebuilt from the restored model (their records lost, as a new stage version would
    do) are the same bytes as the cold build's, with one restore per variant and no calibration."""
    import shutil

    store, first = cold
    again = tmp_path / "store"
    shutil.copytree(store, again, symlinks=True)
    rebuilt = [f"{v}-{n}" for v in ("fp8", "awq") for n in ("tp1", "hf-export", "tp1:validate")]
    for name in rebuilt:
        LocalStore(again).delete_record(first[name]["key"])
    targets = build(project, again)
    assert (targets["fp8-quantized"]["status"], targets["awq-quantized"]["status"]) == ("cached", "cached")
    assert {name: targets[name]["status"] for name in rebuilt} == dict.fromkeys(rebuilt, "built")
    assert {name: targets[name]["digest"] for name in rebuilt} == {name: first[name]["digest"] for name in rebuilt}
    loads = {name: f["model_loads"] for name, f in figures(again, targets).items()}
    assert loads == {"fp8-tp1": 1, "fp8-hf-export": 0, "fp8-tp1:validate": 0,
                     "awq-tp1": 1, "awq-hf-export": 0, "awq-tp1:validate": 0}


def test_a_fully_cached_build_imports_no_heavy_package(cold, project):
    """A cache hit loads no model and starts no worker; the runner itself imports none of what
    the stages need (numpy and gguf included: they cost a no-op build 0.25 s). Nor, with its
    output on a pipe, rich (trtbuild.cli.plainout writes the same text), filelock (no lock is taken)
    or the code that moves artifacts to and from a remote store (issue #15: start-up)."""
    import os
    import subprocess
    import sys

    store, _ = cold
    script = f"""
import sys
attempted = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers', 'modelopt', 'numpy', 'gguf', 'safetensors', 'rich',
                                  'filelock') or name in ('trtbuild.deploy.push', 'trtbuild.store.transfer'):
            attempted.append(name)
        return None
sys.meta_path.insert(0, Spy())
from trtbuild.cli import cli
try:
    cli(['build', {str(project / 'recipe.yaml')!r}, '--until', 'validate'], standalone_mode=False)
except SystemExit as exit:
    print('EXIT', exit.code)
print('ATTEMPTED', attempted)
"""
    env = {name: value for name, value in os.environ.items() if name not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**env, "TRTBUILD_CACHE": str(store)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ATTEMPTED []" in result.stdout, result.stdout[-2000:]
    assert " built " not in result.stderr and "cached awq-tp1:validate" in " ".join(result.stderr.split())
