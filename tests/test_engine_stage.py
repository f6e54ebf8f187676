"""The engine stage end to end, as a user runs `trtbuild build`, with stand-ins for what this machine
cannot have: `trtllm-build` and the LLM API of tensorrt_llm 1.2.0+standin (tests/standin_trtllm),
and NVML answering with a recorded GPU (tests/standin_nvml). Everything they make says so: the
engine's trtbuild.json, the build output, `cache ls`. On a host without a GPU the engines are skipped
with the SM and toolchain they need (tests/test_build.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import NEMO_DATA, ROOT, STANDIN_NVML, standin_toolchain_env

TINY_HF = NEMO_DATA / "hf_tiny_llama_tied_bf16"
STANDIN_TOOLCHAIN = {"tensorrt": "10.14.1+standin", "tensorrt_llm": "1.2.0+standin"}

RECIPE = """
schema: 1
name: tiny-engines
source: {path: model}
variants: {bf16: {}, fp8: {quant: fp8}}
calibration: {samples: 4, seq_len: 32}
gpus: [sm90, sm89]
limits: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}
validate: {samples: 2, seq_len: 32}
"""


def standin_env(store: Path, gpu: str | None = "H100", count: int = 1, bin_first: Path | None = None) -> dict:
    return standin_toolchain_env({**os.environ, "TRTBUILD_CACHE": str(store)}, gpu, count, bin_first)


def trtbuild(env: dict, *args, cwd: Path):
    return subprocess.run([sys.executable, "-m", "trtbuild", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=900)


def build_json(env: dict, recipe: Path, *args) -> tuple[int, dict]:
    result = trtbuild(env, "build", recipe, "--json", *args, cwd=recipe.parent)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, {t["name"]: t for t in json.loads(result.stdout)["targets"]}


def make_workspace(folder: Path, body: str = RECIPE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(TINY_HF, folder / "model")
    for path in (folder / "model").iterdir():
        path.chmod(0o644)
    recipe = folder / "recipe.yaml"
    recipe.write_text(body)
    return recipe


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The tiny recipe built twice on a recorded H100 with the stand-in toolchain."""
    folder = tmp_path_factory.mktemp("engines")
    recipe = make_workspace(folder)
    env = standin_env(folder / "store")
    first_rc, first = build_json(env, recipe)
    second_rc, second = build_json(env, recipe)
    return folder, recipe, env, (first_rc, first), (second_rc, second)


def test_every_engine_of_this_hosts_sm_is_built_validated_and_reused(built):
    _, _, _, (rc, first), (rc2, second) = built
    assert rc == 0, {k: v["reason"] for k, v in first.items() if v["status"] == "failed"}
    for variant in ("bf16", "fp8"):
        for name in (f"{variant}-tp1-sm90:twin", f"{variant}-tp1-sm90:validate", f"{variant}-tp1-sm90"):
            assert first[name]["status"] == "built", (name, first[name]["reason"])
            assert second[name]["status"] == "cached", name
            assert second[name]["digest"] == first[name]["digest"]
        check = first[f"{variant}-tp1-sm90:validate"]
        assert all(gate["passed"] for gate in check["gates"].values())
        assert check["standin"] == ["tensorrt", "tensorrt_llm"]
        for name in (f"{variant}-tp1-sm89:twin", f"{variant}-tp1-sm89"):
            assert first[name]["status"] == "skipped"
            assert first[name]["reason"].startswith(
                "needs sm89 GPU with tensorrt_llm 1.2.x (this machine: sm90 GPU, tensorrt_llm 1.2.0+standin)")
    assert rc2 == 0 and {t["status"] for t in second.values()} == {"cached", "skipped"}


def test_the_engine_artifact_is_what_trtllm_build_wrote_plus_trtbuild_json(built):
    folder, _, _, (_, first), _ = built
    engine = first["fp8-tp1-sm90"]
    path = Path(engine["path"])
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "rank0.engine", "trtbuild.json"]
    config = json.loads((path / "config.json").read_text())
    assert config["version"] == "1.2.0+standin"
    assert config["pretrained_config"]["quantization"]["quant_algo"] == "FP8"
    assert config["build_config"]["gather_context_logits"] is False  # the published engine; its twin has it
    twin_config = json.loads((Path(first["fp8-tp1-sm90:twin"]["path"]) / "config.json").read_text())
    assert twin_config["build_config"]["gather_context_logits"] is True
    facts = json.loads((path / "trtbuild.json").read_text())
    command = facts.pop("command")
    assert facts == {
        "schema": 1, "kind": "engine", "sm": "sm90", "tp": 1, "pp": 1, "world_size": 1,
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None},
        "checkpoint": first["fp8-tp1"]["digest"],
        "toolchain": {**STANDIN_TOOLCHAIN, "image": None},
        "standin": True,
        "memory": {"engine_bytes_per_rank": (path / "rank0.engine").stat().st_size},
    }
    assert command[0] == "trtllm-build" and command[command.index("--checkpoint_dir") + 1] == "checkpoint"
    assert engine["standin"] == ["tensorrt", "tensorrt_llm"]


def test_explain_prints_the_command_the_stage_ran(built):
    folder, recipe, env, (_, first), _ = built
    facts = json.loads((Path(first["bf16-tp1-sm90"]["path"]) / "trtbuild.json").read_text())
    result = trtbuild(env, "explain", recipe, "bf16-tp1-sm90", cwd=folder)
    assert result.returncode == 0, result.stderr
    twin_line, line = [line for line in result.stdout.splitlines() if line.startswith("trtllm-build ")]
    twin, published = shlex.split(twin_line), shlex.split(line)
    assert [a for a in twin if a != "--gather_context_logits"] == published and len(twin) == len(published) + 1
    # explain shows the command as it runs with no timing cache stored yet; the stage ran with one
    # when an earlier engine of the build had stored it
    ran = list(facts["command"])
    if "--input_timing_cache" in ran:
        i = ran.index("--input_timing_cache")
        del ran[i:i + 2]
    assert shlex.split(line) == ran


def test_the_engine_key_names_checkpoint_options_toolchain_and_sm_and_no_path(built):
    folder, _, _, (_, first), _ = built
    from trtbuild.store.local import LocalStore

    store = LocalStore(folder / "store")
    record = store.get_record(first["bf16-tp1-sm90"]["key"])
    assert record.fields.inputs == {"checkpoint": first["bf16-tp1"]["digest"]}
    assert record.fields.toolchain == STANDIN_TOOLCHAIN
    assert record.fields.platform == {"sm": "sm90"}
    assert str(folder) not in record.fields.model_dump_json()
    assert record.execution.figures["gpus"] == ["NVIDIA H100 80GB HBM3"]
    recorded = json.loads((STANDIN_NVML / "gpus" / "H100.json").read_text())
    cuda = recorded["nvmlSystemGetCudaDriverVersion"]
    assert (record.execution.figures["driver"], record.execution.figures["cuda_driver"]) == (
        recorded["nvmlSystemGetDriverVersion"], f"{cuda // 1000}.{cuda % 1000 // 10}")
    assert set(record.execution.logs) == {"engine.log"}
    log = store.blob_path(record.execution.logs["engine.log"].hash).read_text()
    assert "[TensorRT-LLM] [I] Engine for rank 0 serialized" in log


def test_a_timing_cache_is_stored_fed_to_the_next_build_and_kept_out_of_engine_keys(built):
    folder, _, _, (_, first), _ = built
    from trtbuild.builder import timingcache
    from trtbuild.store.checkout import materialize
    from trtbuild.store.local import LocalStore

    store = LocalStore(folder / "store")
    refs = [(target, ref) for recipe, target, ref in store.refs() if recipe == timingcache.REFS]
    assert refs, "no timing cache stored"
    engines = [store.get_record(first[name]["key"]) for name in first
               if first[name]["stage"] == "engine" and first[name]["status"] == "built"]
    uses = sorted(r.execution.figures["timing_cache"] for r in engines)
    assert uses.count("new") == len(refs) and uses.count("reused") == len(engines) - len(refs)
    for record in engines:
        assert "timing" not in record.fields.model_dump_json()  # never part of an engine's key
    content = {(materialize(store, ref.digest) / "timing.cache").read_text() for _, ref in refs}
    assert all(text.startswith("STANDIN-TIMING-CACHE\n") for text in content)


def test_cache_ls_and_the_build_table_say_a_stand_in_made_it(built):
    folder, recipe, env, _, _ = built
    listed = trtbuild(env, "cache", "ls", "--json", cwd=folder)
    records = json.loads(listed.stdout)
    engines = [r for r in records if r["stage"] == "engine"]
    assert engines and all(r["standin"] == ["tensorrt", "tensorrt_llm"] for r in engines)
    assert all(r["standin"] == [] for r in records if r["stage"].startswith(("checkpoint", "source")))
    table = trtbuild(env, "cache", "ls", cwd=folder)
    assert "STAND-IN" in table.stdout
    again = trtbuild(env, "build", recipe, cwd=folder)
    assert "STAND-IN toolchain made" in again.stdout


def test_the_lock_records_each_engines_platform(built):
    folder, recipe, _, (_, first), _ = built
    lock = yaml.safe_load((recipe.parent / "recipe.lock").read_text())
    entry = lock["targets"]["fp8-tp1-sm90"]
    facts = json.loads((Path(first["fp8-tp1-sm90"]["path"]) / "trtbuild.json").read_text())
    platform = {"sm": "sm90", "tp": 1, "pp": 1, "world_size": 1, "tensorrt_llm": "1.2.0+standin",
                "tensorrt": "10.14.1+standin", "quantization": facts["quantization"],
                "engine_bytes_per_rank": facts["memory"]["engine_bytes_per_rank"], "standin": True}
    assert {k: v for k, v in entry["platform"].items() if v is not None} == platform
    assert "platform" not in lock["targets"]["fp8-tp1"] or not lock["targets"]["fp8-tp1"]["platform"]


# ---- failures: one line with the reason and the log, the log's last lines in the output ----

FAILING_BUILD = """#!/bin/sh
echo "[TensorRT-LLM] [I] Loading checkpoint"
echo "[TensorRT-LLM][ERROR] CUDA out of memory while building rank 0"
exit 3
"""


def fake_tool(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(body)
    path.chmod(0o755)
    return folder


def test_a_failed_trtllm_build_is_one_line_with_the_log_and_its_last_lines(tmp_path):
    recipe = make_workspace(tmp_path / "ws")
    env = standin_env(tmp_path / "store", bin_first=fake_tool(tmp_path / "bin", "trtllm-build", FAILING_BUILD))
    rc, targets = build_json(env, recipe, "--target", "bf16-tp1-sm90", "--no-validate")
    assert rc == 1
    engine = targets["bf16-tp1-sm90"]
    assert engine["status"] == "failed"
    assert re.fullmatch(r"EngineBuildFailed: trtllm-build exited with status 3: \[TensorRT-LLM\]\[ERROR\] CUDA out of "
                        r"memory while building rank 0 \(log: .*/failed/[0-9a-f]{64}/logs\)", engine["reason"]), engine["reason"]
    assert engine["log_tail"][-2:] == ["[TensorRT-LLM] [I] Loading checkpoint",
                                       "[TensorRT-LLM][ERROR] CUDA out of memory while building rank 0"]
    shown = trtbuild(env, "build", recipe, "--target", "bf16-tp1-sm90", "--no-validate", cwd=recipe.parent)
    assert shown.returncode == 1
    assert "bf16-tp1-sm90: last lines of its log:\n" in shown.stdout
    assert "    [TensorRT-LLM][ERROR] CUDA out of memory while building rank 0\n" in shown.stdout


WRONG_ENGINE = """#!/usr/bin/env python3
import json, sys
from pathlib import Path
args = sys.argv[1:]
out = Path(args[args.index("--output_dir") + 1]); out.mkdir()
ckpt = json.loads((Path(args[args.index("--checkpoint_dir") + 1]) / "config.json").read_text())
ckpt["mapping"] = {"world_size": 2, "tp_size": 2, "pp_size": 1}
(out / "config.json").write_text(json.dumps({"version": "1.2.1", "pretrained_config": ckpt, "build_config": {}}))
(out / "rank0.engine").write_bytes(b"plan")
"""


def test_an_engine_unlike_what_was_asked_fails_the_stage(tmp_path):
    recipe = make_workspace(tmp_path / "ws")
    env = standin_env(tmp_path / "store", bin_first=fake_tool(tmp_path / "bin", "trtllm-build", WRONG_ENGINE))
    rc, targets = build_json(env, recipe, "--target", "bf16-tp1-sm90", "--no-validate")
    assert rc == 1
    reason = targets["bf16-tp1-sm90"]["reason"]
    limits = "; ".join(f"build_config.{name} is None, asked {value}" for name, value in (
        ("max_batch_size", 4), ("max_input_len", 64), ("max_seq_len", 128), ("max_num_tokens", 256), ("max_beam_width", 1)))
    expected = ("EngineBuildFailed: the engine is not what was asked: mapping.world_size is 2, the checkpoint's is 1; "
                "mapping.tp_size is 2, the checkpoint's is 1; config.json version '1.2.1', the toolchain is "
                f"tensorrt_llm 1.2.0+standin; {limits} (log: ")
    assert reason.startswith(expected), reason
    assert targets["bf16-tp1-sm90"]["digest"] is None


def test_without_nvml_engines_are_skipped_naming_sm_and_toolchain(tmp_path):
    recipe = make_workspace(tmp_path / "ws")
    env = standin_env(tmp_path / "store", gpu=None)
    rc, targets = build_json(env, recipe, "--target", "bf16-tp1-sm*", "--no-validate")
    assert rc == 0
    assert targets["bf16-tp1"]["status"] == "built"
    for sm in ("sm90", "sm89"):
        assert (targets[f"bf16-tp1-{sm}"]["status"], targets[f"bf16-tp1-{sm}"]["reason"]) == (
            "skipped", f"needs {sm} GPU with tensorrt_llm 1.2.x (this machine: no GPU, tensorrt_llm 1.2.0+standin)")


def test_gpu_auto_builds_this_hosts_sm_and_leaves_the_others_to_their_hosts(tmp_path):
    recipe = make_workspace(tmp_path / "ws")
    env = standin_env(tmp_path / "store", gpu="L40S")
    rc, targets = build_json(env, recipe, "--target", "bf16-tp1-sm*", "--no-validate", "--gpu", "auto", "--require-all")
    assert rc == 0
    assert targets["bf16-tp1-sm89"]["status"] == "built"
    assert (targets["bf16-tp1-sm90"]["status"], targets["bf16-tp1-sm90"]["reason"]) == (
        "skipped", "needs an sm90 GPU: --gpu auto builds only this host's SMs (sm89)")
    rc, targets = build_json(env, recipe, "--target", "bf16-tp1-sm*", "--no-validate", "--require-all")
    assert rc == 1 and targets["bf16-tp1-sm90"]["status"] == "failed"
    assert targets["bf16-tp1-sm89"]["status"] == "cached"


# ---- in the recipe's container image ----

def test_the_container_command_mounts_the_work_folder_and_the_checkpoint_read_only():
    from trtbuild.host.hardware import DetectedGpu
    from trtbuild.builder.stages.engine import container_argv

    image = "nvcr.io/nvidia/tensorrt-llm/release@sha256:" + "a" * 64
    gpus = [DetectedGpu(0, "NVIDIA H100 80GB HBM3", "sm90", 1), DetectedGpu(2, "NVIDIA H100 80GB HBM3", "sm90", 1)]
    argv = container_argv(image, Path("/s/tmp/w"), Path("/s/checkouts/d"), ["trtllm-build", "--workers", "2"], gpus)
    assert argv == ["docker", "run", "--rm", "--gpus", '"device=0,2"', "--ipc=host", "--ulimit", "memlock=-1",
                    "--ulimit", "stack=67108864", "--user", f"{os.getuid()}:{os.getgid()}", "-v", "/s/tmp/w:/work",
                    "-v", "/s/checkouts/d:/work/checkpoint:ro", "-w", "/work", image, "trtllm-build", "--workers", "2"]


def test_a_recipe_image_must_be_pinned_by_digest(tmp_path):
    recipe = make_workspace(tmp_path / "ws", RECIPE + "toolchain: {image: 'nvcr.io/nvidia/tensorrt-llm/release:1.2.1'}\n")
    result = trtbuild(standin_env(tmp_path / "store"), "plan", recipe, cwd=recipe.parent)
    assert result.returncode == 2
    assert result.stderr == (f"{recipe}:10:20: toolchain.image: 'nvcr.io/nvidia/tensorrt-llm/release:1.2.1' is not "
                             "pinned by digest: name the image as NAME@sha256:<64 hex digits> (`docker inspect "
                             "--format '{{index .RepoDigests 0}}' IMAGE`); a tag can move\n")


FAKE_DOCKER = '''#!/usr/bin/env python3
"""A fake `docker run` for tests: logs its argv, maps the mounts onto this host's folders (the
read-only checkpoint mount becomes a link at the mount point) and runs the command here."""
import json, os, subprocess, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
assert args[0] == "run", args
args, i, mounts, workdir, entry = args[1:], 0, {}, None, None
while args[i].startswith("-"):
    name = args[i]
    if name in ("--gpus", "--ulimit", "--user", "-v", "-w", "--entrypoint"):
        value, i = args[i + 1], i + 2
        if name == "-v":
            source, target = value.split(":")[:2]
            mounts[target] = source
        elif name == "-w":
            workdir = value
        elif name == "--entrypoint":
            entry = value
    else:
        i += 1
command = ([entry] if entry else []) + args[i + 1:]
for target, source in mounts.items():
    if target.startswith("/work/"):
        point = Path(mounts["/work"]) / target[len("/work/"):]
        point.rmdir()
        point.symlink_to(source)
sys.exit(subprocess.call(command, cwd=mounts.get(workdir)))
'''

IMAGE = "nvcr.io/nvidia/tensorrt-llm/release@sha256:" + "0123456789abcdef" * 4


def test_an_engine_built_in_the_recipes_image_is_keyed_by_the_image(tmp_path):
    recipe = make_workspace(tmp_path / "ws", RECIPE + f"toolchain: {{image: '{IMAGE}'}}\n")
    env = standin_env(tmp_path / "store", bin_first=fake_tool(tmp_path / "bin", "docker", FAKE_DOCKER))
    env["FAKE_DOCKER_LOG"] = str(tmp_path / "docker.log")
    rc, targets = build_json(env, recipe, "--target", "bf16-tp1-sm90", "--no-validate")
    assert rc == 0, targets["bf16-tp1-sm90"]["reason"]
    engine = targets["bf16-tp1-sm90"]
    from trtbuild.store.local import LocalStore

    record = LocalStore(tmp_path / "store").get_record(engine["key"])
    assert (record.stage, record.fields.toolchain) == ("engine:image", {"image": IMAGE})
    facts = json.loads((Path(engine["path"]) / "trtbuild.json").read_text())
    assert facts["toolchain"] == {**STANDIN_TOOLCHAIN, "image": IMAGE} and facts["standin"] is True
    assert engine["standin"] == ["tensorrt", "tensorrt_llm"]  # what the probe found inside the image
    calls = [json.loads(line) for line in (tmp_path / "docker.log").read_text().splitlines()]
    assert [c[:4] for c in calls] == [["run", "--rm", "--entrypoint", "python3"], ["run", "--rm", "--gpus", '"device=0"']]
    build = calls[1]
    assert build[build.index(IMAGE) + 1:] == facts["command"]
    assert any(v.endswith(":/work/checkpoint:ro") for v in build)
    lock = yaml.safe_load((recipe.parent / "recipe.lock").read_text())
    assert lock["toolchain"]["engine:image"] == {"image": IMAGE}


def test_a_build_host_with_too_little_memory_is_refused_before_building():
    from trtbuild.plan.estimate import format_bytes
    from trtbuild.host.hardware import DetectedGpu
    from trtbuild.builder.stages.base import BuildNeeds
    from trtbuild.builder.stages.engine import host_memory_problem

    gib = 1 << 30
    l40s = DetectedGpu(0, "NVIDIA L40S", "sm89", 48 * gib)
    needs = BuildNeeds(host_ram_bytes_per_worker=20 * gib, gpu_bytes_per_worker=8 * gib)
    assert host_memory_problem(needs, [l40s], 1, 24 * gib) is None
    assert host_memory_problem(needs, [l40s, l40s], 2, 24 * gib) == (
        f"the build needs {format_bytes(40 * gib)} of host memory with 2 worker(s) (plan estimate: "
        f"estimate.build_memory_needs) and this host has {format_bytes(24 * gib)} available")
    big = BuildNeeds(host_ram_bytes_per_worker=gib, gpu_bytes_per_worker=50 * gib)
    assert host_memory_problem(big, [l40s], 1, 24 * gib) == (
        f"each build worker needs {format_bytes(50 * gib)} of GPU memory (plan estimate: "
        f"estimate.build_memory_needs) and NVIDIA L40S has {format_bytes(48 * gib)}")
    assert host_memory_problem(None, [l40s], 1, None) is None


# ---- the stand-in itself: it must refuse what trtllm-build refuses ----

def test_the_standin_trtllm_build_parses_like_argparse_and_refuses_a_malformed_checkpoint(tmp_path):
    standin = ROOT / "tests" / "standin_trtllm" / "bin" / "trtllm-build"
    unknown = subprocess.run([sys.executable, str(standin), "--max_seq_length", "8"], capture_output=True, text=True)
    assert unknown.returncode == 2
    assert unknown.stderr.splitlines()[-1] == "trtllm-build: error: unrecognized arguments: --max_seq_length 8"
    choice = subprocess.run([sys.executable, str(standin), "--gemm_plugin", "fp16"], capture_output=True, text=True)
    assert choice.returncode == 2 and "argument --gemm_plugin: invalid choice: 'fp16'" in choice.stderr
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({
        "architecture": "LlamaForCausalLM", "dtype": "float16", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1}}))
    (checkpoint / "rank0.safetensors").write_bytes(b"")
    missing = subprocess.run([sys.executable, str(standin), "--checkpoint_dir", str(checkpoint), "--output_dir",
                              str(tmp_path / "engine")], capture_output=True, text=True)
    assert missing.returncode == 1
    assert missing.stderr == (f"trtllm-build 1.2.0+standin (a test stand-in): checkpoint {checkpoint} has no "
                              "rank1.safetensors (world_size 2)\n")
    assert list((tmp_path / "engine").iterdir()) == []  # build.py main() makes --output_dir before reading


def test_trtbuild_check_on_a_standin_engine_never_says_ok(built):
    folder, recipe, env, (_, first), _ = built
    lock = recipe.parent / "recipe.lock"
    result = trtbuild(env, "check", first["bf16-tp1-sm90"]["path"], "--lock", lock, cwd=folder)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ("stand-in: made by a stand-in toolchain (tensorrt_llm 1.2.0+standin), not by TensorRT: "
                             "it is not an engine anything can load\n"
                             f"instead: no engine target of {lock} fits this host\n")
