"""The CI examples users copy (examples/github, examples/gitlab): real YAML, every trtbuild command
in them one that trtbuild's own CLI parses (with the options the workflow promises), and the
matrix keys the engine jobs read the ones `trtbuild plan --format github-matrix` prints."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys

import click
import pytest
import yaml

from conftest import ROOT
from trtbuild.cli import cli

GITHUB = ROOT / "examples" / "github" / "engine-build.yml"
GITLAB = ROOT / "examples" / "gitlab" / "engine-build.gitlab-ci.yml"
COMMAND_START = re.compile(r"(?:^|\$\(|[;&|{]\s*)\s*(?=trtbuild\s)")  # trtbuild where a shell runs a command
EXPRESSION = re.compile(r"\$\{\{\s*([\w.-]+)\s*\}\}")  # a GitHub expression
SHELL_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def github_matrix(recipe: str) -> list[dict]:
    """What the workflow's plan job prints, by running the real command here."""
    result = subprocess.run([sys.executable, "-m", "trtbuild", "plan", recipe, "--format", "github-matrix"],
                            capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    include = json.loads(result.stdout)["include"]
    assert include, "the example's recipe plans no engine"
    return include


def commands(script: str) -> list[str]:
    """The trtbuild commands of a shell script: from `trtbuild` to the first unquoted redirection,
    pipe, `;`, `&` or the `)` that closes its `$(`."""
    found = []
    for line in script.splitlines():
        for start in COMMAND_START.finditer(line):
            quote, end = None, start.end()
            while end < len(line):
                char = line[end]
                if quote:
                    quote = None if char == quote else quote
                elif char in "'\"":
                    quote = char
                elif char in "><|;&)":
                    break
                end += 1
            found.append(line[start.end():end])
    return found


def substitute(command: str, variables: dict[str, str], expressions: dict[str, str]) -> list[str]:
    """The command's words once the CI system and the shell have filled in its variables."""
    def expression(match):
        assert match.group(1) in expressions, f"{command}: ${{{{ {match.group(1)} }}}} has no value here"
        return str(expressions[match.group(1)])

    def variable(match):
        name = match.group(1) or match.group(2)
        assert name in variables, f"{command}: ${name} is not set by the workflow"
        return str(variables[name])

    return shlex.split(SHELL_VARIABLE.sub(variable, EXPRESSION.sub(expression, command)), comments=True)


def parse(words: list[str]) -> tuple[str, dict]:
    """trtbuild's own CLI parses the words (types, choices, required arguments; nothing runs):
    (`trtbuild SUBCOMMAND`, its parameters)."""
    assert words[0] == "trtbuild"
    args, command, names = words[1:], cli, []
    while isinstance(command, click.Group):
        names.append(args.pop(0))
        command = command.get_command(click.Context(cli), names[-1])
        assert command is not None, f"{' '.join(words)}: trtbuild has no command {' '.join(names)}"
    try:
        ctx = command.make_context(" ".join(["trtbuild", *names]), args)
    except click.UsageError as exc:
        pytest.fail(f"{' '.join(words)}: {exc.format_message()}")
    return " ".join(names), ctx.params


def github_runs(workflow: dict, job: str) -> list[tuple[str, dict[str, str]]]:
    """(script, environment) of each `run:` step of a job."""
    spec = workflow["jobs"][job]
    return [(step["run"], {**workflow.get("env", {}), **spec.get("env", {}), **step.get("env", {})})
            for step in spec["steps"] if "run" in step]


def test_the_github_workflow_runs_only_commands_trtbuild_parses():
    workflow = load(GITHUB)
    assert set(workflow[True]) == {"push", "workflow_dispatch"}  # `on:` (YAML 1.1 reads the key as true)
    env = {k: str(v) for k, v in workflow["env"].items()}
    matrix = github_matrix(env["RECIPE"])
    parsed: dict[str, list[tuple[str, dict]]] = {}
    for job in workflow["jobs"]:
        for entry in (matrix if job == "engines" else [{}]):
            expressions = {f"matrix.{k}": v for k, v in entry.items()} | {f"env.{k}": v for k, v in env.items()}
            for script, variables in github_runs(workflow, job):
                for command in commands(script):
                    parsed.setdefault(job, []).append(parse(substitute(command, variables, expressions)))
    assert {job: sorted({name for name, _ in found}) for job, found in parsed.items()} == {
        "plan": ["plan"], "checkpoints": ["build"], "engines": ["build"], "lock": ["lock merge"], "deploy": ["pull"]}
    assert [params["fmt"] or "table" for _, params in parsed["plan"]] == ["table", "github-matrix"]  # no --format: table
    checkpoints = parsed["checkpoints"][0][1]
    assert (checkpoints["until"], checkpoints["locked"], checkpoints["push_after"], checkpoints["as_json"]) == (
        "validate", True, True, True)
    assert len(parsed["engines"]) == len(matrix)  # one parse per matrix entry, with that entry's values
    for (_, params), entry in zip(parsed["engines"], matrix):
        assert (params["recipe"].as_posix(), params["targets"], params["gpu"], params["store_url"]) == (
            entry["recipe"], (entry["target"],), "auto", env["STORE"])
        assert (params["locked"], params["push_after"], params["as_json"]) == (True, True, True)
        assert params["lock_out"].as_posix() == f"locks/{entry['target']}.lock"
    (_, merge), = parsed["lock"]
    assert [p.as_posix() for p in merge["locks"]] == ["jobs/locks/*.lock"] and merge["out"].as_posix() == env["LOCK"]
    (_, pull), = parsed["deploy"]
    assert (pull["lock_or_recipe"].as_posix(), pull["target"], pull["store_url"]) == (env["LOCK"], "auto", env["STORE"])


def test_the_github_engine_jobs_read_the_keys_plan_prints():
    workflow = load(GITHUB)
    plan = workflow["jobs"]["plan"]
    step = next(s for s in plan["steps"] if s.get("id") == "plan")
    assert step["run"] == 'echo "matrix=$(trtbuild plan "$RECIPE" --format github-matrix)" >> "$GITHUB_OUTPUT"'
    assert plan["outputs"] == {"matrix": "${{ steps.plan.outputs.matrix }}"}
    engines = workflow["jobs"]["engines"]
    assert engines["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    read = {name.split(".", 1)[1] for name in EXPRESSION.findall(yaml.safe_dump(engines)) if name.startswith("matrix.")}
    assert read == {"recipe", "target", "gpu", "num_gpus"}
    for entry in github_matrix(workflow["env"]["RECIPE"]):
        assert read <= set(entry), f"{entry}: lacks {read - set(entry)}"
    assert engines["runs-on"] == ["self-hosted", "${{ matrix.gpu }}", "gpus-${{ matrix.num_gpus }}"]


def test_the_gpu_jobs_run_in_the_dockerfiles_tensorrt_llm_image():
    base = re.search(r"^ARG TRTLLM_VERSION=(\S+)\nFROM (\S+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    image = base.group(2).replace("${TRTLLM_VERSION}", base.group(1))
    workflow = load(GITHUB)
    assert {job: spec["container"]["image"] for job, spec in workflow["jobs"].items() if "container" in spec} == {
        "checkpoints": image, "engines": image, "deploy": image}
    assert load(GITLAB)[".trtllm-image"]["image"] == image


def gitlab_jobs(pipeline: dict) -> dict[str, dict]:
    """Each job with what it `extends` folded in (one level, as the example uses)."""
    jobs = {}
    for name, spec in pipeline.items():
        if isinstance(spec, dict) and "script" in spec:
            base = pipeline[spec["extends"]] if "extends" in spec else {}
            jobs[name] = {**base, **spec, "variables": {**base.get("variables", {}), **spec.get("variables", {})}}
    return jobs


def test_the_gitlab_pipeline_runs_only_commands_trtbuild_parses():
    pipeline = load(GITLAB)
    variables = {k: str(v) for k, v in pipeline["variables"].items()}
    parsed: dict[str, list[tuple[str, dict]]] = {}
    for name, job in gitlab_jobs(pipeline).items():
        matrix = job.get("parallel", {}).get("matrix", [{}])
        combos = [dict(zip(row, values)) for row in matrix for values in
                  itertools.product(*[v if isinstance(v, list) else [v] for v in row.values()])]
        for combo in combos:
            env = {**variables, **{k: str(v) for k, v in job["variables"].items()}, **combo}
            for line in job.get("before_script", []) + job["script"]:
                for command in commands(line):
                    parsed.setdefault(name, []).append(parse(substitute(command, env, {})))
    assert {job: sorted({n for n, _ in found}) for job, found in parsed.items()} == {
        "plan": ["plan"], "checkpoints": ["build"], "engines": ["build"], "lock": ["lock merge"], "deploy": ["pull"]}
    sms = pipeline["engines"]["parallel"]["matrix"][0]["GPU"]
    assert [(params["gpu"], params["lock_out"].as_posix(), params["locked"], params["push_after"], params["as_json"])
            for _, params in parsed["engines"]] == [("auto", f"locks/{sm}.lock", True, True, True) for sm in sms]
    (_, merge), = parsed["lock"]
    assert [p.as_posix() for p in merge["locks"]] == ["locks/*.lock"] and merge["out"].as_posix() == variables["LOCK"]
    (_, pull), = parsed["deploy"]
    assert (pull["lock_or_recipe"].as_posix(), pull["target"]) == (variables["LOCK"], "auto")


def test_the_gitlab_matrix_is_the_sms_plan_prints():
    pipeline = load(GITLAB)
    engines = pipeline["engines"]
    assert engines["tags"] == ["$GPU"]
    planned = sorted({entry["gpu"] for entry in github_matrix(pipeline["variables"]["RECIPE"])})
    assert engines["parallel"]["matrix"] == [{"GPU": planned}]
    assert pipeline["variables"]["ENGINE_SMS"] == " ".join(planned)  # what the plan job checks the plan against
