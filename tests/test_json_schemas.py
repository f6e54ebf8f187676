"""Every command's `--json` output against its JSON Schema (docs/schemas/, docs/json-output.md).

One real run on the tiny real model: build (with validation), push to a real S3 server
(SeaweedFS), build --push, a read-through build from a fresh local store, ls, pull, cache ls,
explain, plan and check; each output is validated with format checking. The schemas must be
valid, describe every property, and reject an output with a field too many or one missing.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator, FormatChecker

from conftest import NEMO_DATA, RECIPES, ROOT, minimal
from trtbuild.deploy.select import package_words
from trtbuild.host.toolchain import package_version
from trtbuild.cli import cli
from trtbuild.store.local import LocalStore

SCHEMAS = ROOT / "docs" / "schemas"

# this host's llama-cpp-python, as Host.describe ends (probed like the other packages; not faked here)
LLAMACPP = package_words("llama_cpp_python", package_version("llama_cpp"))
TINY_HF = NEMO_DATA / "hf_tiny_llama_tied_bf16"
RECIPE = ("schema: 1\nname: tiny\nsource: {path: model}\ngpus: [sm90]\nlimits: {max_input_len: 128, max_seq_len: 256}\n"
          "validate: {samples: 2, seq_len: 32}\n")
# A plan-only recipe with impossible targets: fp8 on sm80, tp 3 of 4 KV heads.
PLAN_RECIPE = minimal("variants: {base: {}, fp8: {quant: fp8}}\nparallelism: [{tp: 1}, {tp: 3}]", gpus="[sm80, sm90]")


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def errors(name: str, data) -> list[str]:
    validator = Draft202012Validator(schema(name), format_checker=FormatChecker())
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(data)]


@dataclass
class Output:
    schema: str  # docs/schemas/<schema>.schema.json
    exit_code: int
    data: object
    stderr: str


def invoke(schema_name: str, *args) -> Output:
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    return Output(schema_name, result.exit_code, json.loads(result.stdout) if result.stdout else None, result.stderr)


@dataclass
class Project:
    root: Path
    recipe: Path
    lock: Path
    shared: Path  # a folder store the build was pushed to as well
    outputs: dict[str, Output]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    """Every command's --json output, from one real build of the tiny model published to SeaweedFS."""
    from s3server import SeaweedS3

    root = tmp_path_factory.mktemp("json-schemas")
    model = root / "model"
    shutil.copytree(TINY_HF, model)
    for path in model.iterdir():
        path.chmod(0o644)
    recipe = root / "tiny.yaml"
    recipe.write_text(RECIPE)
    plan_recipe = root / "plan.yaml"
    plan_recipe.write_text(PLAN_RECIPE.replace("{config}", "config.json"))
    (root / "config.json").write_text((model / "config.json").read_text())
    lock, shared = recipe.with_suffix(".lock"), root / "shared"
    out: dict[str, Output] = {}
    with SeaweedS3() as server, pytest.MonkeyPatch.context() as env:
        for name, value in server.env().items():
            env.setenv(name, value)
        server.client().create_bucket(Bucket="artifacts")
        url = "s3://artifacts/ci"
        env.setenv("TRTBUILD_CACHE", str(root / "store"))
        out["plan"] = invoke("plan", "plan", plan_recipe, "--json")
        out["plan-many"] = invoke("plan", "plan", plan_recipe, *sorted(RECIPES.glob("*.yaml")), "--json")
        out["build"] = invoke("build", "build", recipe, "--json")
        out["cache-ls"] = invoke("cache-ls", "cache", "ls", "--json")
        out["explain"] = invoke("explain", "explain", recipe, "base-tp1-sm90", "--json")
        out["push"] = invoke("push", "push", recipe, "--store", url, "--json")
        out["push-folder"] = invoke("push", "push", recipe, "--store", shared, "--json")
        out["build-push"] = invoke("build", "build", recipe, "--store", url, "--push", "--json")
        out["ls"] = invoke("ls", "ls", recipe, "--store", url, "--json")
        out["ls-compatible"] = invoke("ls", "ls", "--store", url, "--compatible", "--json")
        env.setenv("TRTBUILD_CACHE", str(root / "second-store"))  # another host: everything comes from the bucket
        out["build-remote"] = invoke("build", "build", recipe, "--store", url, "--json")
        env.setenv("TRTBUILD_CACHE", str(root / "deploy-store"))
        out["pull"] = invoke("pull", "pull", lock, "--target", "base-tp1", "--store", url, "--dest", root / "serve",
                             "--json")
        out["pull-dry-run"] = invoke("pull", "pull", lock, "--target", "base-tp1", "--store", url, "--dry-run", "--json")
        out["check"] = invoke("check", "check", model, "--json")
        env.setenv("TRTBUILD_CACHE", str(root / "store"))  # last: a --no-validate build rewrites the lock
        out["build-no-validate"] = invoke("build", "build", recipe, "--no-validate", "--json")
        out["push-refused"] = invoke("push", "push", recipe, "--store", root / "other", "--json")
    return Project(root, recipe, lock, shared, out)


@pytest.fixture(scope="module")
def outputs(project) -> dict[str, Output]:
    return project.outputs


def test_every_real_output_validates_against_its_schema(outputs):
    exits = {name: o.exit_code for name, o in outputs.items()}
    assert exits == {**dict.fromkeys(outputs, 0), "push-refused": 1}, {n: o.stderr for n, o in outputs.items()}
    assert {name: errors(o.schema, o.data) for name, o in outputs.items()} == dict.fromkeys(outputs, [])


def test_the_outputs_hold_the_shapes_the_schemas_describe(project, outputs):
    """Not vacuous: the run reached validation metrics, pushes, a read-through build, a pull and a plan with
    impossible targets."""
    built = {t["name"]: t for t in outputs["build"].data["targets"]}
    assert set(built["base-tp1:validate"]["gates"]) == {"kld_mean", "kld_p99", "top1_agreement", "ppl_delta_pct"}
    assert outputs["build-push"].data["push"]["pushed"] == ["base-tp1"]
    assert {t["origin"] for t in outputs["build-remote"].data["targets"] if t["pulled"]} == {"remote"}
    assert isinstance(outputs["plan-many"].data, list) and isinstance(outputs["plan"].data, dict)
    assert {t["status"] for t in outputs["plan"].data["targets"]} == {"ok", "impossible"}
    assert outputs["push"].data["pushed"] == ["base-tp1"]
    assert (outputs["push-refused"].data["pushed"], outputs["push-refused"].stderr) == (
        [], "".join(f"{line}\n" for line in outputs["push-refused"].data["refused"]))
    assert [p["target"] for p in outputs["ls"].data["published"]] == ["base-tp1"]
    # who measured the figures that moved the ref (the device is what torch ran on: cpu here, a GPU elsewhere)
    decided = built["base-tp1"]["decided_by"]
    assert [(d["validation"], d["runner"]) for d in decided] == [("base-tp1:validate", "torch")]
    listed = outputs["ls"].data["published"][0]["validations"]
    assert [(v["id"], v["runner"], v["device"]) for v in listed] == [("base-tp1:validate", "torch", decided[0]["device"])]
    pulled = outputs["pull"].data
    blobs = {e.sha256 for e in LocalStore(project.root / "store").get_manifest(pulled["digest"]).entries}
    assert (pulled["moved"]["blobs"], outputs["pull-dry-run"].data["path"]) == (len(blobs), None)
    assert outputs["check"].data["schema"] == 2
    engine = [n for n in outputs["explain"].data if n["name"] == "base-tp1-sm90"]
    assert engine[0]["command"].startswith("trtllm-build ") and engine[0]["flags"]


# Where each output's mutations go: the output's own object (its first item for a list) and one
# object nested in it. Every field these objects hold in the run is one their schema requires.
MUTATED = {
    "plan": [(), ("targets", 0)],
    "plan-many": [(0,), (0, "model")],
    "build": [(), ("targets", 0)],
    "cache-ls": [(0,), (0, "execution")],
    "explain": [(0,), (0, "fields", 0)],
    "push": [(), ("moved",)],
    "ls": [(), ("published", 0)],
    "pull": [(), ("candidates", 0)],
    "check": [(), ("runtimes", "trtllm")],
}


def at(data, where: tuple):
    for step in where:
        data = data[step]
    return data


@pytest.mark.parametrize("name", MUTATED)
def test_an_output_with_a_field_too_many_or_one_missing_is_invalid(outputs, name):
    output = outputs[name]
    for where in MUTATED[name]:
        extra = copy.deepcopy(output.data)
        at(extra, where)["unexpected"] = 1
        assert errors(output.schema, extra) != [], f"{name} {where} with a field too many passed"
        for field in at(output.data, where):
            missing = copy.deepcopy(output.data)
            del at(missing, where)[field]
            assert errors(output.schema, missing) != [], f"{name} {where} without {field} passed"


def test_a_wrong_status_or_digest_is_invalid(outputs):
    build = copy.deepcopy(outputs["build"].data)
    build["targets"][0]["status"] = "done"
    assert errors("build", build) == ["targets/0/status: 'done' is not one of ['built', 'cached', 'failed', "
                                      "'impossible', 'skipped']"]
    build = copy.deepcopy(outputs["build"].data)
    build["targets"][0]["digest"] = "ABC"
    assert errors("build", build) == ["targets/0/digest: 'ABC' does not match '^[0-9a-f]{64}$'"]
    records = copy.deepcopy(outputs["cache-ls"].data)
    records[0]["created"] = "yesterday"
    assert errors("cache-ls", records) == ["0/created: 'yesterday' is not a 'date-time'"]


# ---- the schemas themselves -------------------------------------------------------------------------

SCHEMA_FILES = sorted(SCHEMAS.glob("*.schema.json"))


def properties_without_description(node, where="") -> list[str]:
    out = []
    if isinstance(node, dict):
        for name, sub in (node.get("properties") or {}).items():
            if "description" not in sub:
                out.append(f"{where}/properties/{name}")
        for key, sub in node.items():
            out += properties_without_description(sub, f"{where}/{key}")
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            out += properties_without_description(sub, f"{where}/{i}")
    return out


VERSIONS = {"check": 2, "pull": 3, "ls": 3}  # the outputs past version 1 (docs/json-output.md says why)


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=lambda p: p.name)
def test_each_schema_is_a_draft_2020_12_schema_with_an_id_and_a_description_on_every_property(path):
    data = json.loads(path.read_text())
    Draft202012Validator.check_schema(data)
    name = path.name.removesuffix(".schema.json")
    version = VERSIONS.get(name, 1)  # docs/json-output.md, "Versions"
    assert (data["$schema"], data["$id"]) == ("https://json-schema.org/draft/2020-12/schema",
                                              f"urn:trtbuild:json-output:{name}:{version}")
    assert properties_without_description(data) == []


def test_every_schema_file_is_validated_by_this_module_and_linked_from_the_docs():
    source = Path(__file__).read_text()
    used = set(re.findall(r'invoke\("([a-z-]+)"', source)) | set(re.findall(r'errors\("([a-z-]+)"', source))
    assert {p.name.removesuffix(".schema.json") for p in SCHEMA_FILES} == used
    docs = (ROOT / "docs" / "json-output.md").read_text()
    assert [p.name for p in SCHEMA_FILES if f"](schemas/{p.name})" not in docs] == []
    assert "(docs/json-output.md)" in (ROOT / "README.md").read_text()


def test_the_enums_are_the_codes_own():
    from trtbuild.builder.graph import STAGE_ORDER
    from trtbuild.store.records import ActionRecord
    from trtbuild.builder.results import Status

    node = schema("build")["$defs"]["node"]["properties"]
    assert node["status"]["enum"] == [s.value for s in Status]
    assert node["stage"]["enum"] == list(STAGE_ORDER)
    record = schema("cache-ls")["$defs"]["record"]["properties"]
    assert set(record) == {f.alias or name for name, f in ActionRecord.model_fields.items()} - {"fields"} | {"standin"}
    runtimes = next(p for p in cli.commands["pull"].params if p.name == "runtime").type.choices
    assert schema("pull")["$defs"]["candidate"]["properties"]["runtime"]["enum"] == [*runtimes[1:], None]


# ---- outputs that depend on the host (a recorded GPU, recorded package versions) ---------------

def test_check_json_of_an_engine_that_does_not_fit_and_one_that_does(tmp_path, run, recorded_gpu, installed_packages):
    from test_engine_check import TRT, TRTLLM, make_engine

    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    engine = make_engine(tmp_path / "engine")
    recorded_gpu("A100")
    misfit = run("check", engine, "--json")
    assert (misfit.exit_code, misfit.stderr) == (1, "")
    assert errors("check", json.loads(misfit.stdout)) == []
    recorded_gpu("H100")
    fits = run("check", engine, "--json")
    assert (fits.exit_code, fits.stderr, json.loads(fits.stdout)["fits"]) == (0, "", True)
    assert errors("check", json.loads(fits.stdout)) == []


def test_check_json_of_a_checkpoint_every_runtime_rejects(tmp_path, run):
    folder = tmp_path / "model"
    shutil.copytree(TINY_HF, folder)
    (folder / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NOT_AN_ALGO"}}))
    result = run("check", folder, "--json")
    assert (result.exit_code, result.stderr) == (1, "")
    out = json.loads(result.stdout)
    assert [r["accepted"] for r in out["runtimes"].values()] == [False, False, False]
    assert errors("check", out) == []


def test_pull_json_when_nothing_fits_lists_every_candidate_and_exits_1(project, run, recorded_gpu, installed_packages,
                                                                       tmp_path, monkeypatch):
    from test_engine_check import TRT, TRTLLM

    recorded_gpu("L40S")
    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "deploy-store"))
    # the lock is the fixture's last build's, a --no-validate one: base-tp1 is held back (trtbuild.lock.publication),
    # which is its reason (a published checkpoint's reason is test_transfer's nothing-fits tests')
    result = run("pull", project.lock, "--store", project.shared, "--json")
    assert result.exit_code == 1
    assert result.stderr == (
        f"no target of {project.lock} fits this host (1x NVIDIA L40S (sm89, 45.0 GiB), tensorrt_llm {TRTLLM}, "
        f"tensorrt {TRT}, no vllm, no sglang, {LLAMACPP}):\n"
        "  base-tp1: held back: built with --no-validate\n"
        f"to make one: add sm89 to the recipe's `gpus:`, then run `trtbuild build {project.recipe} --gpu auto` on "
        "this host\n")
    out = json.loads(result.stdout)
    assert errors("pull", out) == []
    assert {k: out[k] for k in ("target", "digest", "path", "runtime", "moved")} == dict.fromkeys(
        ("target", "digest", "path", "runtime", "moved"))
    assert out["candidates"] == [{"target": "base-tp1", "stage": "checkpoint", "fits": False, "runtime": None,
                                  "world_size": None, "variant": "base",
                                  "reasons": ["held back: built with --no-validate"]}]


def test_bench_json_validates_against_its_schema(demo_bench):
    """`trtbuild bench --json` of the real run (tests/test_bench.py's) against bench.schema.json."""
    output = demo_bench[2]
    assert errors("bench", output) == []
    extra = copy.deepcopy(output)
    extra["records"][0]["figures"]["extra"] = 1
    missing = copy.deepcopy(output)
    del missing["records"][1]["raw"]
    assert errors("bench", extra) != [] and errors("bench", missing) != []
