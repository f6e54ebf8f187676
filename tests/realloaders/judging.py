"""What the tests that put checkpoints before vLLM 0.33.0's own code share (tests/test_vllm_real_loader.py,
tests/test_smollm2.py): finding the real-loader environment (make_env.py), running vllm_judge.py on
a list of jobs in one process, and comparing its verdicts with `trtbuild check`'s vLLM verdict and
with a package's serving/check.json and serving/vllm_args.json."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import make_env

JUDGE = Path(__file__).resolve().parent / "vllm_judge.py"


def vllm_python() -> Path:
    """The environment's interpreter; where it could not be built, skip saying why (fail under CI=true)."""
    python = make_env.env_python()
    if make_env.up_to_date():
        return python
    why = (make_env.FAILED.read_text().strip() if make_env.FAILED.exists()
           else f"{make_env.ENV} does not exist: run python3 tests/realloaders/make_env.py (the README's test command does)")
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must judge with the real vLLM loader: {why}")
    pytest.skip(why)


def packaged_argv(folder: Path) -> list[str] | None:
    """A package's serving/vllm_args.json as the argv after `vllm serve FOLDER`; None where it offers none."""
    args = folder / "serving" / "vllm_args.json"
    if not args.exists():
        return None
    return [str(a) for flag, value in json.loads(args.read_text()).items() for a in (flag, value)]


def package_jobs(packaged: dict[str, Path]) -> list[dict]:
    """Jobs for each package: the bare folder, and with its vllm_args.json where it has one."""
    jobs = []
    for target, folder in packaged.items():
        jobs.append({"name": f"packaged {target}", "folder": str(folder), "argv": []})
        argv = packaged_argv(folder)
        if argv is not None:
            jobs.append({"name": f"packaged {target} with its vllm_args.json", "folder": str(folder), "argv": argv})
    return jobs


def judge(python: Path, jobs: list[dict], workdir: Path) -> dict:
    """name -> vLLM's verdict (the judge's JSON), all jobs judged in one process."""
    (workdir / "jobs.json").write_text(json.dumps(jobs))
    run = subprocess.run([str(python), str(JUDGE), str(workdir / "jobs.json"), str(workdir / "verdicts.json")],
                         capture_output=True, text=True, timeout=900, cwd=workdir,
                         env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CONFIGURE_LOGGING": "0"})
    assert run.returncode == 0, run.stderr[-4000:]
    return {v["name"]: v for v in json.loads((workdir / "verdicts.json").read_text())}


def trtbuild_vllm(folder: Path):
    from trtbuild.serving.check import check_checkpoint

    return check_checkpoint(folder, runtimes=["vllm"]).runtimes["vllm"]


def differences(pairs) -> list[str]:
    """(name, folder, verdict) triples where `trtbuild check` and vLLM 0.33.0 disagree, one line each."""
    out = []
    for name, folder, verdict in pairs:
        ours = trtbuild_vllm(folder)
        if ours.accepted != verdict["accepted"]:
            out.append(f"{name}: vLLM 0.33.0 {'accepts' if verdict['accepted'] else 'refuses'} it"
                       f"{'' if verdict['accepted'] else ' at ' + verdict['stage'] + ': ' + verdict['message'][:300]}"
                       f"; trtbuild check says {'accepted' if ours.accepted else 'rejected: ' + '; '.join(ours.reasons)[:300]}")
    return out


def package_differences(packaged: dict[str, Path], verdicts: dict) -> list[str]:
    """Each package's bare folder judged by vLLM against `trtbuild check` and its serving/check.json."""
    diffs = differences([(f"packaged {t}", p, verdicts[f"packaged {t}"]) for t, p in packaged.items()])
    for target, folder in packaged.items():
        recorded = json.loads((folder / "serving" / "check.json").read_text())["runtimes"].get("vllm")
        judged = verdicts[f"packaged {target}"]["accepted"]
        if recorded is not None and recorded["accepted"] != judged:
            diffs.append(f"packaged {target}: serving/check.json says vLLM accepted={recorded['accepted']}, "
                         f"vLLM 0.33.0 accepted={judged}")
    return diffs


def refused_args(packaged: dict[str, Path], verdicts: dict) -> list[str]:
    """Packages whose serving/vllm_args.json vLLM refuses, one line each."""
    refused = []
    for target, folder in packaged.items():
        name = f"packaged {target} with its vllm_args.json"
        if name in verdicts and not verdicts[name]["accepted"]:
            v = verdicts[name]
            refused.append(f"{target}: serving/vllm_args.json {packaged_argv(folder)} is refused by vLLM 0.33.0 at "
                           f"{v['stage']}: {v['message'][:300]}")
    return refused
