"""The CLI as a user runs it: formats, exit codes, the embedded default and the shipped recipes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from conftest import RECIPES, ROOT, minimal
from trtbuild import __version__
from trtbuild.cli import cli
from trtbuild.recipe.schema import load_recipe
from trtbuild.builder.graph import STAGE_ORDER

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
from trtbuild.recipe.schema import load_recipe
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
    assert {t["name"] for t in data["targets"]} >= {"base-tp1", "fp8-tp1-sm90", "int4-wo-hf"}


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


@pytest.mark.parametrize("args, expected", [
    (("--gpu", "sm99"), "--gpu: 'sm99' is not a supported architecture; use one of sm80, sm86, sm89, sm90, sm100, sm120"),
    (("--until", "foo"), f"--until foo: not a stage ({', '.join(STAGE_ORDER)})"),
    (("--target", "nope"), "--target nope: matches none of base-tp1, base-tp1-sm90"),
    (("--locked",), "--locked: {lock}: no lock file; run `trtbuild build` without --locked to write it"),
], ids=["gpu", "until", "target", "locked"])
def test_build_errors_are_exactly_one_line_on_stderr(ws, run, args, expected):
    # The progress display used to print an empty line on stderr when it stopped, before the error.
    path = ws.recipe(minimal())
    result = run("build", path, "--store", ws.root / "store", *args)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == expected.format(lock=path.with_suffix(".lock")) + "\n"


def test_plan_gpu_product_is_the_card_the_estimate_assumes_and_says_so(ws, run):
    path = ws.recipe(minimal(gpus="[L40S]"))
    data = json.loads(run("plan", path, "--gpu", "L4", "--format", "json").stdout)
    engine = data["targets"][1]
    assert engine["name"] == "base-tp1-sm89"
    assert {k: engine["estimate"][k] for k in ("gpu_product", "gpu_memory_bytes", "gpu_chosen_by")} == {
        "gpu_product": "L4", "gpu_memory_bytes": 23034 * 1024**2, "gpu_chosen_by": "option"}
    table = run("plan", path, "--gpu", "L4").stdout
    assert "estimated on" in table
    [row] = [line for line in table.splitlines() if "base-tp1-sm89" in line]
    assert "L4 (22.5 GiB)" in row
    [row] = [line for line in run("plan", ws.recipe(minimal(gpus="[sm89]"), name="sm.yaml")).stdout.splitlines()
             if "base-tp1-sm89" in line]
    assert "L40S (45.0 GiB, SM default)" in row


def test_github_matrix_names_a_recipe_relative_to_the_current_folder(ws, run, monkeypatch):
    # A CI job checks the repository out somewhere else: an absolute path from the planning host is useless there.
    (ws.root / "recipes").mkdir()
    ws.config()
    path = ws.recipe(minimal().replace("{config}", "../config.json"), name="recipes/r.yaml")
    monkeypatch.chdir(ws.root)
    for given in (path, "recipes/r.yaml", "./recipes/../recipes/r.yaml"):
        include = json.loads(run("plan", given, "--format", "github-matrix").stdout)["include"]
        assert [e["recipe"] for e in include] == ["recipes/r.yaml"]


def test_github_matrix_of_the_embedded_recipe_has_an_empty_recipe_that_build_reads_as_the_default(run):
    result = run("plan", "--format", "github-matrix")
    assert result.exit_code == 0
    include = json.loads(result.stdout)["include"]
    assert [e["target"] for e in include] == ["base-tp1-sm89", "int4-wo-tp1-sm89", "fp8-tp1-sm89", "base-tp1-sm90",
                                              "int4-wo-tp1-sm90", "fp8-tp1-sm90"]
    assert {e["recipe"] for e in include} == {""}  # `trtbuild build ${{ matrix.recipe }} ...` builds the embedded one


def test_build_help_lists_every_stage_until_takes_in_order():
    from trtbuild.cli.build import until_help

    result = CliRunner().invoke(cli, ["build", "--help"])
    assert result.exit_code == 0
    help_text = re.sub(r"(?<=[a-z])- (?=[a-z])", "-", " ".join(result.stdout.split()))  # click wraps after a hyphen
    assert until_help(STAGE_ORDER) in help_text
    steps = {}
    for stage, rank in STAGE_ORDER.items():
        steps.setdefault(rank, []).append(stage)
    assert until_help(STAGE_ORDER).endswith(", ".join("/".join(steps[r]) for r in sorted(steps)) + ".")
    assert all(stage in help_text for stage in STAGE_ORDER)


PLAN_ONLY_ABSENT = ("torch", "transformers", "modelopt", "gguf", "accelerate", "tensorrt_llm")


@pytest.fixture
def plan_only_install(monkeypatch):
    """This process as `pip install trtbuild` alone leaves it: none of the quantize or trtllm extras."""
    from trtbuild.host import toolchain

    real = toolchain.package_version
    monkeypatch.setattr(toolchain, "package_version", lambda name: None if name in PLAN_ONLY_ABSENT else real(name))


def test_a_plan_only_install_names_the_command_that_installs_what_a_stage_needs(ws, run, plan_only_install):
    (ws.root / "model").mkdir()
    ws.config(name="model/config.json")
    path = ws.recipe(minimal("variants: {fp8: {quant: fp8}}\nbackends: [hf-checkpoint]").replace("  config: {config}\n", ""))
    result = run("build", path, "--store", ws.root / "store", "--json")
    targets = {t["name"]: t for t in json.loads(result.stdout)["targets"]}
    reasons = {name: t["reason"] for name, t in targets.items()}
    # not skipped like a host without a GPU: the install must change, so the build fails (exit 1)
    assert (result.exit_code, targets["reference"]["status"]) == (1, "failed")
    expected = ("needs torch, transformers: install them with `python3 -m pip install torch==2.13.0 'trtbuild[quantize]'` "
                "(torch first, so that pip takes its CPU build), or use the container image")
    assert reasons["reference"] == expected
    # The progress line on stderr shows it as written (rich used to read "[quantize]" as markup and drop it).
    [line] = [line for line in result.stderr.splitlines() if " reference " in line]
    assert line.endswith(f"  {expected}")


def test_the_install_hint_names_the_extra_that_holds_each_package_and_readmes_torch_pin():
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    from trtbuild.host import toolchain
    from trtbuild.builder.stages.install import CPU_TORCH, extra_for
    from trtbuild.builder.stages.registry import STAGES

    base, extras = set(), {}
    for line in requires("trtbuild"):
        req = Requirement(line)
        if req.marker is None:
            base.add(req.name.lower())  # always installed: never missing
        for extra in ("quantize", "trtllm", "vllm", "llamacpp"):
            if req.marker is not None and req.marker.evaluate({"extra": extra}):
                extras.setdefault(extra, set()).add(req.name.lower())
    needed = {p for stage in STAGES.values() if stage for p in stage.needs}
    for package in needed:
        distributions = set(toolchain.DISTRIBUTIONS.get(package, (package,)))
        assert distributions & (base | extras[extra_for(package)]), package
    assert f"pip install {CPU_TORCH} " in (ROOT / "README.md").read_text()


def _validation(node_id, kld_mean, top1, ppl_delta_pct, passed=True):
    from summarykit import validation_summary
    from trtbuild.builder.runner import NodeResult
    from trtbuild.store.summaries import parse_summary

    gates = {"kld_mean": {"value": kld_mean, "limit": 0.15, "passed": passed},
             "top1_agreement": {"value": top1, "limit": 0.8, "passed": True}}
    summary = validation_summary(kld_mean, top1, ppl_delta_pct, kld_p99=10 * kld_mean, gates=gates)
    return NodeResult(node_id, "validate", "validate", "built" if passed else "failed", key="k" * 64, digest="d" * 64,
                      seconds=2.5, reason=None if passed else "gate kld_mean: 0.312 > 0.15",
                      summary=parse_summary("validate", summary))


def test_build_table_shows_each_validations_kl_top1_and_perplexity_change():
    from rich.console import Console

    from trtbuild.builder.pipeline import BuildOutcome
    from trtbuild.cli.render import print_build
    from trtbuild.builder.runner import NodeResult

    outcome = BuildOutcome("demo", [
        NodeResult("fp8-tp1", "checkpoint", "checkpoint", "built", key="a" * 64, digest="b" * 64, seconds=1.0),
        _validation("fp8-tp1:validate", 0.04312, 0.8912, 3.8049),
        _validation("int4-tp1:validate", 0.312, 0.902, 12.0, passed=False),
        NodeResult("fp8-tp1-sm90", "engine", "engine", "skipped", reason="needs torch: install it with `pip install 'trtbuild[quantize]'`"),
    ], lock_path=None)
    console = Console(record=True, width=240)
    print_build(outcome, console)
    text = console.export_text()
    header = next(line for line in text.splitlines() if "artifact" in line)
    assert [cell.strip() for cell in header.strip("┃").split("┃")] == [
        "artifact", "stage", "status", "seconds", "digest", "KL mean", "top-1", "ppl change", "why / notes"]

    def cells(name):
        row = next(line for line in text.splitlines() if f" {name} " in line)
        return [cell.strip() for cell in row.strip("│").split("│")]

    assert cells("fp8-tp1:validate")[5:8] == ["0.0431", "89.1%", "+3.80%"]
    assert cells("int4-tp1:validate")[5:9] == ["0.312", "90.2%", "+12.00%", "gate kld_mean: 0.312 > 0.15"]
    assert cells("fp8-tp1")[5:8] == ["", "", ""]
    assert cells("fp8-tp1-sm90")[8] == "needs torch: install it with `pip install 'trtbuild[quantize]'`"  # not markup


def test_plan_json_is_format_json_and_a_conflicting_format_is_one_line(ws, run):
    path = ws.recipe(minimal())
    as_json = run("plan", path, "--json")
    assert (as_json.exit_code, as_json.stderr) == (0, "")
    assert as_json.stdout == run("plan", path, "--format", "json").stdout
    both = run("plan", path, "--json", "--format", "table")
    assert (both.exit_code, both.stdout, both.stderr) == (2, "", "--json and --format table: pick one\n")


def test_the_console_script_ends_without_teardown_yet_runs_atexit_and_flushes_everything(tmp_path):
    """main() skips the interpreter's module teardown (0.15-0.2 s of a re-push): the whole output
    still arrives, the exit status is the command's, and atexit handlers still run."""
    marker, torn_down = tmp_path / "atexit-ran", tmp_path / "torn-down"
    script = f"""
import atexit, sys
atexit.register(lambda: open({str(marker)!r}, "w").write("ran"))
class FreedAtTeardown:
    def __del__(self):
        open({str(torn_down)!r}, "w").write("module teardown ran")
kept = FreedAtTeardown()
sys.argv = ["trtbuild", *sys.argv[1:]]
from trtbuild.cli.entry import main
main()
print("after main")
"""
    planned = subprocess.run([sys.executable, "-c", script, "plan", "--format", "json", *map(str, SHIPPED)],
                             capture_output=True, text=True, check=False)
    assert (planned.returncode, planned.stderr, marker.read_text(), torn_down.exists()) == (0, "", "ran", False)
    assert [p["recipe"] for p in json.loads(planned.stdout)] == [load_recipe(p).recipe.name for p in SHIPPED]
    marker.unlink()
    bad = subprocess.run([sys.executable, "-c", script, "plan", str(tmp_path / "missing.yaml")],
                         capture_output=True, text=True, check=False)
    assert (bad.returncode, bad.stdout, bad.stderr, marker.read_text()) == (
        2, "", f"{tmp_path / 'missing.yaml'}: no such file\n", "ran")
