"""`trtbuild check ENGINE_DIR`: hand-made engine folders (TensorRT-LLM's layout plus trtbuild.json)
against a host whose NVML answers are recorded from real boards and whose packages are metadata."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import minimal
from trtbuild.lock import lockfile
from trtbuild.host import toolchain
from trtbuild.recipe.schema import load_recipe
from trtbuild.store.platform import EnginePlatform

FP8 = {"quant_algo": "FP8", "kv_cache_quant_algo": None}
INT4_AWQ = {"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None, "group_size": 128}
# Test data: any two distinct versions of each package would do.
TRTLLM, TRT = "1.2.0", "10.13.3.9"
H100_BYTES = 81559 * 2**20


def make_engine(folder: Path, sm: str = "sm90", tp: int = 1, pp: int = 1, version: str = TRTLLM, tensorrt: str | None = TRT,
                quantization: dict = FP8, per_rank: int = 1000, standin: bool = False) -> Path:
    """An engine folder as trtllm-build writes it (config.json, rank<N>.engine) with the engine
    stage's trtbuild.json; the rank files are placeholders of the recorded size."""
    folder.mkdir(parents=True)
    world = tp * pp
    config = {"version": version,
              "pretrained_config": {"architecture": "LlamaForCausalLM", "dtype": "bfloat16",
                                    "mapping": {"world_size": world, "tp_size": tp, "pp_size": pp},
                                    "quantization": quantization},
              "build_config": {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048}}
    (folder / "config.json").write_text(json.dumps(config))
    for rank in range(world):
        (folder / f"rank{rank}.engine").write_bytes(b"\0" * 16)
    record = {"schema": 1, "kind": "engine", "sm": sm, "tp": tp, "pp": pp, "world_size": world,
              "quantization": quantization, "checkpoint": "ab" * 32,
              "toolchain": {"tensorrt_llm": version, "tensorrt": tensorrt, "image": None}, "standin": standin,
              "command": ["trtllm-build", "--checkpoint_dir", "checkpoint", "--output_dir", "engine"],
              "memory": {"engine_bytes_per_rank": per_rank}}
    (folder / "trtbuild.json").write_text(json.dumps(record))
    return folder


def platform(sm: str, tp: int = 1, pp: int = 1, quantization: dict = FP8, tensorrt_llm: str = TRTLLM, tensorrt: str = TRT,
             standin: bool = False) -> dict:
    return {"sm": sm, "tp": tp, "pp": pp, "world_size": tp * pp, "tensorrt_llm": tensorrt_llm, "tensorrt": tensorrt,
            "quantization": quantization, "engine_bytes_per_rank": 1000, "standin": standin}


def write_lock(ws, engines: dict[str, dict]) -> Path:
    """A lock written by lockfile.write from runner-like results whose engines carry `platform`."""
    loaded = load_recipe(ws.recipe(minimal(gpus="[sm80, sm90]")))
    results = [SimpleNamespace(id=target_id, stage="engine", key="1" * 64, digest=f"{n:064x}", size=16, summary=None,
                               platform=EnginePlatform(**facts)) for n, (target_id, facts) in enumerate(engines.items(), start=1)]
    results.append(SimpleNamespace(id="fp8-tp1", stage="checkpoint", key="2" * 64, digest="3" * 64, size=16, summary=None))
    path = ws.root / "recipe.lock"
    lockfile.write(path, loaded, None, results, {})
    return path


@pytest.fixture
def h100_host(recorded_gpu, installed_packages):
    recorded_gpu("H100")
    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)


def test_a_matching_engine_is_ok(tmp_path, run, h100_host):
    engine = make_engine(tmp_path / "engine")
    result = run("check", engine)
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == (f"OK: {engine} (sm90, tp 1 x pp 1, tensorrt_llm 1.2.0, tensorrt 10.13.3.9) "
                             "fits this host (1x NVIDIA H100 80GB HBM3)\n")


def test_an_sm_mismatch_names_the_lock_target_that_fits(tmp_path, ws, run, recorded_gpu, installed_packages):
    recorded_gpu("A100")
    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    lock = write_lock(ws, {"fp8-tp1-sm80": platform("sm80"), "fp8-tp1-sm90": platform("sm90"),
                           "int4-awq-tp1-sm80": platform("sm80", quantization=INT4_AWQ),  # another model
                           "fp8-tp2-sm80": platform("sm80", tp=2)})  # needs 2 GPUs
    engine = make_engine(tmp_path / "engine")
    result = run("check", engine, "--lock", lock)
    assert (result.exit_code, result.stderr) == (1, "")
    assert result.stdout == ("sm: the engine is for sm90; this host has sm80 (1x NVIDIA A100-SXM4-80GB)\n"
                             f"instead: fp8-tp1-sm80 (in {lock}) fits this host\n")


def test_the_lock_records_each_engines_platform_and_nothing_for_other_stages(ws):
    lock = write_lock(ws, {"fp8-tp1-sm80": platform("sm80")})
    data = yaml.safe_load(lock.read_text())
    assert data["targets"]["fp8-tp1-sm80"]["platform"] == platform("sm80") | {"image": None}
    assert "platform" not in data["targets"]["fp8-tp1"]
    assert lockfile.read(lock).targets["fp8-tp1-sm80"].platform.sm == "sm80"


def test_no_target_of_the_lock_fits(tmp_path, ws, run, recorded_gpu, installed_packages):
    recorded_gpu("L40S")
    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    lock = write_lock(ws, {"fp8-tp1-sm90": platform("sm90"), "fp8-tp1-sm89-stand-in": platform("sm89", standin=True)})
    result = run("check", make_engine(tmp_path / "engine"), "--lock", lock)
    assert (result.exit_code, result.stderr) == (1, "")
    assert result.stdout == ("sm: the engine is for sm90; this host has sm89 (1x NVIDIA L40S)\n"
                             f"instead: no engine target of {lock} fits this host\n")


def test_version_mismatches_are_one_line_each(tmp_path, run, recorded_gpu, installed_packages):
    recorded_gpu("H100")
    installed_packages(tensorrt_llm="1.2.1", tensorrt="10.11.0.33")
    result = run("check", make_engine(tmp_path / "engine"))
    assert (result.exit_code, result.stderr) == (1, "")
    assert result.stdout == ("tensorrt_llm: the engine was built with 1.2.0; this host has 1.2.1\n"
                             "tensorrt: the engine was built with 10.13.3.9; this host has 10.11.0.33\n")


@pytest.mark.skipif(toolchain.package_version("tensorrt") is not None, reason="assumes a host without tensorrt")
def test_an_engine_that_does_not_record_tensorrt_on_a_host_without_it(tmp_path, run, recorded_gpu, installed_packages):
    recorded_gpu("H100")
    installed_packages(tensorrt_llm=TRTLLM)
    result = run("check", make_engine(tmp_path / "engine", tensorrt=None))
    assert (result.exit_code, result.stdout) == (1, "tensorrt: the engine does not record which tensorrt built it; "
                                                    "this host has none\n")


def test_a_world_size_beyond_this_hosts_gpus(tmp_path, run, recorded_gpu, installed_packages):
    recorded_gpu("H100", count=2)
    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    result = run("check", make_engine(tmp_path / "engine", tp=2, pp=2))
    assert (result.exit_code, result.stderr) == (1, "")
    assert result.stdout == "world size: the engine needs 4 GPUs (tp 2 x pp 2); this host has 2 sm90 GPUs\n"


def test_one_rank_bigger_than_the_gpu(tmp_path, run, h100_host):
    assert run("check", make_engine(tmp_path / "fits", per_rank=H100_BYTES)).exit_code == 0
    result = run("check", make_engine(tmp_path / "engine", per_rank=90 * 2**30))
    assert (result.exit_code, result.stderr) == (1, "")
    assert result.stdout == "memory: one rank's engine is 90.0 GiB; this host's NVIDIA H100 80GB HBM3 has 79.6 GiB\n"


def test_no_gpu_at_all(tmp_path, run, recorded_gpu, installed_packages):
    recorded_gpu(None)
    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    result = run("check", make_engine(tmp_path / "engine"))
    assert (result.exit_code, result.stdout) == (1, "sm: the engine is for sm90; this host has no NVIDIA GPU (NVML sees none)\n")


def test_a_standin_engine_never_fits(tmp_path, run, h100_host):
    # Everything else matches this host (versions as the stand-in wrote them aside).
    result = run("check", make_engine(tmp_path / "engine", version="0+standin", tensorrt=TRT))
    assert (result.exit_code, result.stderr) == (1, "")
    assert result.stdout == ("stand-in: made by a stand-in toolchain (tensorrt_llm 0+standin), not by TensorRT: "
                             "it is not an engine anything can load\n"
                             "tensorrt_llm: the engine was built with 0+standin; this host has 1.2.0\n")


def test_an_engine_its_record_marks_standin_never_fits_even_with_matching_versions(tmp_path, run, h100_host):
    result = run("check", make_engine(tmp_path / "engine", standin=True))
    assert (result.exit_code, result.stderr) == (1, "")
    assert result.stdout == ("stand-in: made by a stand-in toolchain (tensorrt_llm 1.2.0), not by TensorRT: "
                             "it is not an engine anything can load\n")


def test_json_has_the_same_exit_code_and_the_facts(tmp_path, ws, run, recorded_gpu, installed_packages):
    recorded_gpu("A100")
    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    lock = write_lock(ws, {"fp8-tp1-sm80": platform("sm80")})
    engine = make_engine(tmp_path / "engine")
    result = run("check", engine, "--lock", lock, "--json")
    assert (result.exit_code, result.stderr) == (1, "")
    out = json.loads(result.stdout)
    assert {k: out[k] for k in ("engine_dir", "fits", "standin", "differences", "lock", "instead")} == {
        "engine_dir": str(engine), "fits": False, "standin": False,
        "differences": ["sm: the engine is for sm90; this host has sm80 (1x NVIDIA A100-SXM4-80GB)"],
        "lock": str(lock), "instead": ["fp8-tp1-sm80"]}
    assert out["host"]["gpus"] == [{"index": 0, "name": "NVIDIA A100-SXM4-80GB", "sm": "sm80", "memory_bytes": 81920 * 2**20}]
    assert (out["host"]["driver"], out["host"]["cuda_driver"]) == ("535.104.05", "12.2")
    assert out["engine"]["sm"] == "sm90" and out["engine"]["quantization"] == FP8


def test_json_ok_exits_0(tmp_path, run, h100_host):
    result = run("check", make_engine(tmp_path / "engine"), "--json")
    assert (result.exit_code, json.loads(result.stdout)["fits"], json.loads(result.stdout)["differences"]) == (0, True, [])


@pytest.mark.parametrize("layout, line", [
    ("empty", "{d}/config.json: not found; {d} is not a TensorRT-LLM engine folder"),
    ("checkpoint", "{d}/config.json: not a TensorRT-LLM engine config (it needs version, pretrained_config and "
                   "build_config; a checkpoint's config.json has none of them)"),
    ("no-record", "{d}/trtbuild.json: not found; {d} is not an engine trtbuild built (trtbuild.json records its SM, "
                  "which config.json does not)"),
    ("missing-rank", "{d}/rank1.engine: not found (config.json's mapping has world_size 2)"),
    ("bad-record", "{d}/trtbuild.json: sm: String should match pattern '^sm\\d+$'"),
    ("disagreeing-record", "{d}/trtbuild.json: tp 2, but config.json's mapping says 1"),
    ("not-json", "{d}/config.json: not JSON (Expecting value: line 1 column 1 (char 0))"),
    ("bad-mapping", "{d}/config.json: pretrained_config.mapping: world_size, tp_size and pp_size must be positive "
                    "integers (found 1, '1', 1)"),
])
def test_a_folder_that_is_not_an_engine_is_one_line_and_exit_2(tmp_path, run, h100_host, layout, line):
    folder = tmp_path / "engine"
    if layout == "empty":
        folder.mkdir()
    elif layout == "checkpoint":
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"architecture": "LlamaForCausalLM", "mapping": {"world_size": 1}}))
    elif layout == "no-record":
        make_engine(folder)
        (folder / "trtbuild.json").unlink()
    elif layout == "missing-rank":
        make_engine(folder, tp=2)
        (folder / "rank1.engine").unlink()
    elif layout == "bad-record":
        make_engine(folder, sm="hopper")
    elif layout == "disagreeing-record":
        make_engine(folder)
        record = json.loads((folder / "trtbuild.json").read_text())
        (folder / "trtbuild.json").write_text(json.dumps({**record, "tp": 2}))
    elif layout == "bad-mapping":
        make_engine(folder)
        config = json.loads((folder / "config.json").read_text())
        config["pretrained_config"]["mapping"]["tp_size"] = "1"
        (folder / "config.json").write_text(json.dumps(config))
    elif layout == "not-json":
        make_engine(folder)
        (folder / "config.json").write_text("")
    result = run("check", folder)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == line.format(d=folder) + "\n"


def test_a_missing_folder_and_a_missing_lock_are_one_line_each(tmp_path, run, h100_host):
    result = run("check", tmp_path / "nothing")
    assert (result.exit_code, result.stderr) == (2, f"{tmp_path / 'nothing'}: not a folder (an engine folder holds "
                                                    "config.json and rank<N>.engine)\n")
    result = run("check", make_engine(tmp_path / "engine"), "--lock", tmp_path / "none.lock")
    assert (result.exit_code, result.stderr) == (2, f"--lock {tmp_path / 'none.lock'}: not found\n")


def test_check_never_tries_to_import_tensorrt_tensorrt_llm_or_torch(tmp_path, recorded_gpu, installed_packages):
    # A meta-path hook records every attempt, even one that would fail because nothing is installed;
    # the subprocess sees the recorded H100 and the package metadata through PYTHONPATH.
    import os
    import subprocess
    import sys

    recorded_gpu("H100")
    site = installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    engine = make_engine(tmp_path / "engine")
    script = f"""
import sys
attempted = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('tensorrt', 'tensorrt_llm', 'torch', 'transformers', 'modelopt'):
            attempted.append(name)
        return None
sys.meta_path.insert(0, Spy())
from trtbuild.cli import cli
try:
    cli(['check', {str(engine)!r}], standalone_mode=False)
except SystemExit:
    pass
print('ATTEMPTED', attempted)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ["PYTHONPATH"]])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
    assert result.stdout == (f"OK: {engine} (sm90, tp 1 x pp 1, tensorrt_llm 1.2.0, tensorrt 10.13.3.9) "
                             "fits this host (1x NVIDIA H100 80GB HBM3)\nATTEMPTED []\n")
