"""The S3 store against a real S3-compatible server (SeaweedFS on 127.0.0.1, credentials enforced)."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import uuid
from pathlib import Path

import pytest

from s3server import SECRET_KEY, SeaweedS3
from conftest import key_fields
from trtbuild.errors import InvalidInput
from trtbuild.keys import canonical_json
from trtbuild.store.records import ActionRecord, Digest, Execution
from trtbuild.store.base import CorruptStore, NoWorkspace
from trtbuild.store.local import LocalStore, open_store
from trtbuild.store.s3 import MiB, S3Store
from trtbuild.store.s3_client import S3BucketMissing, S3CredentialsError, S3Unreachable
from trtbuild.store.tree import Entry, Manifest

KEY = "a" * 64


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def server():
    with SeaweedS3() as s3:
        yield s3


@pytest.fixture
def aws_env(server, monkeypatch):
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in {**server.env(), "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
                        "AWS_SHARED_CREDENTIALS_FILE": os.devnull}.items():
        monkeypatch.setenv(name, value)
    return server


@pytest.fixture
def bucket(aws_env):
    """A bucket of this test's own, emptied and removed after it."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    client = aws_env.client()
    client.create_bucket(Bucket=name)
    yield name
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
        for item in page.get("Contents", []):
            client.delete_object(Bucket=name, Key=item["Key"])
    client.delete_bucket(Bucket=name)


@pytest.fixture
def store(bucket, tmp_path) -> S3Store:
    return S3Store(f"s3://{bucket}/team/store", part_size=5 * MiB, concurrency=4)


def calls(store: S3Store) -> list[tuple[str, dict]]:
    """Every S3 operation the store's client sends from now on, with its parameters."""
    seen: list[tuple[str, dict]] = []
    store.transport.client.meta.events.register("before-parameter-build.s3", lambda model, params, **_: seen.append((model.name, dict(params))))
    return seen


def blob_file(tmp_path: Path, data: bytes, name: str = "blob") -> tuple[Path, str]:
    path = tmp_path / name
    path.write_bytes(data)
    return path, sha(data)


def record(digest: str, stage: str = "checkpoint:export", key: str = KEY) -> ActionRecord:
    return ActionRecord(key=key, artifact=Digest(hash=digest, size_bytes=1), stage=stage, stage_version=1,
                        target="t", recipe="r", created="2026-01-01T00:00:00Z", fields=key_fields(),
                        execution=Execution(seconds=1.0, host="h"))


# ---- blobs ---------------------------------------------------------------------------------------
def test_a_blob_round_trips_verified_and_lands_in_the_local_layout(store, bucket, tmp_path):
    source, digest = blob_file(tmp_path, b"weights " * 1000)
    seen = calls(store)
    store.put_blob(source, digest)
    puts = [params for name, params in seen if name == "PutObject"]
    assert [p["ChecksumSHA256"] for p in puts] == [store_b64(digest)]  # the server checks the bytes against the name
    assert store.has_blob(digest)
    key = f"team/store/cas/sha256/{digest[:2]}/{digest}"
    assert store.transport.client.head_object(Bucket=bucket, Key=key)["ContentLength"] == 8000
    dest = tmp_path / "out" / "weights.bin"
    dest.parent.mkdir()
    store.place_blob(digest, dest, executable=False)
    assert dest.read_bytes() == source.read_bytes()
    assert oct(dest.stat().st_mode & 0o777) == "0o444"
    assert os.listdir(dest.parent) == ["weights.bin"]
    with store.open_blob(digest) as f:
        assert f.read() == source.read_bytes()
    store.verify_blob(digest, use_state=False)
    assert list(store.iter_blobs()) == [(digest, 8000)]
    assert store.rehash_blob(digest) == digest


def test_a_blob_download_is_hashed_by_trtbuild_alone_not_again_by_botocore(store, tmp_path, monkeypatch):
    """Every blob is verified against its name as it streams; botocore's own response checksum
    (validation "when_supported") would hash each byte a second time."""
    from botocore.httpchecksum import StreamingChecksumBody

    source, digest = blob_file(tmp_path, os.urandom(1 * MiB))
    store.put_blob(source, digest)
    checked: list[int] = []
    original = StreamingChecksumBody.read

    def counted(self, *args, **kwargs):
        data = original(self, *args, **kwargs)
        checked.append(len(data))
        return data

    monkeypatch.setattr(StreamingChecksumBody, "read", counted)
    with store.open_blob(digest) as f:
        assert f.read() == source.read_bytes()
    dest = tmp_path / "placed"
    store.place_blob(digest, dest, executable=False)
    assert dest.read_bytes() == source.read_bytes()
    assert checked == []


def store_b64(digest: str) -> str:
    import base64

    return base64.b64encode(bytes.fromhex(digest)).decode()


def test_a_re_put_of_an_existing_blob_sends_no_body(store, tmp_path):
    source, digest = blob_file(tmp_path, os.urandom(6 * MiB))  # above the part size: multipart the first time
    first = calls(store)
    store.put_blob(source, digest)
    assert [name for name, _ in first if name in ("PutObject", "CreateMultipartUpload", "UploadPart")] == \
        ["CreateMultipartUpload", "UploadPart", "UploadPart"]
    store2 = S3Store(store.url, part_size=5 * MiB)
    again = calls(store2)
    store2.put_blob(source, digest)
    assert [name for name, _ in again] == ["HeadBucket", "HeadObject"]


def test_bytes_that_do_not_hash_to_the_name_are_refused_by_the_server_and_not_stored(store, bucket, tmp_path):
    source, _ = blob_file(tmp_path, b"not what the name says")
    wrong = "0" * 64
    with pytest.raises(CorruptStore) as caught:
        store.put_blob(source, wrong)
    assert str(caught.value) == (f"{source}: its bytes do not hash to {wrong} "
                                 f"(refused by s3://{bucket}/team/store/cas/sha256/00/{wrong})")
    assert not store.has_blob(wrong)


def test_a_multipart_blob_of_20_mib_goes_up_in_parts_with_sha256_and_comes_back_verified(store, tmp_path):
    data = os.urandom(20 * MiB)
    source, digest = blob_file(tmp_path, data)
    seen = calls(store)
    store.put_blob(source, digest)
    parts = [params for name, params in seen if name == "UploadPart"]
    assert len(parts) == 4
    assert {p["ChecksumAlgorithm"] for p in parts} == {"SHA256"}
    assert [p["ChecksumAlgorithm"] for name, p in seen if name == "CreateMultipartUpload"] == ["SHA256"]
    dest = tmp_path / "back"
    store.place_blob(digest, dest, executable=True)
    assert sha(dest.read_bytes()) == digest
    assert oct(dest.stat().st_mode & 0o777) == "0o555"
    store.verify_blob(digest)  # no full-object checksum for multipart: hashed from its bytes


def test_a_blob_altered_on_the_server_is_detected_and_nothing_is_materialized(store, bucket, tmp_path):
    source, digest = blob_file(tmp_path, b"the real bytes " * 100)
    store.put_blob(source, digest)
    key = f"team/store/cas/sha256/{digest[:2]}/{digest}"
    altered = b"X" + source.read_bytes()[1:]
    store.transport.client.put_object(Bucket=bucket, Key=key, Body=altered)  # same size, other bytes
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(CorruptStore) as caught:
        store.place_blob(digest, out / "file", executable=False)
    assert str(caught.value) == (f"blob s3://{bucket}/{key} is corrupt: its sha256 is {sha(altered)}; "
                                 f"run `trtbuild cache verify --store {store.url}`")
    assert os.listdir(out) == []
    with pytest.raises(CorruptStore):
        store.verify_blob(digest)
    with pytest.raises(CorruptStore), store.open_blob(digest) as f:
        f.read()
    assert store.rehash_blob(digest) == sha(altered)


def test_a_reader_that_stops_at_the_blob_size_still_gets_the_corruption(store, bucket, tmp_path):
    source, digest = blob_file(tmp_path, b"exact " * 10)
    store.put_blob(source, digest)
    store.transport.client.put_object(Bucket=bucket, Key=f"team/store/cas/sha256/{digest[:2]}/{digest}", Body=b"EXACT " * 10)
    with store.open_blob(digest) as f, pytest.raises(CorruptStore):
        f.read(60)


def test_an_empty_blob_round_trips_and_a_damaged_copy_of_the_same_size_is_replaced_on_put(store, bucket, tmp_path):
    empty, empty_digest = blob_file(tmp_path, b"", "empty")
    store.put_blob(empty, empty_digest)
    store.place_blob(empty_digest, tmp_path / "e", executable=False)
    assert (tmp_path / "e").read_bytes() == b""
    source, digest = blob_file(tmp_path, b"good bytes")
    key = f"team/store/cas/sha256/{digest[:2]}/{digest}"
    store.transport.client.put_object(Bucket=bucket, Key=key, Body=b"evil bytes", ChecksumAlgorithm="SHA256")
    store.put_blob(source, digest)  # its full-object SHA-256 says it is not this blob: uploaded again
    assert store.transport.client.get_object(Bucket=bucket, Key=key)["Body"].read() == b"good bytes"
    store.verify_blob(digest)


class _BreaksAfter:
    """A body stream that fails after `limit` bytes, as a dropped connection does."""

    def __init__(self, body, limit: int) -> None:
        self.body, self.left = body, limit

    def read(self, n: int = -1) -> bytes:
        from botocore.exceptions import ResponseStreamingError

        if self.left <= 0:
            raise ResponseStreamingError(error="connection reset by peer")
        data = self.body.read(min(n, self.left) if n and n > 0 else self.left)
        self.left -= len(data)
        return data

    def close(self) -> None:
        self.body.close()


def test_an_interrupted_download_resumes_with_a_ranged_get_and_reads_each_byte_once(store, tmp_path):
    data = os.urandom(3 * MiB + 123)
    source, digest = blob_file(tmp_path, data)
    store.put_blob(source, digest)
    cut = MiB + 7
    gets: list[dict] = []
    broken = []

    def after_get(parsed, **_):
        if not broken:
            broken.append(True)
            parsed["Body"] = _BreaksAfter(parsed["Body"], cut)

    store.transport.client.meta.events.register("before-parameter-build.s3.GetObject", lambda params, **_: gets.append(dict(params)))
    store.transport.client.meta.events.register("after-call.s3.GetObject", after_get)
    received = []
    size = store.transport.read_blob_into(digest, received.append)
    assert size == len(data)
    assert b"".join(received) == data
    assert [g.get("Range") for g in gets] == [None, f"bytes={cut}-"]
    assert gets[1]["IfMatch"]  # the rest must come from the same object
    dest = tmp_path / "dest"
    broken.clear()
    store.place_blob(digest, dest, executable=False)
    assert dest.read_bytes() == data


_KILLED_DOWNLOAD = """
import sys, time
from trtbuild.store.s3 import S3Store
url, digest, dest, cut = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

class Stalls:  # the connection hangs after `cut` bytes: the parent kills this process then
    def __init__(self, body):
        self.body, self.left = body, cut
    def read(self, n=-1):
        if self.left <= 0:
            time.sleep(600)
        data = self.body.read(min(n, self.left))
        self.left -= len(data)
        return data
    def close(self):
        self.body.close()

store = S3Store(url)
store.transport.client.meta.events.register("after-call.s3.GetObject", lambda parsed, **_: parsed.update(Body=Stalls(parsed["Body"])))
store.place_blob(digest, dest, executable=False)
"""


def test_a_download_killed_midway_resumes_from_its_partial_file_with_a_ranged_get(store, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    data = os.urandom(3 * MiB)
    source, digest = blob_file(tmp_path, data)
    store.put_blob(source, digest)
    dest, cut = tmp_path / "dest", MiB + 5
    partial = store.transport.partial_path(digest, dest)
    child = subprocess.Popen([sys.executable, "-c", _KILLED_DOWNLOAD, store.url, digest, str(dest), str(cut)])
    try:
        deadline = time.monotonic() + 60
        while not (partial.exists() and partial.stat().st_size == cut):
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert not dest.exists()
    gets: list[dict] = []
    store.transport.client.meta.events.register("before-parameter-build.s3.GetObject", lambda params, **_: gets.append(dict(params)))
    store.place_blob(digest, dest, executable=False)
    assert [g.get("Range") for g in gets] == [f"bytes={cut}-"]
    assert dest.read_bytes() == data and not partial.exists()


def test_a_leftover_partial_file_of_other_bytes_is_discarded_and_the_blob_fetched_whole(store, tmp_path):
    data = b"0123456789" * 1000
    source, digest = blob_file(tmp_path, data)
    store.put_blob(source, digest)
    dest = tmp_path / "dest"
    store.transport.partial_path(digest, dest).write_bytes(b"garbage")
    gets: list[dict] = []
    store.transport.client.meta.events.register("before-parameter-build.s3.GetObject", lambda params, **_: gets.append(dict(params)))
    store.place_blob(digest, dest, executable=False)
    assert [g.get("Range") for g in gets] == ["bytes=7-", None]
    assert dest.read_bytes() == data and not store.transport.partial_path(digest, dest).exists()


def test_a_large_blob_comes_down_in_parallel_ranges_verified_and_a_broken_range_resumes(bucket, tmp_path):
    store = S3Store(f"s3://{bucket}/big", part_size=5 * MiB, concurrency=3, download_chunk=2 * MiB)
    data = os.urandom(7 * MiB + 11)
    source, digest = blob_file(tmp_path, data)
    store.put_blob(source, digest)
    gets: list[str] = []
    broken: list[bool] = []

    def after_get(parsed, **_):
        if not broken and parsed["ContentRange"].startswith("bytes 0-"):  # the first range's connection drops
            broken.append(True)
            parsed["Body"] = _BreaksAfter(parsed["Body"], 1000)

    store.transport.client.meta.events.register("before-parameter-build.s3.GetObject", lambda params, **_: gets.append(params["Range"]))
    store.transport.client.meta.events.register("after-call.s3.GetObject", after_get)
    dest = tmp_path / "dest"
    store.place_blob(digest, dest, executable=False)
    assert dest.read_bytes() == data
    ranges = [f"bytes={o}-{min(o + 2 * MiB, len(data)) - 1}" for o in range(0, len(data), 2 * MiB)]
    assert sorted(gets) == sorted(ranges + [f"bytes=1000-{2 * MiB - 1}"])
    altered = bytearray(data)
    altered[5 * MiB] ^= 1
    store.transport.client.put_object(Bucket=bucket, Key=f"big/cas/sha256/{digest[:2]}/{digest}", Body=bytes(altered))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(CorruptStore) as caught:
        store.place_blob(digest, out / "file", executable=False)
    assert str(caught.value) == (f"blob s3://{bucket}/big/cas/sha256/{digest[:2]}/{digest} is corrupt: its sha256 is "
                                 f"{sha(bytes(altered))}; run `trtbuild cache verify --store {store.url}`")
    assert os.listdir(out) == []


# ---- manifests -----------------------------------------------------------------------------------
def test_manifests_round_trip_verified_and_unsafe_paths_are_rejected_on_read(store, bucket, tmp_path):
    source, digest = blob_file(tmp_path, b"config")
    store.put_blob(source, digest)
    manifest = Manifest.from_entries([Entry("config.json", 6, digest)])
    assert store.put_manifest(manifest) == manifest.digest
    assert store.get_manifest(manifest.digest) == manifest
    assert store.manifest_digests() == [manifest.digest]
    assert store.artifact_problem(manifest.digest) is None
    for path in ("../outside", "/etc/passwd"):
        data = canonical_json([{"path": path, "size": 6, "sha256": digest, "executable": False}])
        key = f"team/store/manifests/{sha(data)}.json"
        store.transport.client.put_object(Bucket=bucket, Key=key, Body=data)
        with pytest.raises(CorruptStore) as caught:
            store.get_manifest(sha(data))
        assert str(caught.value) == f"s3://{bucket}/{key}: unsafe path {path!r} (absolute, '..' or not normalized)"
    tampered = canonical_json([{"path": "x", "size": 6, "sha256": digest, "executable": False}])
    store.transport.client.put_object(Bucket=bucket, Key=f"team/store/manifests/{manifest.digest}.json", Body=tampered)
    with pytest.raises(CorruptStore) as caught:
        store.get_manifest(manifest.digest)
    assert str(caught.value) == (f"manifest s3://{bucket}/team/store/manifests/{manifest.digest}.json is corrupt or "
                                 "tampered: its content does not hash to its name")


def test_a_manifest_naming_a_missing_blob_is_not_written(store):
    manifest = Manifest.from_entries([Entry("w", 1, "b" * 64)])
    with pytest.raises(CorruptStore):
        store.put_manifest(manifest)
    assert not store.has_manifest(manifest.digest)


# ---- records -------------------------------------------------------------------------------------
def test_the_first_record_wins_and_a_different_one_is_kept_as_divergence(store):
    first, second = record("1" * 64), record("2" * 64)
    assert store.get_record(KEY) is None
    assert store.put_record(first) == first
    assert store.put_record(second) == first
    assert store.get_record(KEY) == first
    assert [d["digest"] for d in store.divergences(KEY)] == ["2" * 64]
    assert store.put_record(first) == first  # the same artifact again: nothing changes
    assert store.records() == [first] and store.record_keys() == [KEY]
    assert store.put_record(second, replace=True) == second
    assert store.get_record(KEY) == second
    assert [d["digest"] for d in store.divergences(KEY)] == ["2" * 64, "1" * 64]


def _put_record(url: str, digest: str, start, results) -> None:
    store = S3Store(url)
    start.wait()
    results.put(store.put_record(record(digest)).digest)


def test_two_processes_putting_different_records_for_one_key_one_wins_the_other_is_divergence(store):
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Event(), ctx.Queue()
    digests = ["3" * 64, "4" * 64]
    procs = [ctx.Process(target=_put_record, args=(store.url, d, start, results)) for d in digests]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    returned = {results.get(timeout=5), results.get(timeout=5)}
    winner = store.get_record(KEY).digest
    assert returned == {winner}  # both were answered with the one stored record
    assert [d["digest"] for d in store.divergences(KEY)] == [d for d in digests if d != winner]


# ---- refs ----------------------------------------------------------------------------------------
def test_update_ref_appends_history_and_claims_are_first_come(store):
    store.claim_recipe("demo", "recipes/demo.yaml")
    store.claim_recipe("demo", "recipes/demo.yaml")
    with pytest.raises(InvalidInput):
        store.claim_recipe("demo", "elsewhere/demo.yaml")
    store.update_ref("demo", "engine", "5" * 64, KEY)
    store.update_ref("demo", "engine", "5" * 64, KEY)  # no move: no new entry
    store.update_ref("demo", "engine", "6" * 64, KEY)
    ref = store.read_ref("demo", "engine")
    assert ref.digest == "6" * 64 and [h.digest for h in ref.history] == ["5" * 64, "6" * 64]
    assert [(r, t, x.digest) for r, t, x in store.refs()] == [("demo", "engine", "6" * 64)]


def _move_ref(url: str, marker: str, moves: int, start) -> None:
    store = S3Store(url)
    start.wait()
    for i in range(moves):
        store.update_ref("demo", "engine", hashlib.sha256(f"{marker}{i}".encode()).hexdigest(), KEY)


def test_two_processes_moving_one_ref_lose_no_history_entry(store):
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    moves = 15
    procs = [ctx.Process(target=_move_ref, args=(store.url, m, moves, start)) for m in ("a", "b")]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    history = [h.digest for h in store.read_ref("demo", "engine").history]
    expected = {hashlib.sha256(f"{m}{i}".encode()).hexdigest() for m in "ab" for i in range(moves)}
    assert len(history) == 2 * moves and set(history) == expected
    for marker in "ab":  # each writer's moves in its own order
        own = [hashlib.sha256(f"{marker}{i}".encode()).hexdigest() for i in range(moves)]
        assert [h for h in history if h in own] == own


# ---- errors --------------------------------------------------------------------------------------
def test_wrong_credentials_are_one_line_naming_bucket_and_key_without_the_secret(store, bucket, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-xyz")
    wrong = S3Store(store.url)
    with pytest.raises(InvalidInput) as caught:
        wrong.get_record(KEY)
    message = str(caught.value)
    assert message == (f"s3://{bucket}/team/store/ac/{KEY}.json: access denied (403): "
                       "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and the bucket policy")
    assert "not-the-secret-xyz" not in message and SECRET_KEY not in message
    assert isinstance(caught.value, S3CredentialsError) and caught.value.exit_code == 2
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody")
    with pytest.raises(InvalidInput) as caught:
        S3Store(store.url).has_blob("c" * 64)
    assert str(caught.value) == (f"s3://{bucket}/team/store/cas/sha256/cc/{'c' * 64}: access denied (403): "
                                 "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and the bucket policy")


def test_a_missing_bucket_is_one_line_naming_it(aws_env):
    store = S3Store("s3://no-such-bucket-here/p")
    with pytest.raises(InvalidInput) as caught:
        store.has_blob("d" * 64)
    assert str(caught.value) == f"s3://no-such-bucket-here/p/cas/sha256/dd/{'d' * 64}: bucket no-such-bucket-here does not exist"
    assert caught.value.exit_code == 2 and isinstance(caught.value, S3BucketMissing)


def test_an_unreachable_endpoint_is_one_typed_line_exit_1(aws_env):
    store = S3Store("s3://b/p", endpoint_url="http://127.0.0.1:9", max_attempts=1)
    with pytest.raises(S3Unreachable) as caught:
        store.get_record(KEY)
    assert str(caught.value) == (f"s3://b/p/ac/{KEY}.json: cannot reach http://127.0.0.1:9 (EndpointConnectionError): "
                                 "check AWS_ENDPOINT_URL")
    assert caught.value.exit_code == 1 and (caught.value.endpoint, caught.value.bucket) == ("http://127.0.0.1:9", "b")


# ---- open_store and local concepts ---------------------------------------------------------------
def test_open_store_routes_s3_urls_and_keeps_folders_local(store, bucket, tmp_path):
    assert isinstance(open_store(str(tmp_path / "s"), create=True), LocalStore)
    with pytest.raises(InvalidInput) as caught:
        open_store(f"s3://{bucket}/empty")
    assert str(caught.value) == f"store s3://{bucket}/empty: not a trtbuild store (nothing has been pushed there)"
    assert not store.exists()
    source, digest = blob_file(tmp_path, b"x")
    store.put_blob(source, digest)
    opened = open_store(store.url)
    assert isinstance(opened, S3Store) and opened.exists() and opened.has_blob(digest)
    with pytest.raises(InvalidInput) as caught:
        open_store("gs://b/p")
    assert str(caught.value) == "--store gs://b/p: a store is a local folder or an s3://BUCKET/PREFIX URL"


def test_an_s3_store_has_no_workspace_and_says_so_in_one_typed_line(store):
    with pytest.raises(NoWorkspace) as caught, store.using(exclusive=True):
        pass
    assert str(caught.value) == f"{store.url}: exclusive use (cache gc, repair) needs a local store"
    with pytest.raises(NoWorkspace) as caught:
        store.workspace("checkout").checkout_path("e" * 64)
    assert str(caught.value) == f"{store.url}: checkout needs a local store"
    with store.using():
        pass


def test_a_bucket_in_another_region_is_one_line_naming_the_region(aws_env):
    from botocore.stub import Stubber

    store = S3Store("s3://far-bucket/p")
    with Stubber(store.transport.client) as stub:  # what AWS answers a client signing for the wrong region
        stub.add_client_error("head_bucket", service_error_code="PermanentRedirect", http_status_code=301,
                              response_meta={"HTTPHeaders": {"x-amz-bucket-region": "eu-west-1"}})
        with pytest.raises(InvalidInput) as caught:
            store.get_record(KEY)
    assert str(caught.value) == (f"s3://far-bucket/p/ac/{KEY}.json: the bucket is in region eu-west-1, not us-east-1: "
                                 "set AWS_DEFAULT_REGION (or AWS_REGION)")


def test_push_and_the_s3_client_import_no_graph_and_no_boto3_until_bytes_move():
    """A re-push of an unchanged artifact is start-up and a few requests (issue #12: under 1 s): the
    stage graph, the planner and boto3 (its Session and resource models: only the transfer manager
    needs boto3, when bytes move) are not imported for it."""
    import subprocess
    import sys

    script = """
import sys
import trtbuild.cli, trtbuild.deploy.push, trtbuild.lock.lockfile, trtbuild.recipe.schema, trtbuild.store.configured
import trtbuild.store.transfer
from trtbuild.store.s3 import S3Store
S3Store('s3://bucket/prefix', endpoint_url='http://127.0.0.1:9').transport.client
print(sorted(m for m in ('trtbuild.builder.graph', 'trtbuild.plan.expand', 'trtbuild.builder.pipeline', 'boto3') if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout == "[]\n"


def test_an_upload_over_http_is_hashed_once_by_its_checksum_not_again_to_sign_it(store, tmp_path):
    """Every part carries its SHA-256 checksum header (signed, checked by the server); botocore
    signing the payload as well, as it does over http:// unless told not to, would read every byte
    sent a second time. Seen on the wire: each part of a 2-part blob says UNSIGNED-PAYLOAD and
    carries its own SHA-256."""
    import base64
    import hashlib

    sent = []

    def seen(request, **_):
        if request.method == "PUT" and "partNumber=" in request.url:
            sent.append((request.headers["X-Amz-Content-SHA256"], request.headers["x-amz-checksum-sha256"]))  # bytes

    store.transport.client.meta.events.register("before-send.s3.UploadPart", seen)
    data = os.urandom(6 * MiB)  # two parts: 5 MiB and 1 MiB
    source = tmp_path / "blob"
    source.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    store.put_blobs([(source, digest)])
    assert store.transport.blob_size(digest) == len(data)
    parts = [data[:5 * MiB], data[5 * MiB:]]
    assert sorted(sent) == sorted((b"UNSIGNED-PAYLOAD", base64.b64encode(hashlib.sha256(p).digest())) for p in parts)
