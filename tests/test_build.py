"""`trtbuild build`, `explain` and `cache` as a user runs them, on a real model folder."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import NEMO_DATA, needs_no_gpu, needs_no_gpu_with_trtllm, needs_no_trtllm

TINY_HF = NEMO_DATA / "hf_tiny_llama_tied_bf16"


@pytest.fixture
def model(tmp_path) -> Path:
    """A real Hugging Face model folder (plus files a model does not need, which must be left out)."""
    folder = tmp_path / "model"
    shutil.copytree(TINY_HF, folder)
    for path in folder.iterdir():
        path.chmod(0o644)
    (folder / "README.md").write_text("not part of the model")
    (folder / "pytorch_model.bin").write_bytes(b"a duplicate in another format")
    (folder / "original").mkdir()
    (folder / "original" / "consolidated.pth").write_bytes(b"another format")
    return folder


@pytest.fixture
def recipe(tmp_path, model) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text("""
schema: 1
name: tiny
source: {path: model}
variants: {bf16: {}, fp8: {quant: fp8}}
calibration: {samples: 4, seq_len: 32}
gpus: [sm90]
limits: {max_input_len: 128, max_seq_len: 256}
backends: [engine, hf-checkpoint]
""")
    return path


def trtbuild(*args, store: Path, cwd: Path | None = None, check: bool = False):
    env = {**os.environ, "TRTBUILD_CACHE": str(store)}
    result = subprocess.run([sys.executable, "-m", "trtbuild", *map(str, args)], capture_output=True, text=True,
                            env=env, cwd=cwd, timeout=600)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def build_json(recipe: Path, store: Path, *args) -> dict:
    result = trtbuild("build", recipe, "--json", *args, store=store)
    assert result.returncode in (0, 1), result.stderr
    data = json.loads(result.stdout)
    data["_rc"] = result.returncode
    return data


def by_name(data: dict) -> dict[str, dict]:
    return {t["name"]: t for t in data["targets"]}


@needs_no_gpu_with_trtllm
def test_build_twice_the_second_builds_nothing_and_says_so(recipe, tmp_path):
    store = tmp_path / "store"
    first = trtbuild("build", recipe, store=store, check=True)
    # source, calibration, fp8-quantized, two checkpoints, two HF checkpoints (each an export and its
    # package), the reference and
    # three validations (fp8's checkpoint and HF checkpoint share one key: the second is cached);
    # skipped here: 2 engines, their 2 validation twins and 2 validations, and the 2 HF checkpoints'
    # TensorRT-LLM validations
    assert "tiny: 13 built, 10 skipped, 1 cached" in first.stdout
    second = trtbuild("build", recipe, store=store, check=True)
    assert "Nothing was built: every buildable artifact was already in the store." in second.stdout
    assert "tiny: 14 cached, 10 skipped" in second.stdout


def test_json_summary_statuses_and_read_only_paths(recipe, model, tmp_path):
    store = tmp_path / "store"
    data = build_json(recipe, store, "--until", "source")
    assert data["recipe"] == "tiny" and data["_rc"] == 0
    targets = by_name(data)
    source = targets["source"]
    assert (source["stage"], source["status"]) == ("source", "built")
    assert len(source["key"]) == 64 and len(source["digest"]) == 64
    folder = Path(source["path"])
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    expected = sorted(p.name for p in model.iterdir() if p.is_file() and p.name not in ("README.md", "pytorch_model.bin"))
    assert names == expected  # config, tokenizer, safetensors; no README, no .bin duplicate, no original/
    assert (folder / "config.json").read_bytes() == (model / "config.json").read_bytes()
    assert (folder / "config.json").stat().st_mode & 0o222 == 0
    ckpt = targets["bf16-tp1"]
    assert (ckpt["stage"], ckpt["status"], ckpt["reason"]) == ("checkpoint", "skipped", "after --until source")
    engine = targets["bf16-tp1-sm90"]
    assert (engine["stage"], engine["status"]) == ("engine", "skipped")
    assert engine["reason"] == "after --until source"
    assert set(source) == {"name", "stage", "status", "key", "digest", "size", "seconds", "reason", "path", "ref",
                           "decided_by", "standin", "origin", "pulled", "note"}


@needs_no_gpu
@needs_no_trtllm
def test_engines_need_a_gpu_and_require_all_makes_skips_failures(recipe, tmp_path):
    data = build_json(recipe, tmp_path / "store", "--target", "bf16-*", "--no-validate")
    engine = by_name(data)["bf16-tp1-sm90"]
    assert by_name(data)["bf16-tp1"]["status"] == "built"
    assert engine["status"] == "skipped"
    assert engine["reason"] == "needs sm90 GPU with tensorrt_llm 1.2.x (this machine: no GPU, no tensorrt_llm)"  # the SM and toolchain it needs
    assert data["_rc"] == 0

    data = build_json(recipe, tmp_path / "store", "--target", "bf16-*", "--require-all", "--no-validate")
    assert data["_rc"] == 1
    assert by_name(data)["bf16-tp1-sm90"]["status"] == "failed"
    assert by_name(data)["bf16-tp1"]["status"] == "cached"


def test_a_build_that_finds_everything_stored_writes_nothing(recipe, tmp_path):
    """The lock file, the refs and the recipe's claim are left as they are, and none of their locks
    is taken (issue #15: a no-op build's start-up)."""
    store = tmp_path / "store"
    trtbuild("build", recipe, "--until", "source", store=store, check=True)
    written = [recipe.with_suffix(".lock"), *(p for p in (store / "refs").rglob("*") if p.is_file())]
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in written}
    for lock in (store / "locks").iterdir():
        lock.unlink()
    second = trtbuild("build", recipe, "--until", "source", store=store, check=True)
    assert "Nothing was built: every buildable artifact was already in the store." in second.stdout
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in written} == before
    assert [p.name for p in (store / "locks").iterdir()] == ["store.lock"]  # the store's own, shared


def test_a_changed_source_file_rebuilds_and_rewrites_the_lock(recipe, model, tmp_path):
    store = tmp_path / "store"
    first = by_name(build_json(recipe, store, "--until", "source"))["source"]
    lock = yaml.safe_load(recipe.with_suffix(".lock").read_text())
    assert lock["source"]["digest"] == first["digest"] and lock["source"]["location"] == "model"
    assert lock["targets"]["source"] == {"stage": "source", "key": first["key"], "digest": first["digest"],
                                         "size": first["size"]}
    assert set(lock["source"]["files"]) >= {"config.json", "model.safetensors"}

    config = json.loads((model / "config.json").read_text())
    config["rms_norm_eps"] = 1e-6
    (model / "config.json").write_text(json.dumps(config))
    second = by_name(build_json(recipe, store, "--until", "source"))["source"]
    assert second["status"] == "built" and second["digest"] != first["digest"]
    assert yaml.safe_load(recipe.with_suffix(".lock").read_text())["source"]["digest"] == second["digest"]
    # a file the model does not need changes nothing
    (model / "README.md").write_text("edited")
    assert by_name(build_json(recipe, store, "--until", "source"))["source"]["status"] == "cached"


def test_locked_builds_refuse_a_changed_recipe_or_source(recipe, model, tmp_path):
    store = tmp_path / "store"
    lock = recipe.with_suffix(".lock")
    result = trtbuild("build", recipe, "--locked", store=store)
    assert result.returncode == 2
    assert result.stderr.strip() == f"--locked: {lock}: no lock file; run `trtbuild build` without --locked to write it"
    trtbuild("build", recipe, "--until", "source", store=store, check=True)
    pinned = yaml.safe_load(lock.read_text())["source"]["digest"][:16]
    trtbuild("build", recipe, "--until", "source", "--locked", store=store, check=True)

    (model / "model.safetensors").write_bytes(b"other weights")
    result = trtbuild("build", recipe, "--until", "source", "--locked", store=store)
    assert result.returncode == 2
    assert re.fullmatch(rf"--locked: the source resolves to (?!{pinned})[0-9a-f]{{16}}\.\.\., but {re.escape(str(lock))} "
                        rf"pins {pinned}\.\.\.; rebuild without --locked", result.stderr.strip()), result.stderr

    recorded = yaml.safe_load(lock.read_text())["recipe"]["digest"]
    recipe.write_text(recipe.read_text().replace("max_seq_len: 256", "max_seq_len: 200"))
    result = trtbuild("build", recipe, "--locked", store=store)
    assert result.returncode == 2  # both digests named: the recipe's and the one the lock records (tests/test_locked.py)
    assert re.fullmatch(rf"--locked: {re.escape(str(lock))} records recipe digest {recorded}; the recipe "
                        rf"{re.escape(str(recipe))} is (?!{recorded})[0-9a-f]{{64}}; rebuild without --locked and "
                        "commit the new lock", result.stderr.strip()), result.stderr


def test_lock_files_hold_no_secrets(recipe, tmp_path):
    store = tmp_path / "store"
    env_secret = "hf_SECRET_TOKEN_VALUE"
    result = subprocess.run([sys.executable, "-m", "trtbuild", "build", str(recipe), "--until", "source"],
                            capture_output=True, text=True,
                            env={**os.environ, "TRTBUILD_CACHE": str(store), "HF_TOKEN": env_secret,
                                 "AWS_SECRET_ACCESS_KEY": env_secret})
    assert result.returncode == 0
    for path in [recipe.with_suffix(".lock"), *store.rglob("*.json")]:
        if path.is_file():
            assert env_secret not in path.read_text(errors="replace")


def test_until_and_target_globs(recipe, tmp_path):
    store = tmp_path / "store"
    data = build_json(recipe, store, "--until", "source")
    assert by_name(data)["bf16-tp1"]["reason"] == "after --until source"
    data = build_json(recipe, store, "--target", "fp8-*", "--until", "source")
    assert set(by_name(data)) == {"source", "calibration", "fp8-quantized", "fp8-tp1", "fp8-tp1-sm90", "fp8-hf-export", "fp8-hf",
                                  "reference", "fp8-tp1:validate", "fp8-hf:validate", "fp8-tp1-sm90:twin",
                                  "fp8-tp1-sm90:validate", "fp8-hf:validate-trtllm", "fp8-hf:validate-vllm"}
    result = trtbuild("build", recipe, "--until", "publishing", store=store)
    assert result.returncode == 2
    assert re.fullmatch(r"--until publishing: not a stage \(source(, [a-z-]+)+\)", result.stderr.strip()), result.stderr


def test_four_concurrent_builds_on_one_store_build_each_key_once(recipe, tmp_path):
    store = tmp_path / "store"
    env = {**os.environ, "TRTBUILD_CACHE": str(store)}
    procs = [subprocess.Popen([sys.executable, "-m", "trtbuild", "build", str(recipe), "--json", "--no-validate"],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(4)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outputs]
    runs = [by_name(json.loads(out)) for out, _ in outputs]
    for name in ("source", "calibration", "fp8-quantized", "bf16-tp1", "fp8-tp1", "bf16-hf", "fp8-hf"):
        assert sorted(r[name]["status"] for r in runs) == ["built", "cached", "cached", "cached"], name
        assert len({r[name]["digest"] for r in runs}) == 1, name
    assert trtbuild("cache", "verify", store=store).returncode == 0


def test_explain_shows_every_field_and_its_origin(recipe, model, tmp_path):
    from trtbuild.host import hardware

    store = tmp_path / "store"
    before = trtbuild("explain", recipe, "fp8-tp1", "--json", store=store, check=True)
    [source, calibration, quantized, ckpt] = json.loads(before.stdout)
    assert source["in_store"] is False and len(source["key"]) == 64
    fields = {f["field"]: f for f in source["fields"]}
    assert fields["inputs.tree"]["origin"] == f"hashed {model}"
    assert fields["source.files.config.json"]["origin"] == f"hashed {model}"
    assert fields["params.kind"] == {"field": "params.kind", "value": "path", "origin": "recipe: source.path"}
    assert calibration["note"] == "key unknown until source is in the store"
    assert ckpt["note"] == "key unknown until source, fp8-quantized is in the store"

    trtbuild("build", recipe, "--no-validate", store=store, check=True)
    after = {e["name"]: e for e in json.loads(trtbuild("explain", recipe, "fp8-tp1", "--json", store=store, check=True).stdout)}
    assert all(e["in_store"] for e in after.values())
    fields = {f["field"]: f for f in after["calibration"]["fields"]}
    assert fields["inputs.text"]["origin"].startswith("sha256 of the text (builtin)")
    assert fields["params.samples"] == {"field": "params.samples", "value": 4, "origin": "recipe: calibration.samples"}
    assert fields["params.seed"] == {"field": "params.seed", "value": 0, "origin": "default: calibration.seed"}
    fields = {f["field"]: f for f in after["fp8-quantized"]["fields"]}
    assert fields["params.quant"]["origin"] == "recipe: variants.fp8.quant"
    here = hardware.resolve_device("auto")
    assert fields["platform.device"] == {"field": "platform.device", "value": here, "origin":
                                         f"default: calibration.device (auto, resolved on this host to {here})"}
    assert fields["toolchain.modelopt"]["value"] == "0.47.0"
    lock = yaml.safe_load(recipe.with_suffix(".lock").read_text())  # the toolchain per stage id, not per name
    assert lock["toolchain"]["checkpoint:export"]["modelopt"] == "0.47.0"
    assert set(lock["toolchain"]["checkpoint:convert"]) == {"safetensors"}
    assert fields["inputs.calibration"]["value"] == after["calibration"]["digest"]
    fields = {f["field"]: f for f in after["fp8-tp1"]["fields"]}
    assert fields["params.tp"] == {"field": "params.tp", "value": 1, "origin": "recipe: parallelism"}

    after = json.loads(trtbuild("explain", recipe, "source", "--json", store=store, check=True).stdout)
    assert after[0]["in_store"] is True and after[0]["key"] == source["key"]
    assert after[0]["fields"][2]["origin"] == f"hashed {model} (matches the lock file)"
    text = trtbuild("explain", recipe, "source", store=store, check=True).stdout
    assert "in store" in text and "inputs.tree" in text and "stage_version" in text
    missing = trtbuild("explain", recipe, "nope", store=store)
    assert missing.returncode == 2
    assert re.fullmatch(r"nope: not a target of tiny \(source(, [\w:.-]+)+\)\n", missing.stderr), missing.stderr


def test_explain_and_the_runner_label_every_platform_field_by_the_recipe_field_it_comes_from(recipe, tmp_path):
    """One function keys a node for both: a validation's device comes from validate.device."""
    from trtbuild.host import hardware
    from trtbuild.builder import nodekeys
    from trtbuild.builder.graph import build_graph
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe
    from trtbuild.store.local import LocalStore

    graph = build_graph(plan_recipe(load_recipe(recipe)))
    store = LocalStore(tmp_path / "store")
    here = hardware.resolve_device("auto")
    origins = {}
    for node_id in ("fp8-quantized", "fp8-tp1:validate", "reference"):
        node = graph.node(node_id)
        keyed = nodekeys.key_node(node, dict.fromkeys(node.inputs, "0" * 64), store)
        origins[node_id] = {k: v for k, v in keyed.origins.items() if k.startswith("platform.")}
    assert origins == {
        "fp8-quantized": {"platform.device": f"default: calibration.device (auto, resolved on this host to {here})"},
        "fp8-tp1:validate": {"platform.device": f"default: validate.device (auto, resolved on this host to {here})"},
        "reference": {"platform.device": f"default: validate.device (auto, resolved on this host to {here})"}}
    assert graph.node("fp8-tp1-sm90").platform["sm"].origin == "target: the engine's GPU architecture"
    assert not store.root.exists()  # keying reads nothing from a store it need not open


def test_a_second_recipe_with_the_same_name_is_refused_before_it_builds(recipe, tmp_path):
    store = tmp_path / "store"
    trtbuild("build", recipe, "--until", "source", store=store, check=True)
    copy = tmp_path / "copy" / "tiny.yaml"
    copy.parent.mkdir()
    copy.write_text(recipe.read_text().replace("path: model", f"path: {recipe.parent / 'model'}"))
    result = trtbuild("build", copy, "--until", "source", "--json", store=store)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"recipe {copy.resolve()}: name 'tiny' already belongs to {recipe.resolve()} in store "
                             f"{store}; give this recipe another `name:` (or remove {store / 'refs' / 'tiny' / '.recipe.json'} to "
                             "hand the name over)\n")
    assert not copy.with_suffix(".lock").exists()


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_a_deleted_blob_is_rebuilt_with_and_without_json(recipe, tmp_path, as_json):
    """--json changes the output, never the outcome: the damaged source is rebuilt either way."""
    from trtbuild.store.local import LocalStore

    store = tmp_path / "store"
    first = by_name(build_json(recipe, store, "--until", "source"))["source"]
    local = LocalStore(store)
    blob = local.blob_path(local.get_manifest(first["digest"]).entries[0].sha256)
    blob.unlink()
    result = trtbuild("build", recipe, "--until", "source", *(["--json"] if as_json else []), store=store)
    assert result.returncode == 0, result.stderr
    if as_json:
        again = by_name(json.loads(result.stdout))["source"]
        assert (again["status"], again["digest"]) == ("built", first["digest"])
    else:
        assert re.search(r"^ *built source \(source, [0-9.]+s\) " + first["digest"][:12] + "$", result.stderr, re.M)
    assert blob.exists() and trtbuild("cache", "verify", store=store).returncode == 0


def test_cache_ls_verify_gc(recipe, model, tmp_path):
    store = tmp_path / "store"
    trtbuild("build", recipe, "--until", "source", store=store, check=True)
    listing = json.loads(trtbuild("cache", "ls", "--json", store=store, check=True).stdout)
    assert [(r["recipe"], r["target"], r["stage"]) for r in listing] == [("tiny", "source", "source:path")]
    assert "tiny" in trtbuild("cache", "ls", store=store, check=True).stdout

    ok = trtbuild("cache", "verify", store=store)
    assert ok.returncode == 0 and "checks out" in ok.stdout

    # a second version of the source: the old one is history, kept until --keep-last 1
    (model / "config.json").write_text((model / "config.json").read_text().replace("}", ', "x": 1}', 1))
    trtbuild("build", recipe, "--until", "source", store=store, check=True)
    assert len(json.loads(trtbuild("cache", "ls", "--json", store=store).stdout)) == 2
    report = json.loads(trtbuild("cache", "gc", "--json", store=store, check=True).stdout)
    assert report["records"] == []  # the lock file pins the current one, the ref's history the old one
    report = json.loads(trtbuild("cache", "gc", "--keep-last", "1", "--json", store=store, check=True).stdout)
    assert len(report["records"]) == 1 and report["blobs"] == 1  # only config.json changed
    assert trtbuild("cache", "verify", store=store).returncode == 0
    after_gc = by_name(build_json(recipe, store, "--until", "source"))
    assert after_gc["source"]["status"] == "cached"  # gc kept what the lock pins

    blob = next(p for p in (store / "cas").rglob("*") if p.is_file() and p.stat().st_size > 1000)
    blob.chmod(0o644)
    blob.write_bytes(b"X" + blob.read_bytes()[1:])
    bad = trtbuild("cache", "verify", store=store)
    assert bad.returncode == 1 and f"{blob}: corrupt blob" in bad.stderr
    # never served as cached: the corrupt artifact is built again from the source, and replaced
    rebuilt = trtbuild("build", recipe, "--until", "source", "--json", store=store)
    assert rebuilt.returncode == 0, rebuilt.stderr
    source = by_name(json.loads(rebuilt.stdout))["source"]
    assert (source["status"], source["digest"]) == ("built", after_gc["source"]["digest"])
    assert trtbuild("cache", "verify", store=store).returncode == 0
    bad_size = trtbuild("cache", "gc", "--max-size", "lots", store=store)
    assert (bad_size.returncode, bad_size.stderr) == (2, "--max-size lots: not a size (examples: 500M, 50G, 2T)\n")


def test_default_store_is_cache_in_the_working_directory(recipe, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRTBUILD_CACHE"}
    result = subprocess.run([sys.executable, "-m", "trtbuild", "build", str(recipe), "--until", "source"],
                            capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "cache" / "ac").is_dir() and list((tmp_path / "cache" / "ac").glob("*.json"))
