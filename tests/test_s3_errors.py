"""One S3 module, one error mapping (store/s3_client.py): an unreachable endpoint is the same typed
error, one line naming the endpoint, and the same exit code (1, an environment failure, as an
unreachable hub is) whether an s3:// source or an s3:// store meets it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ENDPOINT = "http://127.0.0.1:9"  # nothing listens on the discard port


@pytest.fixture
def env(tmp_path) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**clean, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": ENDPOINT, "AWS_MAX_ATTEMPTS": "1", "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


def trtbuild(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtbuild", *args], capture_output=True, text=True, env=env, timeout=120)


def test_an_unreachable_endpoint_is_exit_1_and_one_line_naming_it_for_a_source_and_for_a_store(env, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("schema: 1\nname: r\nsource: {s3: s3://bucket/model}\ngpus: [sm90]\n")
    source = trtbuild(env, "build", str(recipe), "--store", str(tmp_path / "store"))
    store = trtbuild(env, "cache", "ls", "--store", "s3://bucket/p")
    for result, url in ((source, "s3://bucket/model/config.json"), (store, "s3://bucket/p/")):
        assert (result.returncode, result.stderr) == (
            1, f"{url}: cannot reach {ENDPOINT} (EndpointConnectionError): check AWS_ENDPOINT_URL\n")
    assert not (tmp_path / "store").exists()  # nothing half-written


def test_the_errors_are_typed_with_the_endpoint_bucket_and_why():
    from botocore import exceptions as bex

    from trtbuild.store import s3_client

    unreachable = s3_client.error("s3://b/k", bex.EndpointConnectionError(endpoint_url=f"{ENDPOINT}/b/k"), ENDPOINT)
    assert isinstance(unreachable, s3_client.S3Unreachable) and unreachable.exit_code == 1
    assert (unreachable.endpoint, unreachable.bucket, unreachable.why) == (ENDPOINT, "b", "unreachable")
    missing = s3_client.error("s3://b/k", bex.NoCredentialsError())
    assert isinstance(missing, s3_client.S3CredentialsError) and missing.exit_code == 2
    no_bucket = s3_client.error("s3://b/k", bex.ClientError({"Error": {"Code": "NoSuchBucket"}}, "GetObject"))
    assert isinstance(no_bucket, s3_client.S3BucketMissing) and no_bucket.exit_code == 2
