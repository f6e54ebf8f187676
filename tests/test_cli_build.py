"""`trtbuild build` at the command line: bad recipes, `--gpu`, and the gates a recipe sets (exit 1
when one fails, 0 when they pass). On a tiny real model, each build stops at validate."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NEMO_DATA

TINY_HF = NEMO_DATA / "hf_tiny_llama_tied_bf16"
RECIPE = """schema: 1
name: tiny
source: {{path: model}}
gpus: [sm80, sm90]
limits: {{max_input_len: 128, max_seq_len: 256}}
{extra}
"""
UNKNOWN_GPU = re.compile(r"--gpu: 'T4' is not a known GPU; use an SM \((sm\d+, )+sm\d+\) or a product \([^()\n]+\)")


@pytest.fixture
def project(tmp_path) -> Path:
    model = tmp_path / "model"
    shutil.copytree(TINY_HF, model)
    for path in model.iterdir():
        path.chmod(0o644)
    return tmp_path


def write(project: Path, extra: str = "", name: str = "tiny.yaml") -> Path:
    path = project / name
    path.write_text(RECIPE.format(extra=extra))
    return path


def trtbuild(project: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtbuild", "build", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "TRTBUILD_CACHE": str(project / "store")}, cwd=project, timeout=900)


def targets(result: subprocess.CompletedProcess) -> dict[str, dict]:
    return {t["name"]: t for t in json.loads(result.stdout)["targets"]}


@pytest.mark.parametrize("extra, line", [
    ("variants: {fp8: {quant: fp9}}", "tiny.yaml:6:25: variants.fp8.quant: 'fp9' is not one of fp8, int8_sq, "
                                      "int4_awq, w4a8_awq, int8_wo, int4_wo, nvfp4"),
    ("variants: {fp8: {quant: fp8}", "tiny.yaml:7:1: YAML syntax error: expected ',' or '}', but got '<stream end>' "
                                       "(while parsing a flow mapping)"),
], ids=["schema", "syntax"])
def test_a_malformed_recipe_stops_build_with_one_line_and_no_store(project, extra, line):
    result = trtbuild(project, write(project, extra).name, "--json")
    assert (result.returncode, result.stdout, result.stderr) == (2, "", line + "\n")
    assert not (project / "store").exists()


def test_a_recipe_whose_source_is_missing_stops_build_with_one_line(project):
    recipe = write(project).read_text().replace("path: model", "path: nowhere")
    (project / "tiny.yaml").write_text(recipe)
    result = trtbuild(project, "tiny.yaml", "--json")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.strip() == f"tiny.yaml:3:16: source.path: {project / 'nowhere' / 'config.json'}: no such file"


def test_an_unknown_gpu_stops_build_with_one_line(project):
    result = trtbuild(project, write(project).name, "--gpu", "T4", "--json")
    assert (result.returncode, result.stdout) == (2, "")
    assert UNKNOWN_GPU.fullmatch(result.stderr.strip()), result.stderr


@pytest.mark.parametrize("args", [("--gpu", "T4"), ("--until", "publishing")], ids=["gpu", "until"])
def test_a_build_refused_on_its_input_creates_no_store(project, args):
    result = trtbuild(project, write(project).name, *args)
    assert result.returncode == 2
    assert not (project / "store").exists()


def test_a_recipe_whose_source_is_missing_creates_no_store(project):
    (project / "tiny.yaml").write_text(write(project).read_text().replace("path: model", "path: nowhere"))
    assert trtbuild(project, "tiny.yaml").returncode == 2
    assert not (project / "store").exists()


@pytest.mark.parametrize("args, line", [
    (("--gpu", "sm75"), "--gpu: 'sm75' is not a supported architecture; use one of sm80, sm86, sm89, sm90, sm100, sm120"),
    (("--until", "publishing"), "--until publishing: not a stage (source, calibration, quantize, checkpoint, hf-export, "
                                "hf-checkpoint, gguf-convert, gguf, reference, validate, engine)"),
    (("--locked",), "--locked: tiny.lock: no lock file; run `trtbuild build` without --locked to write it"),
], ids=["gpu", "until", "locked"])
def test_build_errors_are_exactly_one_line(project, args, line):
    result = trtbuild(project, write(project).name, *args)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", line + "\n")


def test_gpu_selects_the_engines_of_that_architecture_only(project):
    recipe = write(project).name
    everything = targets(trtbuild(project, recipe, "--until", "source", "--json"))
    sm90 = trtbuild(project, recipe, "--until", "source", "--gpu", "sm90", "--json")
    assert sm90.returncode == 0, sm90.stderr
    chosen = targets(sm90)
    engines = {name for name, t in chosen.items() if t["stage"] == "engine"}
    assert {name for name, t in everything.items() if t["stage"] == "engine"} == {
        "base-tp1-sm80", "base-tp1-sm80:twin", "base-tp1-sm90", "base-tp1-sm90:twin"}
    assert engines == {"base-tp1-sm90", "base-tp1-sm90:twin"}
    assert set(chosen) == set(everything) - {"base-tp1-sm80", "base-tp1-sm80:twin", "base-tp1-sm80:validate"}
    assert targets(trtbuild(project, recipe, "--until", "source", "--gpu", "H100", "--json")).keys() == chosen.keys()


def test_a_recipe_gate_fails_the_build_and_a_loose_one_passes_it(project):
    quantized = "variants: {int8: {quant: int8_sq}}\ncalibration: {samples: 2, seq_len: 32}\n"
    strict = write(project, quantized + "validate: {samples: 2, seq_len: 32, gates: {kld_mean: 0.0}}")
    failed = trtbuild(project, strict.name, "--until", "validate", "--json")
    assert failed.returncode == 1, failed.stderr
    check = targets(failed)["int8-tp1:validate"]
    value = check["gates"]["kld_mean"]["value"]
    assert check["status"] == "failed" and value > 0 and check["gates"]["kld_mean"]["passed"] is False
    report = Path(check["path"]) / "report.md"
    assert check["reason"] == f"failed its gates: kld_mean {value:.4g} (limit 0); report: {report}"
    assert report.is_file() and "**FAIL**" in report.read_text()

    loose = write(project, quantized + "validate: {samples: 2, seq_len: 32, gates: {kld_mean: 1.0}}")
    passed = trtbuild(project, loose.name, "--until", "validate", "--json")
    assert passed.returncode == 0, passed.stderr
    built = targets(passed)
    assert [built[n]["status"] for n in ("calibration", "int8-quantized", "int8-tp1", "reference")] == ["cached"] * 4
    check = built["int8-tp1:validate"]
    assert (check["status"], check["reason"]) == ("built", None)
    assert check["gates"]["kld_mean"] == {"value": value, "limit": 1.0, "passed": True}


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder`, a file with its bytes (None for a folder)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("store_arg", [None, "--store"], ids=["TRTBUILD_CACHE", "--store"])
def test_a_source_refused_at_build_time_writes_nothing(project, store_arg):
    """source.config lets the plan pass without the folder's config.json; the source stage then
    refuses the folder. The store (two folders deep, neither there) must not be created."""
    (project / "config.json").write_bytes((project / "model" / "config.json").read_bytes())
    (project / "model" / "config.json").unlink()
    recipe = write(project).read_text().replace("path: model", "path: model, config: config.json")
    (project / "tiny.yaml").write_text(recipe)
    before = tree(project)
    store = project / "deep" / "store"
    args = ["--store", store] if store_arg else []
    result = subprocess.run([sys.executable, "-m", "trtbuild", "build", "tiny.yaml", "--until", "source", *args],
                            capture_output=True, text=True, cwd=project, timeout=300,
                            env={**os.environ, "TRTBUILD_CACHE": str(store)})
    assert (result.returncode, result.stdout, result.stderr) == (
        2, "", f"source.path: {project / 'model'} has no config.json (is it a Hugging Face model folder?)\n")
    assert tree(project) == before


def test_a_source_refused_at_build_time_leaves_an_existing_store_as_it_was(project):
    built = trtbuild(project, write(project).name, "--until", "source")
    assert built.returncode == 0, built.stderr
    (project / "config.json").write_bytes((project / "model" / "config.json").read_bytes())
    (project / "model" / "config.json").unlink()
    (project / "tiny.yaml").write_text(write(project).read_text().replace("path: model", "path: model, config: config.json"))
    # index.db-shm is SQLite's shared-memory index of the write-ahead log: any reader rewrites it
    store = {path: data for path, data in tree(project / "store").items() if path != "index.db-shm"}
    result = trtbuild(project, "tiny.yaml", "--until", "source")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.endswith("has no config.json (is it a Hugging Face model folder?)\n")
    assert {path: data for path, data in tree(project / "store").items() if path != "index.db-shm"} == store
