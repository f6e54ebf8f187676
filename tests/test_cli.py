"""The CLI as a user runs it: formats, exit codes, the embedded default and the shipped recipes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jsonschema
import pytest
import yaml

from conftest import RECIPES, ROOT, minimal
from trtbuild import __version__

SHIPPED = sorted(RECIPES.glob("*.yaml"))


def test_version_and_help(run):
    result = run("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"trtbuild, version {__version__}"
    result = run("--help")
    assert result.exit_code == 0
    for command in ("plan", "schema"):
        assert command in result.stdout


def test_python_m_trtbuild_works():
    result = subprocess.run([sys.executable, "-m", "trtbuild", "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: trtbuild [OPTIONS] COMMAND [ARGS]...")


def test_cli_never_imports_torch_transformers_or_modelopt(tmp_path):
    # A meta-path hook records every attempt, even one that would fail because nothing is installed.
    script = f"""
import sys
attempted = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers', 'modelopt'):
            attempted.append(name)
        return None
sys.meta_path.insert(0, Spy())
import trtbuild, trtbuild.cli
from trtbuild.cli import cli
for args in (['--help'], ['plan', '--format', 'json'], ['plan', {str(RECIPES / 'llama-3.1-8b-instruct.yaml')!r}], ['schema']):
    try:
        cli(args, standalone_mode=False)
    except SystemExit:
        pass
print('ATTEMPTED', attempted)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "ATTEMPTED []" in result.stdout, result.stdout[-2000:]


def test_plan_without_arguments_plans_the_embedded_demo(run):
    result = run("plan", "--format", "json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["recipe"] == "smollm2-135m-demo"
    assert data["model"]["architecture"] == "LlamaForCausalLM"
    assert data["model"]["parameters"]["total"] == 134_515_008  # SmolLM2-135M, tied embeddings
    assert {t["name"] for t in data["targets"]} >= {"base-tp1", "fp8-tp1-sm90", "int8-wo-hf"}


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_recipes_plan_cleanly(run, path):
    result = run("plan", path, "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["targets"] and all(t["status"] == "ok" for t in data["targets"]), [
        (t["name"], t["reason"]) for t in data["targets"] if t["status"] != "ok"]


def test_shipped_recipes_validate_against_the_published_json_schema(run):
    result = run("schema")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in SHIPPED:
        validator.validate(yaml.safe_load(path.read_text()))
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"schema": 1, "name": "x", "source": {"path": "m"}, "variants": {"a": {"quant": "fp9"}}})
    assert set(schema["properties"]) >= {"schema", "name", "source", "variants", "validate", "publish", "gpus"}


def test_json_format_fields(ws, run):
    path = ws.recipe(minimal("variants: {fp8: {quant: fp8}}"), )
    result = run("plan", path, "--gpu", "H100", "--format", "json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["recipe"] == "tiny"
    ckpt, engine = data["targets"]
    expected_keys = {"name", "kind", "variant", "tp", "pp", "gpu", "backend", "status", "reason", "depends_on", "estimate"}
    assert expected_keys <= set(engine)
    assert engine["name"] == "fp8-tp1-sm90" and engine["depends_on"] == ["fp8-tp1"] and engine["status"] == "ok"
    assert {"weights_bytes_per_gpu", "kv_bytes_per_token", "kv_tokens", "fits"} <= set(engine["estimate"])
    assert engine["estimate"]["fits"] is True and engine["estimate"]["kv_tokens"] > 0
    assert ckpt["kind"] == "checkpoint" and ckpt["estimate"]["kv_tokens"] is None


def test_github_matrix_lists_buildable_engines_grouped_by_gpu(ws, run):
    a = ws.recipe(minimal("variants: {bf16: {}, fp8: {quant: fp8}}\nparallelism: [{tp: 1}, {tp: 2}]", gpus="[sm90, sm80]"), name="a.yaml")
    b = ws.recipe(minimal("", gpus="[sm89]"), name="b.yaml")
    result = run("plan", a, b, "--format", "github-matrix")
    assert result.exit_code == 0
    include = json.loads(result.stdout)["include"]
    assert [e["gpu"] for e in include] == sorted((e["gpu"] for e in include), key=lambda g: int(g[2:]))
    targets = {(e["recipe"].rsplit("/", 1)[-1], e["target"]) for e in include}
    # fp8 on sm80 is impossible, so it is not in the matrix; checkpoints never are
    assert targets == {("a.yaml", "bf16-tp1-sm80"), ("a.yaml", "bf16-tp2-sm80"), ("b.yaml", "base-tp1-sm89"),
                       ("a.yaml", "bf16-tp1-sm90"), ("a.yaml", "bf16-tp2-sm90"), ("a.yaml", "fp8-tp1-sm90"), ("a.yaml", "fp8-tp2-sm90")}
    entry = next(e for e in include if e["target"] == "fp8-tp2-sm90")
    assert entry == {"recipe": str(a), "target": "fp8-tp2-sm90", "gpu": "sm90", "variant": "fp8", "tp": 2, "pp": 1, "num_gpus": 2}


def test_table_shows_targets_status_and_reasons(ws, run):
    path = ws.recipe(minimal("variants: {fp8: {quant: fp8}}", gpus="[A100, H100]"))
    result = run("plan", path)
    assert result.exit_code == 0
    out = result.stdout
    assert "tiny" in out and "3 targets" in out and "2 ok" in out and "1 impossible" in out
    for name in ("fp8-tp1", "fp8-tp1-sm80", "fp8-tp1-sm90"):
        assert name in out
    assert "impossible" in out and "FP8 needs FP8 tensor cores" in out


def test_several_recipes_as_json_are_a_list(ws, run):
    a = ws.recipe(minimal(), name="a.yaml")
    b = ws.recipe(minimal().replace("name: tiny", "name: other"), name="b.yaml")
    data = json.loads(run("plan", a, b, "--format", "json").stdout)
    assert [d["recipe"] for d in data] == ["tiny", "other"]


def test_invalid_recipe_exits_2_with_one_line_per_error_and_no_output(ws, run):
    good = ws.recipe(minimal(), name="good.yaml")
    bad = ws.recipe(minimal("variants: {fp8: {quant: fp9}}"), name="bad.yaml")
    result = run("plan", good, bad)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.strip() == f"{bad}:7:25: variants.fp8.quant: 'fp9' is not one of fp8, int8_sq, int4_awq, w4a8_awq, int8_wo, int4_wo, nvfp4"


def test_missing_recipe_file_and_bad_gpu_option(ws, run):
    result = run("plan", ws.root / "nope.yaml")
    assert result.exit_code == 2 and result.stderr.strip() == f"{ws.root / 'nope.yaml'}: no such file"
    result = run("plan", ws.recipe(minimal()), "--gpu", "T4")
    assert result.exit_code == 2
    assert re.fullmatch(r"--gpu: 'T4' is not a known GPU; use an SM \((sm\d+, )+sm\d+\) or a product \([^()\n]+\)\n",
                        result.stderr), result.stderr
    path = ws.recipe(minimal())
    result = run("plan", path, "--gpu", "sm80")
    assert (result.exit_code, result.stderr) == (2, f"--gpu sm80: {path} targets sm90\n")


def test_impossible_targets_still_exit_0(ws, run):
    result = run("plan", ws.recipe(minimal("parallelism: [{tp: 3}]")), "--format", "json")
    assert result.exit_code == 0
    assert {t["status"] for t in json.loads(result.stdout)["targets"]} == {"impossible"}


def test_console_script_is_installed():
    result = subprocess.run(["trtbuild", "plan", "--format", "github-matrix", str(RECIPES / "mixtral-8x7b-instruct.yaml")],
                            capture_output=True, text=True, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert [e["target"] for e in json.loads(result.stdout)["include"]] == ["fp8-tp2-sm90", "fp8-tp4-sm90"]
