"""Secrets never reach what trtbuild writes (issue 14): a build of a gated Hugging Face model (the
local hub fixture, tests/hubserver.py) pushed to a real S3 server (SeaweedFS, which accepts only
this test's random credentials), a pull from it onto a fresh host, and the listing commands, all with
HF_TOKEN and AWS credentials set to random values. Then every file trtbuild wrote (both stores,
the lock, logs, reports, the --dest folder), every command's stdout and stderr (the JSON output)
and every object in the bucket, read back, are searched for each secret, as it is and in its
base64 and URL-encoded forms."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import urllib.parse

import pytest

from hubserver import FakeRepo, HubServer
from s3server import SeaweedS3
from test_source_hf import model_files

# Random each run, so a match can only be a leak (never a value the code or a fixture holds).
HF_TOKEN = f"hf_{secrets.token_hex(16)}"
ACCESS_KEY = f"AKIA{secrets.token_hex(8).upper()}"
SECRET_KEY = secrets.token_urlsafe(30)
SECRETS = {"HF_TOKEN": HF_TOKEN, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
RECIPE = ("schema: 1\nname: gated\nsource: {hf: org/gated, revision: main}\ngpus: [sm90]\n"
          "limits: {max_input_len: 128, max_seq_len: 256}\nvalidate: {samples: 2, seq_len: 32}\n")


def forms(secret: str) -> dict[str, bytes]:
    """The secret as a leak could spell it: as it is, base64 (e.g. a Basic header), URL-encoded."""
    raw = secret.encode()
    return {"raw": raw, "base64": base64.b64encode(raw), "base64url": base64.urlsafe_b64encode(raw).rstrip(b"="),
            "urlencoded": urllib.parse.quote(secret, safe="").encode()}


def leaks(where: str, data: bytes) -> list[str]:
    return [f"{where}: {name} ({form})" for name, secret in SECRETS.items()
            for form, spelled in forms(secret).items() if spelled in data]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """Build (with validation) and push, then pull onto a fresh store; returns the folder everything
    was written under, each command's output and the bucket's objects."""
    root = tmp_path_factory.mktemp("secrets")
    with HubServer({"org/gated": FakeRepo(model_files(), gated_token=HF_TOKEN)}) as hub, \
            SeaweedS3(ACCESS_KEY, SECRET_KEY) as s3:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HF_", "HUGGING"))}
        env.update({**hub.env(root / "hf-home"), **s3.env(), **SECRETS, "AWS_EC2_METADATA_DISABLED": "true",
                    "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                    "OMP_NUM_THREADS": "1", "TRTBUILD_CACHE": str(root / "work" / "store")})
        s3.client().create_bucket(Bucket="artifacts")
        url = "s3://artifacts/ci"
        project = root / "work"
        project.mkdir()
        recipe = project / "gated.yaml"
        recipe.write_text(RECIPE)
        outputs: dict[str, subprocess.CompletedProcess] = {}

        def trtbuild(name: str, *args, **extra) -> None:
            outputs[name] = subprocess.run([sys.executable, "-m", "trtbuild", *map(str, args)], capture_output=True,
                                           env={**env, **extra}, cwd=project, timeout=300)

        trtbuild("build", "build", recipe, "--store", url, "--push", "--json")
        trtbuild("push", "push", recipe, "--store", url, "--json")
        trtbuild("ls", "ls", recipe, "--store", url, "--json")
        trtbuild("cache-ls", "cache", "ls", "--json")
        trtbuild("cache-verify", "cache", "verify")
        deploy = {"TRTBUILD_CACHE": str(project / "deploy-store")}
        trtbuild("pull", "pull", recipe.with_suffix(".lock"), "--target", "base-tp1", "--store", url,
                 "--dest", project / "serve", "--json", **deploy)
        trtbuild("pull-again", "pull", recipe, "--target", "base-tp1", "--store", url, "--json", **deploy)
        client = s3.client()
        objects = {item["Key"]: client.get_object(Bucket="artifacts", Key=item["Key"])["Body"].read()
                   for page in client.get_paginator("list_objects_v2").paginate(Bucket="artifacts")
                   for item in page.get("Contents", [])}
    yield root, outputs, objects


def test_every_command_succeeded_with_the_secrets_set(published):
    """Not vacuous: the token opened the gated repository, the keys the bucket, and each command ran."""
    root, outputs, objects = published
    project = root / "work"
    assert {name: result.returncode for name, result in outputs.items()} == dict.fromkeys(outputs, 0), \
        {name: result.stderr.decode()[-2000:] for name, result in outputs.items()}
    assert json.loads(outputs["build"].stdout)["push"]["pushed"] == ["base-tp1"]
    assert json.loads(outputs["pull"].stdout)["path"] == str(project / "serve")
    assert (project / "serve" / "rank0.safetensors").is_file() and (project / "gated.lock").is_file()
    assert any(key.startswith("ci/cas/") for key in objects) and any(key.startswith("ci/ac/") for key in objects)
    written = [p for p in project.rglob("*") if p.is_file()]
    assert any("/logs/" in str(p) or p.suffix == ".log" or "/cas/" in str(p) for p in written)


def test_no_secret_is_in_any_file_output_or_object(published):
    root, outputs, objects = published
    found = []
    for path in sorted(root.rglob("*")):  # the project, both stores, --dest and the hub client's cache
        if path.is_file() and not path.is_symlink():
            found += leaks(str(path.relative_to(root)), path.read_bytes())
    for name, result in outputs.items():
        found += leaks(f"{name} stdout", result.stdout) + leaks(f"{name} stderr", result.stderr)
    for key, data in objects.items():
        found += leaks(f"s3://artifacts/{key}", data)
    assert found == []
