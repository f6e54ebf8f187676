"""`trtbuild ls`: what a store publishes, with sizes, validation numbers, toolchain and age, and
with --compatible whether each target fits this host. Hand-made records with fixed `created`
times and a fixed "now", so every line of the output is exact; a folder store and SeaweedFS."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

import summarykit
from conftest import minimal, needs_no_trtllm, key_fields
from trtbuild.deploy.select import package_words
from trtbuild.host.toolchain import package_version
from trtbuild.deploy import listing as published
from trtbuild.store.records import ActionRecord, Digest, Execution
from trtbuild.store.local import LocalStore
from trtbuild.store.transfer import PushItem, push

TRTLLM, TRT = "1.2.1", "10.13.2"

# this host's llama-cpp-python, as Host.describe ends (probed like the other packages; not faked here)
LLAMACPP = package_words("llama_cpp_python", package_version("llama_cpp"))
NOW = dt.datetime(2026, 12, 3, 12, 0, 0, tzinfo=dt.timezone.utc)
CHECKPOINT_TOOLS = {"modelopt": "0.47.0", "torch": "2.13.0", "transformers": "4.57.6"}
ENGINE_FACTS = {"schema": 1, "kind": "engine", "sm": "sm90", "tp": 1, "pp": 1, "world_size": 1, "quantization": None,
                "checkpoint": "ab" * 32, "toolchain": {"tensorrt_llm": TRTLLM, "tensorrt": TRT, "image": None},
                "standin": False, "command": ["trtllm-build"], "memory": {"engine_bytes_per_rank": 4096}}


def validation_summary(kl: float, top1: float, ppl: float, passed: bool = True, runner: str = "torch",
                       device: str = "cpu") -> dict:
    return summarykit.validation_summary(kl, top1, ppl, kld_p99=kl * 10, runner=runner, device=device,
                                         gates={"kld_mean": {"value": kl, "limit": 0.05, "passed": passed}})


def serving_summary(serves: dict[str, list[str]]) -> dict:
    """An hf-checkpoint's package summary (its export wrote no report) serving `serves`."""
    return {"serving": {"files": ["serving/README.md"], "runtimes": dict.fromkeys(serves, "1.0"),
                        "check": dict.fromkeys(serves, True), "serves": serves}}


class Published:
    """A store with artifacts, their action records and refs, written as a build (or a push) leaves them."""

    def __init__(self, store, tmp_path: Path) -> None:
        self.store, self.tmp, self.n = store, tmp_path, 0
        self.records: dict[str, ActionRecord] = {}

    def add(self, target: str, stage: str, created: str, size: int, toolchain=None, summary=None, fields=None,
            recipe: str = "tiny") -> ActionRecord:
        self.n += 1
        folder = self.tmp / "art" / f"{recipe}-{target.replace(':', '_')}"
        folder.mkdir(parents=True)
        (folder / "data.bin").write_bytes(target.encode().ljust(size, b"."))
        manifest = self.store.ingest(folder)
        record = ActionRecord(key=f"{self.n:064x}", artifact=Digest(hash=manifest.digest, size_bytes=manifest.size),
                              stage=stage, stage_version=1, target=target, recipe=recipe, created=created,
                              toolchain=toolchain or {}, summary=summary or {}, fields=key_fields(**(fields or {})),
                              execution=Execution(seconds=1.0, host="builder"))
        self.store.put_record(record)
        self.store.update_ref(recipe, target, record.digest, record.key)
        self.records[f"{recipe}/{target}"] = record
        return record

    def typical(self) -> None:
        """A checkpoint and its engine, both validated; a stand-in hf-checkpoint validated on torch and on
        vLLM; another recipe's checkpoint."""
        self.add("base-tp1", "checkpoint:export", "2026-12-01T12:00:00Z", 3 * 1024 * 1024, CHECKPOINT_TOOLS)
        self.add("base-tp1:validate", "validate", "2026-12-01T12:30:00Z", 2048, CHECKPOINT_TOOLS,
                 validation_summary(0.00123456, 0.98514, 0.4213))
        self.add("base-tp1-sm90", "engine", "2026-12-03T09:15:00Z", 5 * 1024 * 1024, {"tensorrt_llm": TRTLLM, "tensorrt": TRT},
                 ENGINE_FACTS)
        self.add("base-tp1-sm90:validate", "validate", "2026-12-03T09:20:00Z", 2048, {"tensorrt_llm": TRTLLM},
                 validation_summary(0.0021, 0.97, -0.05, runner=f"tensorrt_llm {TRTLLM}", device="cuda:0"))
        self.add("fp8-hf", "hf-checkpoint:package", "2026-12-03T11:59:30Z", 1536, {"modelopt": "0.47.0+standin"},
                 serving_summary({"trtllm": ["sm89", "sm90"], "vllm": ["sm89", "sm90"]}),
                 fields={"params": {"quant": "fp8", "kv_cache": None}})
        self.add("fp8-hf:validate", "validate", "2026-12-03T11:59:40Z", 2048, CHECKPOINT_TOOLS,
                 validation_summary(0.0025, 0.975, 0.3))
        self.add("fp8-hf:validate-vllm", "validate:vllm", "2026-12-03T11:59:50Z", 2048, {"vllm": "0.26.0"},
                 validation_summary(0.0042, 0.9612, 0.51, runner="vllm 0.26.0", device="cuda:0"))
        self.add("base-tp1", "checkpoint:export", "2026-11-20T12:00:00Z", 4096, CHECKPOINT_TOOLS, recipe="other")


@pytest.fixture
def fixed_now(monkeypatch):
    monkeypatch.setattr(published, "utc_now", lambda: NOW)


@pytest.fixture
def folder_store(tmp_path):
    store = LocalStore(tmp_path / "shared")
    store.create()
    return store


TABLE = [  # the figures that decide, and who measured them: vLLM's before torch's for fp8-hf
    "RECIPE  TARGET         STAGE          SIZE     KL        TOP-1  PPL     MEASURED BY                   AGE  SERVES                                 TOOLCHAIN",
    "other   base-tp1       checkpoint     4.0 KiB  -         -      -       -                             13d  -                                      modelopt 0.47.0, torch 2.13.0, transformers 4.57.6",
    "tiny    base-tp1       checkpoint     3.0 MiB  0.001235  98.5%  +0.42%  torch on cpu                  2d   -                                      modelopt 0.47.0, torch 2.13.0, transformers 4.57.6",
    "tiny    base-tp1-sm90  engine         5.0 MiB  0.0021    97.0%  -0.05%  tensorrt_llm 1.2.1 on cuda:0  2h   sm90                                   tensorrt 10.13.2, tensorrt_llm 1.2.1",
    "tiny    fp8-hf         hf-checkpoint  1.5 KiB  0.0042    96.1%  +0.51%  vllm 0.26.0 on cuda:0         30s  trtllm>=1.3 sm89 sm90; vllm sm89 sm90  STAND-IN modelopt 0.47.0+standin",
]


def test_ls_lists_every_published_target_with_size_validation_numbers_age_and_toolchain(folder_store, tmp_path, run,
                                                                                        fixed_now):
    Published(folder_store, tmp_path).typical()
    result = run("ls", "--store", folder_store.root)
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == "\n".join(TABLE) + "\n"


def test_ls_recipe_shows_only_that_recipes_targets(folder_store, tmp_path, ws, run, fixed_now):
    Published(folder_store, tmp_path).typical()
    result = run("ls", ws.recipe(minimal()), "--store", folder_store.root)
    assert (result.exit_code, result.stderr) == (0, "")
    tiny = [TABLE[0]] + [line for line in TABLE[1:] if line.startswith("tiny")]
    assert result.stdout == "\n".join(tiny) + "\n"  # the other recipe's row was no wider in any column


def test_ls_compatible_marks_what_fits_a_recorded_h100_and_says_why_the_rest_does_not(
        folder_store, tmp_path, run, fixed_now, recorded_gpu, installed_packages):
    Published(folder_store, tmp_path).typical()
    recorded_gpu("H100")
    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    result = run("ls", "--store", folder_store.root, "--compatible")
    assert (result.exit_code, result.stderr) == (0, "")
    checkpoint = "no: a TensorRT-LLM checkpoint: no runtime serves it as it is (the engines built from it do)"
    wide = len(TABLE[1])  # the toolchain column is as wide as the checkpoints' versions; FITS comes after it
    expected = [
        f"host: 1x NVIDIA H100 80GB HBM3 (sm90, 79.6 GiB), tensorrt_llm {TRTLLM}, tensorrt {TRT}, no vllm, no sglang, {LLAMACPP}",
        TABLE[0].ljust(wide) + "  FITS",
        TABLE[1] + "  " + checkpoint,
        TABLE[2] + "  " + checkpoint,
        TABLE[3].ljust(wide) + "  yes (trtllm-engine, 1 GPU)",
        TABLE[4].ljust(wide) + "  no: made by a stand-in toolchain (modelopt): never for real use; trtllm: 1.2.1 is "
        "installed; its PyTorch backend serves hf-checkpoints from 1.3 on; vllm: not installed; sglang: not installed",
    ]
    assert result.stdout == "\n".join(expected) + "\n"


def test_ls_compatible_on_an_l40s_says_the_engine_is_for_another_sm(folder_store, tmp_path, run, fixed_now,
                                                                    recorded_gpu, installed_packages):
    Published(folder_store, tmp_path).typical()
    recorded_gpu("L40S")
    installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    result = run("ls", "--store", folder_store.root, "--compatible", "--json")
    assert result.exit_code == 0
    fits = {(p["recipe"], p["target"]): (p["fits"], p["reasons"]) for p in json.loads(result.stdout)["published"]}
    assert fits[("tiny", "base-tp1-sm90")] == (False, ["sm: the engine is for sm90; this host has sm89 (1x NVIDIA L40S)"])


def test_ls_json_gives_every_field_of_every_target(folder_store, tmp_path, run, fixed_now):
    made = Published(folder_store, tmp_path)
    made.typical()
    result = run("ls", "--store", folder_store.root, "--json")
    assert (result.exit_code, result.stderr) == (0, "")
    data = json.loads(result.stdout)
    assert (data["store"], data["recipe"], data["host"]) == (str(folder_store.root), None, None)
    assert [(p["recipe"], p["target"]) for p in data["published"]] == [
        ("other", "base-tp1"), ("tiny", "base-tp1"), ("tiny", "base-tp1-sm90"), ("tiny", "fp8-hf")]
    engine = data["published"][2]
    record = made.records["tiny/base-tp1-sm90"]
    assert engine == {
        "recipe": "tiny", "target": "base-tp1-sm90", "stage": "engine", "digest": record.digest, "key": record.key,
        "size_bytes": 5 * 1024 * 1024, "created": "2026-12-03T09:15:00Z", "age_seconds": 2 * 3600 + 45 * 60,
        "toolchain": {"tensorrt": TRT, "tensorrt_llm": TRTLLM}, "standin": [], "serves": {"trtllm-engine": ["sm90"]},
        "validations": [  # its own validation first, then its checkpoint's
            {"id": "base-tp1-sm90:validate", "kld_mean": 0.0021, "top1_agreement": 0.97, "ppl_delta_pct": -0.05,
             "gates_passed": True, "runner": "tensorrt_llm 1.2.1", "device": "cuda:0"},
            {"id": "base-tp1:validate", "kld_mean": 0.00123456, "top1_agreement": 0.98514, "ppl_delta_pct": 0.4213,
             "gates_passed": True, "runner": "torch", "device": "cpu"}],
        "fits": None, "runtime": None, "world_size": None, "reasons": [], "measurements": []}
    assert data["published"][3]["standin"] == ["modelopt"]
    assert data["published"][3]["validations"] == [  # vLLM's figures decide before torch's
        {"id": "fp8-hf:validate-vllm", "kld_mean": 0.0042, "top1_agreement": 0.9612, "ppl_delta_pct": 0.51,
         "gates_passed": True, "runner": "vllm 0.26.0", "device": "cuda:0"},
        {"id": "fp8-hf:validate", "kld_mean": 0.0025, "top1_agreement": 0.975, "ppl_delta_pct": 0.3,
         "gates_passed": True, "runner": "torch", "device": "cpu"}]


def test_ls_names_who_measured_an_engines_checkpoints_figures_and_never_fits_what_a_standin_measured(
        folder_store, tmp_path, run, fixed_now, recorded_gpu, installed_packages):
    made = Published(folder_store, tmp_path)
    made.add("base-tp1", "checkpoint:export", "2026-12-01T12:00:00Z", 2048, CHECKPOINT_TOOLS)
    made.add("base-tp1:validate", "validate", "2026-12-01T12:30:00Z", 2048, CHECKPOINT_TOOLS,
             validation_summary(0.001, 0.99, 0.1))
    made.add("base-tp1-sm90", "engine", "2026-12-03T09:15:00Z", 4096, {"tensorrt_llm": TRTLLM, "tensorrt": TRT},
             ENGINE_FACTS)  # not validated itself (validate.engines: none)
    made.add("fp8-hf", "hf-checkpoint:package", "2026-12-03T11:00:00Z", 2048, CHECKPOINT_TOOLS,
             serving_summary({"vllm": ["sm90"]}), fields={"params": {"quant": "fp8", "kv_cache": None}})
    made.add("fp8-hf:validate", "validate", "2026-12-03T11:10:00Z", 2048, CHECKPOINT_TOOLS,
             validation_summary(0.002, 0.98, 0.2))
    made.add("fp8-hf:validate-vllm", "validate:vllm", "2026-12-03T11:20:00Z", 2048, {"vllm": "0.33.0+standin"},
             validation_summary(0.003, 0.97, 0.3, runner="vllm 0.33.0+standin"))
    result = run("ls", "--store", folder_store.root)
    assert (result.exit_code, result.stderr) == (0, "")
    assert [line.split("  ")[0:1] + [cell for cell in line.split("  ") if " on " in cell]
            for line in result.stdout.splitlines()[1:]] == [
        ["tiny", "torch on cpu"], ["tiny", "torch on cpu (of base-tp1)"], ["tiny", "vllm 0.33.0+standin on cpu"]]
    recorded_gpu("H100")
    installed_packages(vllm="0.33.0")
    judged = json.loads(run("ls", "--store", folder_store.root, "--compatible", "--json").stdout)["published"]
    hf = judged[2]
    assert (hf["target"], hf["standin"], hf["fits"], hf["runtime"], hf["reasons"]) == (
        "fp8-hf", [], False, None,
        ["validated by a stand-in (fp8-hf:validate-vllm: vllm): never for real use"])


def test_ls_of_a_store_with_nothing_published_says_so(folder_store, ws, run):
    result = run("ls", "--store", folder_store.root)
    assert (result.exit_code, result.stdout, result.stderr) == (0, f"nothing is published in {folder_store.root}\n", "")
    of_recipe = run("ls", ws.recipe(minimal()), "--store", folder_store.root)
    assert (of_recipe.exit_code, of_recipe.stdout) == (0, f"nothing of recipe tiny is published in {folder_store.root}\n")


def test_ls_refuses_a_missing_store_and_a_bad_recipe_with_one_line_and_exit_2(folder_store, tmp_path, ws, run):
    missing = run("ls", "--store", tmp_path / "nowhere")
    assert (missing.exit_code, missing.stdout, missing.stderr) == (
        2, "", f"store {tmp_path / 'nowhere'}: no such store (nothing has been built there)\n")
    bad = ws.recipe(minimal().replace("name: tiny", "name: Bad Name"), name="bad.yaml")
    refused = run("ls", bad, "--store", folder_store.root)
    assert (refused.exit_code, refused.stdout, refused.stderr) == (
        2, "", f"{bad}:2:7: name: 'Bad Name' does not match ^[a-z0-9][a-z0-9._-]*$\n")
    nostore = run("ls")
    assert (nostore.exit_code, nostore.stderr) == (
        2, "ls: no store to list: pass --store URL (or a RECIPE whose `publish.store` names one)\n")


@pytest.fixture(scope="module")
def seaweed():
    from s3server import SeaweedS3

    with SeaweedS3() as server:
        yield server


def test_ls_lists_what_was_pushed_to_seaweedfs(seaweed, tmp_path, run, fixed_now, monkeypatch):
    """The CI job pushes; anyone with the bucket's credentials sees the same table the folder store gives."""
    from trtbuild.store.s3 import S3Store

    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    seaweed.client().create_bucket(Bucket="listing")
    url = "s3://listing/team"
    local = LocalStore(tmp_path / "local")
    local.create()
    made = Published(local, tmp_path)
    made.typical()
    remote = S3Store(url)
    for name, record in made.records.items():
        push(local, remote, [PushItem(record, tuple(name.split("/", 1)))])
    result = run("ls", "--store", url)
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == "\n".join(TABLE) + "\n"
    empty = run("ls", "--store", "s3://listing/nothing-here")
    assert (empty.exit_code, empty.stdout, empty.stderr) == (
        2, "", "store s3://listing/nothing-here: not a trtbuild store (nothing has been pushed there)\n")
    no_bucket = run("ls", "--store", "s3://no-such-bucket/team")
    assert (no_bucket.exit_code, no_bucket.stdout, no_bucket.stderr) == (
        2, "", "s3://no-such-bucket/team/: bucket no-such-bucket does not exist\n")


@needs_no_trtllm  # the int4 checkpoint's reasons say tensorrt_llm is not installed
def test_ls_compatible_reads_an_hf_checkpoints_format_from_its_record(folder_store, tmp_path, run, fixed_now,
                                                                      recorded_gpu, installed_packages):
    made = Published(folder_store, tmp_path)
    made.add("fp8-hf", "hf-checkpoint:export", "2026-12-03T11:00:00Z", 2048, CHECKPOINT_TOOLS,
             fields={"params": {"quant": "fp8", "kv_cache": None}})
    made.add("int4-hf", "hf-checkpoint:export", "2026-12-03T11:00:00Z", 2048, CHECKPOINT_TOOLS,
             fields={"params": {"quant": "int4_awq", "kv_cache": None}})
    made.add("fp8-standin-hf", "hf-checkpoint:export", "2026-12-03T11:00:00Z", 2048, {"modelopt": "0.47.0+standin"},
             fields={"params": {"quant": "fp8", "kv_cache": None}})
    recorded_gpu("H100")
    installed_packages(vllm="0.33.0")
    result = run("ls", "--store", folder_store.root, "--compatible", "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["host"]["vllm"] == "0.33.0"
    assert [(p["target"], p["fits"], p["runtime"], p["world_size"], p["reasons"]) for p in data["published"]] == [
        ("fp8-hf", True, "vllm", 1, []),
        ("fp8-standin-hf", False, None, None, ["made by a stand-in toolchain (modelopt): never for real use"]),
        ("int4-hf", False, None, None, ["trtllm: not installed", "vllm: does not serve int4_awq on sm90", "sglang: not installed"])]


def test_ls_names_a_ref_whose_action_record_is_gone(folder_store, tmp_path, run, fixed_now, recorded_gpu):
    made = Published(folder_store, tmp_path)
    record = made.add("base-tp1", "checkpoint:export", "2026-12-01T12:00:00Z", 2048, CHECKPOINT_TOOLS)
    source = made.add("source", "source:path", "2026-12-01T11:00:00Z", 2048)  # not a target: not listed
    folder_store.delete_record(record.key)
    folder_store.delete_record(source.key)
    result = run("ls", "--store", folder_store.root)
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == ("RECIPE  TARGET    STAGE  SIZE     KL  TOP-1  PPL  MEASURED BY  AGE  SERVES  TOOLCHAIN\n"
                             "tiny    base-tp1  ?      2.0 KiB  -   -      -    -            -    -       -\n")
    recorded_gpu(None)
    judged = json.loads(run("ls", "--store", folder_store.root, "--compatible", "--json").stdout)["published"]
    assert [(p["stage"], p["fits"], p["reasons"]) for p in judged] == [
        (None, False, ["record: the store has no action record of this artifact"])]


def test_ls_help_describes_the_shared_store_it_lists_not_the_local_store(run):
    """Issue #23: `ls --help` spoke of the local store ($TRTBUILD_CACHE) and of lock files, though ls
    lists --store or the recipe's publish.store and takes no lock."""
    from trtbuild.cli.deploy import ls

    store = next(p for p in ls.params if p.name == "store_url")
    assert " ".join(store.help.split()) == (
        "The shared store to list: a folder or s3://bucket/prefix (AWS_ENDPOINT_URL for another S3-compatible "
        "server; the standard AWS credentials); default: RECIPE's publish.store. ls never falls back to the "
        "local build store ($TRTBUILD_CACHE); to list what builds there published, pass it as --store.")
    shown = " ".join(run("ls", "--help").stdout.split())
    assert "lock file" not in shown and "The local store is" not in shown
    assert shown.startswith("Usage: cli ls [OPTIONS] [RECIPE] List what the shared store --store (default: "
                            "RECIPE's publish.store) publishes")
