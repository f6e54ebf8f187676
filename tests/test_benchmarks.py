"""Every script in benchmarks/ runs here at a smoke size (issue #22: benchmarks that cannot rot).

Each script runs as a subprocess, as benchmarks/RESULTS.md's commands run it, on tiny models
(tests/tinymodels.py, synthetic_llama.py's tiny widths) so that each takes seconds. What is
checked is that it still runs and prints its figures: the rows and keys exist, the numbers are
finite and positive, and what the script computes from its inputs is consistent (the windows it
was given, a lower bound that stays one). No wall-clock figure is compared with anything: every
script's timing goals are reported, not judged, at its smoke size.

`SCRIPTS` names the test that runs each script; a new script in benchmarks/ without one fails
test_every_benchmark_script_has_a_smoke_test.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tinymodels import make_model, make_tokenizer, pydoc_text

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"

# benchmarks/<script> -> the tests here that run it (a library module: the tests that run it
# through the scripts that import it)
SCRIPTS = {
    "plan_speed.py": ["test_plan_speed"],
    "validate_speed.py": ["test_validate_speed"],
    "calibration_speed.py": ["test_calibration_speed"],
    "checkpoint_speed.py": ["test_checkpoint_speed"],
    "pipeline_speed.py": ["test_pipeline_speed"],
    "s3_speed.py": ["test_s3_speed"],
    "store_speed.py": ["test_store_speed"],
    "vllm_validation.py": ["test_vllm_validation"],
    "synthetic_llama.py": ["test_checkpoint_speed", "test_pipeline_speed"],
    "quiet_runs.py": ["test_checkpoint_speed"],
}

VALIDATE_RECIPE = """
schema: 1
name: validate-speed-smoke
source: {path: model}
dtype: bfloat16
variants:
  fp8: {quant: fp8, kv_cache: fp8}
calibration: {text: calibration.txt, samples: 4, seq_len: 32, device: cpu}
validate: {text: evaluation.txt, samples: 3, seq_len: 32, device: cpu}
parallelism: [{tp: 1}]
gpus: [sm90]
limits: {max_input_len: 128, max_seq_len: 256}
backends: [hf-checkpoint]
"""


def positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def figures(text: str) -> list[float]:
    """The numbers in a line of a script's table."""
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]\d+)?", text)]


def bench(script: str, *args, tmp: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """benchmarks/<script> ARGS in a fresh interpreter, from the repository root as RESULTS.md runs
    it; its temporary folders in `tmp` (pytest's), so that nothing it leaves outlives the test."""
    (tmp / "tmpdir").mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp / "tmpdir")}
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), *map(str, args)], capture_output=True,
                            text=True, cwd=ROOT, env=env, timeout=timeout)
    assert result.returncode == 0, f"{script} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def load_script(name: str):
    """benchmarks/<name>.py as a module (its report printer, run on the figures its --json printed)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A tiny LLaMA (tests/tinymodels.py) with a tokenizer, and calibration and evaluation texts."""
    folder = tmp_path_factory.mktemp("bench-project")
    make_model(folder / "model", "llama", make_tokenizer(folder / "tokenizer"))
    text = pydoc_text()
    (folder / "calibration.txt").write_text(text[:20000])
    (folder / "evaluation.txt").write_text(text[20000:40000])
    return folder


def test_every_benchmark_script_has_a_smoke_test():
    scripts = sorted(p.name for p in BENCHMARKS.glob("*.py"))
    assert scripts == sorted(SCRIPTS), "each script in benchmarks/ needs a smoke test here (SCRIPTS)"
    missing = [test for tests in SCRIPTS.values() for test in tests if not callable(globals().get(test))]
    assert not missing


def test_plan_speed(tmp_path):
    out = bench("plan_speed.py", "--smoke", tmp=tmp_path).stdout
    targets = re.search(r"^recipe: (\d+) targets \((.+)\)$", out, re.M)
    counts = dict(re.fullmatch(r"(\S+) (\d+)", part).groups() for part in targets.group(2).split(", "))
    assert sum(map(int, counts.values())) == int(targets.group(1)) >= 200
    assert {kind.split("/")[0] for kind in counts} == {"checkpoint", "engine", "hf-checkpoint"}
    for label in ("python -c pass", "python -m trtbuild --help", "python -m trtbuild plan RECIPE --format json"):
        row = re.search(rf"^  {re.escape(label)} +(\S+) s  \((\S+)-(\S+)\)$", out, re.M)
        assert row and all(positive(float(x)) for x in row.groups()), label
    for label in ("--help", "plan"):
        assert re.search(rf"^{re.escape(label)} beyond interpreter start: -?\d+\.\d+ s \(target < 0.5 s\)$", out, re.M)
    for label in ("import", "--help", "plan"):  # the import check is judged at every size
        assert re.search(rf"^  {re.escape(label)} +none$", out, re.M), label
    imports = re.findall(r"^ +(\d+\.\d) ms  +(\S+)$", out, re.M)
    assert len(imports) == 5 and all(positive(float(ms)) for ms, _ in imports)
    assert len(re.findall(r"^load average \(1, 5, 15 min\) at (?:start|end): [\d.]+, [\d.]+, [\d.]+$", out, re.M)) == 2


@pytest.fixture(scope="module")
def validated(project, tmp_path_factory) -> tuple[dict, Path, Path]:
    """validate_speed.py's report on the tiny model, the store it built into (--store) and the recipe."""
    folder = tmp_path_factory.mktemp("validate-speed")
    recipe = project / "validate.yaml"
    recipe.write_text(VALIDATE_RECIPE)
    result = bench("validate_speed.py", "--recipe", recipe, "--variant", "fp8", "--windows", 2, "--store",
                   folder / "store", "--json", tmp=folder)
    return json.loads(result.stdout), folder / "store", recipe


def test_validate_speed(validated, capsys):
    report, _, _ = validated
    rows = {row["target"]: row for row in report["stages"]}
    # (on a host with a GPU and vLLM or TensorRT-LLM, their validations of fp8-hf run and have rows too)
    assert set(rows) >= {"reference", "fp8-hf:validate"}
    for row in rows.values():
        assert row["status"] == "built" and positive(row["seconds"]) and positive(row["peak_rss_mib"])
    reference = report["reference"]
    assert (reference["windows"], reference["seq_len"], reference["vocab_size"]) == (3, 32, 512)
    assert positive(reference["stored_mib"]) and positive(reference["full_logits_mib"])
    error = report["topk_error"]
    assert (error["variant"], error["windows"], error["seq_len"], error["dtype"]) == ("fp8", 2, 32, "bfloat16")
    assert positive(error["exact_mean_kl"])
    assert [row["k"] for row in error["topk"]] == [64, 128, 256]  # those below the vocabulary (512)
    for row in error["topk"]:
        assert positive(row["mean_kl"]) and row["lower_bound"], row
        assert row["mean_kl"] <= error["exact_mean_kl"] + 1e-6
    assert len(report["load_average"]["start"]) == len(report["load_average"]["end"]) == 3
    # the text the script prints without --json, from the same figures
    load_script("validate_speed").print_report(report)
    text = capsys.readouterr().out
    assert re.search(r"^  reference +built +\d+\.\d s   peak RSS +\d+ MiB$", text, re.M)
    assert re.search(r"^  k=256  mean \d\.\d{5}  mean error ", text, re.M)


def test_calibration_speed(project, tmp_path):
    out = tmp_path / "calibration.json"
    text = bench("calibration_speed.py", "--model", project / "model", "--windows", 2, "--seq-len", 16,
                 "--formats", "int4_awq", "--runs", "batched,one", "--group-size", 32, "--json", out, tmp=tmp_path).stdout
    [result] = json.loads(out.read_text())
    assert (result["name"], result["device"], result["windows_meta"]["samples"], result["windows_meta"]["seq_len"]) == (
        "int4_awq", "cpu", 2, 16)
    runs = result["runs"]
    assert set(runs) == {"batched", "one"}  # llm_ptq runs on CUDA only
    for run in runs.values():
        assert positive(run["seconds"]) and positive(run["batch_size"]) and positive(run["batches"])
    # both calibrate the same windows: one window per batch takes as many batches as windows batched
    assert runs["one"]["batch_size"] == 1
    assert runs["one"]["batches"] == runs["batched"]["batches"] * runs["batched"]["batch_size"]
    same = result["same_as_batched"]["one"]
    assert same["differ"] == 0 and positive(same["tensors"])  # on a CPU the batch size changes nothing
    for mode in ("batched", "one"):
        row = re.search(rf"^int4_awq +{mode} +(\S+) s  batch +(\d+) +(\d+) batches$", text, re.M)
        assert row and all(positive(x) for x in figures(row.group(0).split(mode, 1)[1])), mode
    assert re.search(r"^int4_awq +one +vs batched: 0/\d+ tensors differ", text, re.M)


def test_checkpoint_speed(project, tmp_path):
    text = bench("checkpoint_speed.py", "--smoke", "--model", project / "model", "--formats", "int4_awq",
                 "--group-size", 32, "--windows", 2, "--seq-len", 16, "--layers", 2, tmp=tmp_path).stdout
    # part 1: one row per format; load, windows, calib, trtllm, hf, process, cpu, others, peak RSS, its 5 stages
    row = re.search(r"^int4_awq +(.+) W4A16_AWQ$", text, re.M)
    numbers = figures(row.group(1))
    assert len(numbers) == 14 and all(math.isfinite(x) and x >= 0 for x in numbers)
    assert all(positive(x) for x in numbers[5:7] + numbers[8:])  # process and CPU seconds, every peak RSS
    assert re.search(r"^  int4_awq  awq_lite: \d+ batches of 2 in \d+ pass\(es\)", text, re.M)
    # part 2: the tiny synthetic model, one run of each converter, the outputs compared tensor for tensor
    assert re.search(r"^synthetic LLaMA: 2 layers, hidden 64, .* in 4 shards", text, re.M)
    for mode in ("stream", "modelopt"):
        run = re.search(rf"^run 1 {mode} *: +(\S+) s after imports \((\S+) s whole process.*peak RSS +(\d+) MiB", text, re.M)
        assert run and float(run.group(1)) >= 0 and positive(float(run.group(2))) and positive(float(run.group(3)))
    assert re.search(r"^peak RSS stream / modelopt: \d+\.\d+x \(goal <= 0.25x\)", text, re.M)
    assert re.search(r"^speed stream / modelopt: \d+\.\d+x", text, re.M)
    assert re.search(r"^outputs: \d+ tensors compared in \S+ s: all equal; config.json keys that differ: producer$",
                     text, re.M)


def test_pipeline_speed(tmp_path, capsys):
    result = bench("pipeline_speed.py", "--tiny", "--layers", 1, "--variants", "fp8", "--device", "cpu", "--json",
                   tmp=tmp_path)
    report = json.loads(result.stdout)
    assert report["synthetic"]["describe"].startswith("1 layers, hidden 64,") and positive(report["synthetic"]["bytes"])
    cold, warm = report["cold"], report["warm"]
    assert set(cold["variants"]) == {"(source)", "fp8"}
    assert cold["variants"]["fp8"]["model_loads"] == 1 and (warm["stages_built"], warm["model_loads"]) == (0, 0)
    assert report["goals"] == {"met": True, "missed": []}
    assert {row["stage"] for row in cold["stages"]} >= {"calibration", "fp8-quantized", "reference", "fp8-tp1:validate"}
    for row in cold["stages"]:
        assert positive(row["seconds"]), row
        if row["process"] is not None:  # else packaged by the runner itself: no process or peak of its own
            assert positive(row["peak_rss_mib"]) and positive(row["process"]), row
    for build in (cold, warm, report["source"]):
        assert positive(build["seconds"]) and positive(build["peak_rss_mib"])
    assert positive(report["warm_over_cold"]["seconds"]) and positive(report["bench_peak_rss_mib"])
    load_script("pipeline_speed").print_report(report)  # the text it prints without --json
    text = capsys.readouterr().out
    assert re.search(r"^fp8 +\d+ +\d+\.\d +1 +1 +\d+ +\d+$", text, re.M)
    assert "goal (one model load per quantized variant cold, none warm): met" in text


def test_s3_speed(tmp_path, capsys):
    """Against a real S3 server: the script starts the suite's SeaweedFS (tests/s3server.py)."""
    figures_ = json.loads(bench("s3_speed.py", "--smoke", "--json", tmp=tmp_path).stdout)
    assert (figures_["smoke"], figures_["files"], figures_["repeat"], figures_["bytes"]) == (True, 2, 1, 2 << 20)
    seconds = ["push_s", "repush_s", "pull_s", "raw_boto3_down_s", "python_c_pass_s", "choose_s", "choose_local_store_s"]
    rates = ["push_mb_s", "pull_mb_s", "raw_boto3_down_mb_s", "pull_vs_raw_boto3"]
    aws = shutil.which("aws") is not None  # the test extras do not install awscli: its rows only where it is
    if aws:
        seconds += ["awscli_up_s", "awscli_down_s"]
        rates += ["awscli_up_mb_s", "awscli_down_mb_s", "push_vs_awscli", "pull_vs_awscli"]
    else:
        assert figures_["awscli"] is None and figures_["awscli_up_s"] is None
    assert all(positive(figures_[key]) for key in seconds + rates), {k: figures_[k] for k in seconds + rates}
    assert figures_["choose_targets"] == 200 and figures_["chosen"].endswith("-tp1-sm90")
    assert set(figures_["goals"]) == {"re-push < 1 s", "pull <= 1.10x raw boto3 time", "choose < 0.5 s beyond start",
                                      *(["push >= 1.0x awscli", "pull >= 1.0x awscli"] if aws else [])}
    load_script("s3_speed").print_table(figures_)  # the table it prints without --json
    text = capsys.readouterr().out
    for row in ("trtbuild push (cold)", "trtbuild push (unchanged)", "trtbuild pull --dest (verified)",
                "raw boto3 transfer manager (down)", "pull --target auto --dry-run"):
        assert re.search(rf"^{re.escape(row)} +\d+\.\d{{3}} s", text, re.M), row
    # pull against both baselines, side by side on its row
    assert re.search(r"^trtbuild pull --dest \(verified\) .*" + (r"\d\.\d\dx awscli .*" if aws else "")
                     + r"\d\.\d\dx raw boto3's time", text, re.M)
    assert ("aws s3 cp --recursive (up)" in text) == aws


def test_vllm_validation(validated, tmp_path):
    """pack a build, then run it through tests/standin_vllm (which says it is one: its runner's
    version and the cpu device), beside the torch runner's packed report."""
    from conftest import standin_toolchain_env

    _, store, recipe = validated
    build = subprocess.run([sys.executable, "-m", "trtbuild", "build", str(recipe), "--until", "validate", "--json"],
                           capture_output=True, text=True, cwd=recipe.parent, check=True,
                           env={**os.environ, "TRTBUILD_CACHE": str(store), "PYTHONPATH": str(ROOT)})
    (tmp_path / "build.json").write_text(build.stdout)
    packed = tmp_path / "packed"
    bench("vllm_validation.py", "pack", tmp_path / "build.json", packed, "--targets", "fp8-hf", tmp=tmp_path)
    assert json.loads((packed / "targets.json").read_text()) == ["fp8-hf"]
    env = standin_toolchain_env({**os.environ, "TMPDIR": str(tmp_path)}, vllm=True)
    run = subprocess.run([sys.executable, str(BENCHMARKS / "vllm_validation.py"), "run", str(packed), "--json"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {row["runner"].split()[0]: row for row in json.loads(run.stdout)}
    assert set(rows) == {"torch", "vllm"}
    assert (rows["vllm"]["runner"], rows["vllm"]["device"]) == ("vllm 0.33.0+standin", "cpu")
    for row in rows.values():
        assert row["target"] == "fp8-hf" and row["tokens"] == 3 * 31  # the reference's 3 windows of 32 tokens
        assert all(positive(row[key]) for key in ("kld_mean", "kld_p99", "top1_agreement", "ppl")), row
        assert math.isfinite(row["ppl_delta_pct"]) and isinstance(row["gates_passed"], bool)


def test_store_speed(tmp_path):
    text = bench("store_speed.py", "--smoke", tmp=tmp_path).stdout
    assert re.search(r"^checkpoint: 2 files, 0.0039\d* GiB, cores: \d+$", text, re.M)
    for row in ("sha256sum (sequential)", "tree digest, cold", "tree digest, cold, 1 thread", "tree digest, warm (stat)",
                "openssl dgst -sha256", "cp -r + openssl + sync", "ingest into a new store", "build --until source",
                "python -c pass", "no-op trtbuild build", "  without cached byte code"):
        line = re.search(rf"^{re.escape(row)} +(\d+\.\d+) s(.*)$", text, re.M)
        assert line and positive(float(line.group(1))), row
        assert all(math.isfinite(x) for x in figures(line.group(2))), row
    assert re.search(r"^  load average \(1, 5, 15 min\) [\d./]+ -> [\d./]+$", text, re.M)
    assert re.search(r"^  adopt runs: 1 in turn; load average \(1, 5, 15 min\) [\d./]+ -> [\d./]+$", text, re.M)
    for row in ("ingest into a new store", "build --until source"):
        assert re.search(rf"^{re.escape(row)} +\d+\.\d+ s +\d+\.\d+x cp\+openssl\+sync", text, re.M), row
    assert "smoke size: the goals are not judged" in text
