"""The deploy side of gguf targets, on the demo's real GGUF build (the demo_gguf fixture): push and
pull (--target, auto, --runtime llamacpp), `check` loading the file in this host's llama.cpp (and
refusing a truncated or damaged one), `ls` and the report; and the choice's rules for gguf targets
on hand-made locks (a GPU host keeps its engines and hf-checkpoints first)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_json_schemas import errors
from trtbuild.builder.stages.gguf import read_serving
from trtbuild.deploy.select import LLAMACPP_INSTALL, Host, build_hint, choose
from trtbuild.host import llamacpp
from trtbuild.lock.lockfile import LockedPlatform, LockedRecipe, LockedTarget, LockFile

LOCK = "smollm2-135m-demo.lock"
COMMAND = ["python3", "-m", "llama_cpp.server", "--model", "model.gguf", "--n_ctx", "2048", "--n_batch", "2048"]


def trtbuild(env: dict, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtbuild", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.fixture(scope="module")
def deployed(demo_gguf, tmp_path_factory):
    """The demo's gguf targets pushed to a folder store and q8_0-gguf pulled from it by a deploy
    host (a fresh local store): (root, shared store, build host's env, deploy host's env, pull --json)."""
    store, env, _ = demo_gguf
    root = tmp_path_factory.mktemp("gguf-deploy")
    shared = root / "shared"
    pushed = trtbuild(env, "push", "--store", shared)
    assert (pushed.returncode, pushed.stdout.splitlines()[:2]) == (0, ["pushed q4_k_m-gguf", "pushed q8_0-gguf"])
    deploy = {**env, "TRTBUILD_CACHE": str(root / "deploy-store")}
    pulled = trtbuild(deploy, "pull", store / LOCK, "--store", shared, "--target", "q8_0-gguf", "--dest",
                      root / "served", "--json")
    assert pulled.returncode == 0, pulled.stderr
    return root, shared, env, deploy, json.loads(pulled.stdout)


def test_pull_brings_down_the_gguf_folder_and_says_its_packaged_server_command(deployed, demo_gguf):
    root, _, _, _, out = deployed
    served = root / "served"
    assert errors("pull", out) == []
    assert (out["target"], out["path"], out["runtime"], out["serving_command"]) == (
        "q8_0-gguf", str(served), "llamacpp", COMMAND)
    assert sorted(p.relative_to(served).as_posix() for p in served.rglob("*") if p.is_file()) == [
        "model.gguf", "report.json", "serving/llamacpp_server.json"]
    assert read_serving(served).command == COMMAND
    lock = (demo_gguf[0] / LOCK).read_text()
    assert f"digest: {out['digest']}" in lock  # the artifact the build's lock names


def test_plain_pull_prints_the_folder_on_stdout_and_the_server_command_on_stderr(deployed, demo_gguf, tmp_path):
    root, shared, _, deploy, _ = deployed
    done = trtbuild(deploy, "pull", demo_gguf[0] / LOCK, "--store", shared, "--target", "q4_k_m-gguf",
                    "--dest", tmp_path / "q4")
    assert (done.returncode, done.stdout, done.stderr) == (
        0, f"{tmp_path / 'q4'}\n", f"serve it from that folder: {' '.join(COMMAND)}\n")


def test_auto_on_a_host_without_an_nvidia_gpu_takes_a_gguf_target(deployed, demo_gguf, recorded_gpu):
    _, shared, _, deploy, _ = deployed
    from trtbuild.lock import lockfile

    recorded_gpu(None)  # NVML answers with no driver (its settings are in os.environ): the same on a GPU host
    # the demo recipe (its lock in the build's store) orders q8_0 before q4_k_m; a bare lock file has only its own order
    env = {**os.environ, "TRTBUILD_CACHE": str(demo_gguf[0])}
    digest = lockfile.read(demo_gguf[0] / LOCK).targets["q8_0-gguf"].digest
    for runtime in ("auto", "llamacpp"):
        done = trtbuild(env, "pull", "--store", shared, "--runtime", runtime, "--dry-run")
        assert (done.returncode, done.stdout) == (0, f"would pull q8_0-gguf (llamacpp, CPU): artifact {digest}\n")


def test_check_loads_the_pulled_gguf_in_this_hosts_llama_cpp(deployed, run):
    served = deployed[0] / "served"
    version = llamacpp.version()
    result = run("check", served)
    assert (result.exit_code, result.stdout.splitlines()) == (0, [
        f"OK: {served}/model.gguf loads in llama.cpp (llama-cpp-python {version}): Q8_0 (file type 7), llama, "
        "49152 tokens",
        f"server: `{' '.join(COMMAND)}` (run from {served}): its options parse with llama-cpp-python {version}'s "
        f"server (packaged with {read_serving(served).llama_cpp_python})"])
    out = run("check", served, "--json")
    data = json.loads(out.stdout)
    assert (out.exit_code, errors("check", data)) == (0, [])
    assert {k: data[k] for k in ("accepted", "loads", "llama_cpp_python", "loaded", "problems")} == {
        "accepted": True, "loads": True, "llama_cpp_python": version,
        "loaded": {"architecture": "llama", "vocab_size": 49152}, "problems": []}
    assert data["server"] == {"command": COMMAND, "packaged_with": read_serving(served).llama_cpp_python,
                              "options_parse": True}


def _copy(served: Path, to: Path) -> Path:
    shutil.copytree(served, to, copy_function=shutil.copyfile)  # writable copies: the pulled files are read-only
    return to


def test_check_of_a_truncated_gguf_names_the_file_and_llama_cpps_reason(deployed, run, tmp_path):
    folder = _copy(deployed[0] / "served", tmp_path / "truncated")
    model = folder / "model.gguf"
    size = model.stat().st_size
    with model.open("r+b") as f:
        f.truncate(size // 2)
    version = llamacpp.version()
    result = run("check", folder)
    lines = result.stdout.splitlines()
    assert (result.exit_code, lines[0]) == (1, f"{model}: {size // 2} bytes; report.json records {size}")
    assert lines[1].startswith(f"{model}: llama.cpp (llama-cpp-python {version}) cannot load it: tensor '")
    assert lines[1].endswith("' data is not within the file bounds, model is corrupted or incomplete")
    assert len(lines) == 2
    data = json.loads(run("check", folder, "--json").stdout)
    assert (errors("check", data), data["accepted"], data["loads"], data["loaded"], data["problems"]) == (
        [], False, False, None, lines)


def test_check_of_a_byte_damaged_gguf_header_names_the_file_and_exits_1(deployed, run, tmp_path):
    folder = _copy(deployed[0] / "served", tmp_path / "damaged")
    model = folder / "model.gguf"
    with model.open("r+b") as f:
        f.write(b"GGUX")  # the magic number
    result = run("check", folder)
    assert (result.exit_code, result.stdout) == (
        1, f"{model}: llama.cpp (llama-cpp-python {llamacpp.version()}) cannot load it: invalid magic characters: "
           "'GGUX', expected 'GGUF'\n")


def test_check_on_a_host_without_llama_cpp_python_says_so(deployed, run, monkeypatch):
    served = deployed[0] / "served"
    monkeypatch.setattr(llamacpp, "version", lambda: None)
    result = run("check", served)
    assert (result.exit_code, result.stdout) == (
        1, f"{served}/model.gguf: not checked: this host has no llama-cpp-python ({LLAMACPP_INSTALL})\n")


def test_check_of_a_gguf_folder_refuses_the_options_of_other_kinds(deployed, run):
    served = deployed[0] / "served"
    result = run("check", served, "--gpu", "sm90")
    assert (result.exit_code, result.stderr) == (
        2, f"--gpu does not apply to a GGUF folder ({served}): it is checked against this host's llama.cpp\n")


def test_ls_lists_gguf_targets_with_their_figures_and_llama_cpp_as_what_serves_them(deployed, demo_gguf):
    _, shared, env, _, _ = deployed
    done = trtbuild(env, "ls", "--store", shared, "--compatible", "--json")
    data = json.loads(done.stdout)
    assert (done.returncode, errors("ls", data)) == (0, [])
    lock = (demo_gguf[0] / LOCK).read_text()
    by_target = {p["target"]: p for p in data["published"]}
    assert sorted(by_target) == ["q4_k_m-gguf", "q8_0-gguf"]
    for target, item in by_target.items():
        assert (item["stage"], item["serves"], item["fits"], item["runtime"], item["world_size"], item["reasons"]) == (
            "gguf", {"llamacpp": []}, True, "llamacpp", None, [])
        assert [v["id"] for v in item["validations"]] == [f"{target}:validate"]
        assert f"kld_mean: {item['validations'][0]['kld_mean']:.6g}" in lock
        assert f"size: {item['size_bytes']}" in lock
    table = trtbuild(env, "ls", "--store", shared, "--compatible").stdout.splitlines()
    rows = [line for line in table if "-gguf" in line]
    assert [(row.split()[1], row.split()[2]) for row in rows] == [("q4_k_m-gguf", "gguf"), ("q8_0-gguf", "gguf")]
    assert all(row.endswith("yes (llamacpp, CPU)") and "  llamacpp cpu  " in row for row in rows)


def test_the_report_shows_a_gguf_targets_type_size_verdict_kl_and_llama_cpp(demo_gguf, monkeypatch):
    from trtbuild.lock import lockfile
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe_or_demo
    from trtbuild.report.collect import rows
    from trtbuild.store.local import open_store

    store_path = demo_gguf[0]
    monkeypatch.setenv("TRTBUILD_CACHE", str(store_path))
    loaded = load_recipe_or_demo(None)
    lock = lockfile.read(store_path / LOCK)
    found = {r.target: r for r in rows(plan_recipe(loaded), open_store(None), lock)}
    for target, gguf_type in (("q8_0-gguf", "Q8_0"), ("q4_k_m-gguf", "Q4_K_M")):
        row, validation = found[target], lock.targets[f"{target}:validate"]
        assert (row.kind, row.quant, row.status, row.size_bytes, row.gates_passed, row.serves) == (
            "gguf", gguf_type, "built", lock.targets[target].size, True, "llamacpp (CPU)")
        assert float(f"{row.kld_mean:.6g}") == validation.metrics["kld_mean"]
        assert row.measured_by == f"{validation.runner} on {validation.device}"


# ---- the choice's rules, on hand-made locks --------------------------------------------------------

def digest(n: int) -> str:
    return f"{n:064x}"


def lock_of(targets: dict[str, LockedTarget]) -> LockFile:
    checks = {f"{tid}:validate": LockedTarget(stage="validate", key=t.key, digest=t.digest, size=1, gates_passed=True)
              for tid, t in targets.items()}
    return LockFile(recipe=LockedRecipe(name="tiny", digest=digest(0)), source=None, toolchain={},
                    targets={**targets, **checks}, validation="run")


def mixed() -> LockFile:
    """An engine (sm90), an hf-checkpoint and two gguf targets, in the recipe's order."""
    return lock_of({
        "base-tp1-sm90": LockedTarget(stage="engine", key=digest(1), digest=digest(2), size=2 ** 30,
                                      platform=LockedPlatform(sm="sm90", tp=1, pp=1, world_size=1, tensorrt_llm="1.2.1",
                                                              tensorrt="10.13.2", engine_bytes_per_rank=2 ** 30)),
        "base-hf": LockedTarget(stage="hf-checkpoint", key=digest(3), digest=digest(4), size=2 ** 30),
        "q8_0-gguf": LockedTarget(stage="gguf", key=digest(5), digest=digest(6), size=2 ** 28),
        "q4_k_m-gguf": LockedTarget(stage="gguf", key=digest(7), digest=digest(8), size=2 ** 27),
    })


def formats(_tid, _entry):
    return (None, None)


def no_gpu(llama_cpp_python="0.3.36") -> Host:
    return Host(gpus=(), tensorrt_llm=None, tensorrt=None, runtimes={"trtllm": None, "vllm": None, "sglang": None},
                llama_cpp_python=llama_cpp_python)


def test_without_a_gpu_auto_takes_the_first_gguf_variant_and_says_why_the_rest_do_not_fit():
    selection = choose(mixed(), no_gpu(), formats=formats, variant_order=["base", "q8_0", "q4_k_m"])
    assert (selection.chosen.target, selection.chosen.runtime, selection.chosen.world_size) == ("q8_0-gguf", "llamacpp", None)
    assert {c.target: c.reasons for c in selection.candidates} == {
        "base-tp1-sm90": ["sm: the engine is for sm90; this host has no NVIDIA GPU (NVML sees none)",
                          "tensorrt_llm: the engine was built with 1.2.1; this host has none",
                          "tensorrt: the engine was built with 10.13.2; this host has none"],
        "base-hf": ["gpu: this host has no NVIDIA GPU (NVML sees none)"],
        "q8_0-gguf": [], "q4_k_m-gguf": []}
    assert choose(mixed(), no_gpu(), formats=formats, variant_order=["q4_k_m", "q8_0"]).chosen.target == "q4_k_m-gguf"


def test_without_llama_cpp_python_no_gguf_fits_and_the_hint_is_its_install():
    host = no_gpu(llama_cpp_python=None)
    selection = choose(mixed(), host, formats=formats)
    assert selection.chosen is None
    assert [c.reasons for c in selection.candidates if c.stage == "gguf"] == [
        [f"llamacpp: llama-cpp-python is not installed ({LLAMACPP_INSTALL})"]] * 2
    assert build_hint("", mixed(), host) == f"to serve its gguf targets (on the CPU): `{LLAMACPP_INSTALL}`"
    assert host.describe() == "no NVIDIA GPU, no tensorrt_llm, no tensorrt, no vllm, no sglang, no llama-cpp-python"


def test_runtime_llamacpp_takes_only_gguf_targets_and_other_runtimes_none():
    selection = choose(mixed(), no_gpu(), runtime="llamacpp", formats=formats)
    reasons = {c.target: c.reasons for c in selection.candidates}
    assert (selection.chosen.target, reasons["base-tp1-sm90"], reasons["base-hf"]) == (
        "q8_0-gguf", ["runtime: --runtime llamacpp does not load TensorRT engines"],
        ["runtime: --runtime llamacpp does not serve Hugging Face checkpoints"])
    vllm = choose(mixed(), no_gpu(), runtime="vllm", formats=formats)
    assert [c.reasons for c in vllm.candidates if c.stage == "gguf"] == [
        ["runtime: --runtime vllm does not serve GGUF files"]] * 2


def test_a_gpu_host_keeps_engines_and_hf_checkpoints_before_gguf(recorded_gpu, installed_packages):
    recorded_gpu("H100")
    installed_packages(tensorrt_llm="1.2.1", tensorrt="10.13.2", vllm="0.33.0")
    host = dataclasses.replace(Host.probe(), llama_cpp_python="0.3.36")
    for prefer in ("throughput", "latency"):
        assert choose(mixed(), host, prefer=prefer, formats=formats).chosen.target == "base-tp1-sm90"
    without_engine = lock_of({k: v for k, v in mixed().targets.items() if ":" not in k and k != "base-tp1-sm90"})
    chosen = choose(without_engine, host, formats=formats, variant_order=["q8_0", "base"]).chosen
    assert (chosen.target, chosen.runtime) == ("base-hf", "vllm")  # before q8_0-gguf, though q8_0 is first in the recipe
