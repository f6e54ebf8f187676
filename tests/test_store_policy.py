"""The store's policy exists once (store/base.py over store/transport.py): the same cases, one test
body each, over both backends, a folder and a real S3 server (SeaweedFS on 127.0.0.1)."""

from __future__ import annotations

import hashlib
import multiprocessing
import uuid

import pytest

from s3server import SeaweedS3
from conftest import key_fields
from trtbuild.errors import InvalidInput
from trtbuild.store.base import CorruptStore, NoWorkspace, Store
from trtbuild.store.local import LocalStore, open_store
from trtbuild.store.records import ActionRecord, Digest, Execution
from trtbuild.store.s3 import S3Store

KEY = "a" * 64


@pytest.fixture(scope="module")
def server():
    with SeaweedS3() as s3:
        yield s3


@pytest.fixture(params=["folder", "s3"])
def store(request, tmp_path, monkeypatch) -> Store:
    if request.param == "folder":
        return LocalStore(tmp_path / "store")
    server = request.getfixturevalue("server")
    for name, value in {**server.env(), "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    bucket = f"p-{uuid.uuid4().hex[:12]}"
    server.client().create_bucket(Bucket=bucket)
    return S3Store(f"s3://{bucket}/team/store", concurrency=4)


def record(digest: str, key: str = KEY) -> ActionRecord:
    return ActionRecord(key=key, artifact=Digest(hash=digest, size_bytes=1), stage="checkpoint:export",
                        stage_version=1, target="t", recipe="r", created="2026-01-01T00:00:00Z", fields=key_fields(),
                        execution=Execution(seconds=1.0, host="h"))


def test_the_first_record_wins_a_different_one_is_kept_as_divergence_and_replace_keeps_the_old(store):
    first, second = record("1" * 64), record("2" * 64)
    assert store.get_record(KEY) is None
    assert store.put_record(first) == first
    assert store.put_record(second) == first
    assert store.get_record(KEY) == first
    assert [d["digest"] for d in store.divergences(KEY)] == ["2" * 64]
    assert store.put_record(first) == first and store.put_record(second) == first  # nothing new to note
    assert [d["digest"] for d in store.divergences(KEY)] == ["2" * 64]
    assert store.records() == [first] and store.record_keys() == [KEY]
    assert store.put_record(second, replace=True) == second
    assert store.get_record(KEY) == second
    assert [d["digest"] for d in store.divergences(KEY)] == ["2" * 64, "1" * 64]
    store.delete_record(KEY)
    assert store.get_record(KEY) is None and store.divergences(KEY) == [] and store.record_keys() == []


def test_a_damaged_record_is_refused_unless_replaced(store):
    store.transport.put(f"ac/{KEY}.json", b"{not json")
    with pytest.raises(CorruptStore, match="is not valid JSON"):
        store.put_record(record("1" * 64))
    assert store.put_record(record("1" * 64), replace=True) == record("1" * 64)
    assert store.get_record(KEY) == record("1" * 64)


def test_a_ref_moves_with_its_history_and_a_move_to_where_it_points_adds_nothing(store):
    assert store.read_ref("demo", "engine") is None
    store.update_ref("demo", "engine", "5" * 64, KEY)
    store.update_ref("demo", "engine", "5" * 64, KEY)
    store.update_ref("demo", "engine", "6" * 64, KEY)
    ref = store.read_ref("demo", "engine")
    assert ref.digest == "6" * 64 and [h.digest for h in ref.history] == ["5" * 64, "6" * 64]
    assert [(r, t, x.digest) for r, t, x in store.refs()] == [("demo", "engine", "6" * 64)]
    store.transport.put("refs/demo/engine", b"[]")  # damaged: the next move replaces it
    malformed: list = []
    assert list(store.refs(malformed)) == [] and [m[:2] for m in malformed] == [("demo", "engine")]
    with pytest.raises(CorruptStore, match="is malformed"):
        store.read_ref("demo", "engine")
    store.update_ref("demo", "engine", "7" * 64, KEY)
    assert [h.digest for h in store.read_ref("demo", "engine").history] == ["7" * 64]


def test_a_recipe_name_belongs_to_the_first_recipe_that_claims_it(store):
    store.check_claim("demo", "recipes/demo.yaml")  # nothing claimed yet: nothing written
    assert store.transport.get("refs/demo/.recipe.json") is None
    store.claim_recipe("demo", "recipes/demo.yaml")
    store.claim_recipe("demo", "recipes/demo.yaml")
    for refused in (store.claim_recipe, store.check_claim):
        with pytest.raises(InvalidInput) as caught:
            refused("demo", "elsewhere/demo.yaml")
        assert str(caught.value) == (
            f"recipe elsewhere/demo.yaml: name 'demo' already belongs to recipes/demo.yaml in store {store.location}; "
            f"give this recipe another `name:` (or remove {store.transport.describe('refs/demo/.recipe.json')} to "
            "hand the name over)")
    assert list(store.refs()) == []  # a claim is not a ref


def _move_ref(url: str, marker: str, moves: int, start) -> None:
    store = open_store(url)
    start.wait()
    for i in range(moves):
        store.update_ref("demo", "engine", hashlib.sha256(f"{marker}{i}".encode()).hexdigest(), KEY)


def _put_record(url: str, digest: str, start, results) -> None:
    store = open_store(url)
    start.wait()
    results.put(store.put_record(record(digest)).digest)


def test_two_processes_moving_one_ref_lose_no_history_entry(store):
    store.create()
    store.put_record(record("0" * 64, key="b" * 64))  # the store exists for open_store in the children
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    moves = 15
    procs = [ctx.Process(target=_move_ref, args=(store.location, m, moves, start)) for m in ("a", "b")]
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


def test_two_processes_putting_different_records_for_one_key_one_wins_the_other_is_divergence(store):
    store.create()
    store.put_record(record("0" * 64, key="b" * 64))
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Event(), ctx.Queue()
    digests = ["3" * 64, "4" * 64]
    procs = [ctx.Process(target=_put_record, args=(store.location, d, start, results)) for d in digests]
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


def test_only_a_folder_store_has_a_workspace_and_an_s3_one_says_so_in_one_typed_line(store, tmp_path):
    if isinstance(store, LocalStore):
        work = store.workspace().tmpdir("stage")
        assert work.is_dir() and work.parent == store.root / "tmp"
        with store.using(exclusive=True):
            pass
        return
    assert not store.has_workspace
    with pytest.raises(NoWorkspace) as caught:
        store.workspace("checkout")
    assert str(caught.value) == f"{store.location}: checkout needs a local store" and caught.value.exit_code == 1
    with pytest.raises(NoWorkspace) as caught, store.using(exclusive=True):
        pass
    assert str(caught.value) == f"{store.location}: exclusive use (cache gc, repair) needs a local store"
    with store.using():  # shared use: the bucket is checked, nothing is held
        pass
