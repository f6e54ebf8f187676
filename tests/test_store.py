"""The local store on real files: manifests, stat cache, ingest, materialize, verify, gc."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import key_fields
from trtbuild.errors import InvalidInput
from trtbuild.keys import canonical_json
from trtbuild.store.checkout import checkout, materialize
from trtbuild.store.gc import gc
from trtbuild.store.local import CorruptStore, LocalStore
from trtbuild.store import state as state_module
from trtbuild.store.state import StatCache
from trtbuild.store.tree import BadTree, Manifest, build_manifest
from trtbuild.store.verify import verify


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def make_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def flip_a_byte(path: Path) -> None:
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.chmod(path, 0o444)


def test_tree_digest_is_sha256_of_the_canonical_manifest(tmp_path):
    root = make_tree(tmp_path / "t", {"b.txt": b"bee", "a/x.bin": b"\x00" * 10})
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    manifest, _ = build_manifest(root, StatCache(None))
    expected = [
        {"path": "a/x.bin", "size": 10, "sha256": sha(b"\x00" * 10), "executable": False},
        {"path": "b.txt", "size": 3, "sha256": sha(b"bee"), "executable": False},
        {"path": "run.sh", "size": 10, "sha256": sha(b"#!/bin/sh\n"), "executable": True},
    ]
    assert manifest.to_bytes() == canonical_json(expected)
    assert manifest.digest == sha(canonical_json(expected))


def test_symlinks_inside_are_stored_as_files_and_outside_rejected(tmp_path):
    root = make_tree(tmp_path / "t", {"real.txt": b"data"})
    (root / "link.txt").symlink_to("real.txt")
    manifest, _ = build_manifest(root, StatCache(None))
    assert {e.path: e.sha256 for e in manifest.entries} == {"link.txt": sha(b"data"), "real.txt": sha(b"data")}
    (tmp_path / "secret").write_text("outside")
    (root / "escape.txt").symlink_to(tmp_path / "secret")
    with pytest.raises(BadTree, match="escape.txt: symlink points outside the artifact"):
        build_manifest(root, StatCache(None))


@pytest.mark.parametrize("path", ["/etc/passwd", "../up", "a/../../b", "a//b", "a\\b", "./a", ""])
def test_manifests_with_unsafe_paths_are_rejected(path):
    data = json.dumps([{"path": path, "size": 1, "sha256": "0" * 64, "executable": False}]).encode()
    with pytest.raises(BadTree):
        Manifest.from_bytes(data, "m.json")


def test_stat_cache_never_reads_an_unchanged_file_twice(tmp_path, monkeypatch):
    monkeypatch.setattr(state_module.time, "time_ns", lambda: 2**62)  # settled: not a racy entry
    state = StatCache(tmp_path / "index.db")
    path = tmp_path / "weights.bin"
    path.write_bytes(b"A" * 4096)
    old = path.stat()
    first = state.sha256(path)
    assert first == sha(b"A" * 4096)
    reads = []
    real = state_module.file_sha256
    monkeypatch.setattr(state_module, "file_sha256", lambda p, progress=None: reads.append(p) or real(p, progress))
    assert state.sha256(path) == first and reads == []  # unchanged: answered from the cache
    # A real edit moves the mtime: the cache misses and the file is read again.
    path.write_bytes(b"B" * 4096)
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns - 5 * 10**8))
    assert state.sha256(path) == sha(b"B" * 4096) and reads == [path]


def test_stat_cache_misses_a_write_whose_mtime_was_put_back(tmp_path, monkeypatch):
    # Same inode, size and mtime with other bytes: only the ctime, which no user can set back, moved.
    monkeypatch.setattr(state_module.time, "time_ns", lambda: 2**62)  # settled: not a racy entry
    state = StatCache(tmp_path / "index.db")
    path = tmp_path / "weights.bin"
    path.write_bytes(b"A" * 4096)
    assert state.sha256(path) == sha(b"A" * 4096)
    assert state.known_sha256(path) == sha(b"A" * 4096)  # kept: the write below is what must miss
    st = path.stat()
    # The write lands on a later tick of the file system's clock than the first (else its stat would
    # be the first's: a racy entry, which the real clock would not have let the cache keep).
    probe = tmp_path / "tick"
    probe.touch()
    while probe.stat().st_ctime_ns <= st.st_ctime_ns:
        os.utime(probe)
    path.write_bytes(b"B" * 4096)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert state.sha256(path) == sha(b"B" * 4096)


def test_a_stat_cache_of_the_old_schema_is_replaced_not_trusted(tmp_path):
    import sqlite3

    db_path = tmp_path / "index.db"
    with sqlite3.connect(db_path) as db:  # what trtbuild 0.x wrote: no ctime column
        db.execute("CREATE TABLE stat (path TEXT PRIMARY KEY, dev INTEGER, ino INTEGER, size INTEGER, "
                   "mtime_ns INTEGER, sha256 TEXT)")
        path = tmp_path / "w.bin"
        path.write_bytes(b"real")
        st = path.stat()
        db.execute("INSERT INTO stat VALUES (?, ?, ?, ?, ?, ?)",
                   (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, "0" * 64))
    state = StatCache(db_path)
    assert state.sha256(path) == sha(b"real")  # the old row is gone, not answered


def test_a_flipped_byte_with_its_mtime_put_back_is_refused(store, tmp_path):
    manifest = store.ingest(make_tree(tmp_path / "m", {"model.safetensors": os.urandom(100_000)}))
    [entry] = manifest.entries
    blob = store.blob_path(entry.sha256)
    materialize(store, manifest.digest)
    before = blob.stat()
    os.chmod(blob, 0o644)  # (root ignores modes; a user has to do this first)
    data = bytearray(blob.read_bytes())
    data[10] ^= 0x01
    blob.write_bytes(bytes(data))
    os.chmod(blob, 0o444)
    os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert blob.stat().st_mtime_ns == before.st_mtime_ns and blob.stat().st_size == before.st_size
    with pytest.raises(CorruptStore, match=f"blob {blob} is corrupt"):
        store.verify_blob(entry.sha256)
    with pytest.raises(CorruptStore, match=f"blob {blob} is corrupt"):
        materialize(store, manifest.digest)


def test_a_blob_the_store_wrote_is_trusted_through_the_stat_cache(store, tmp_path, monkeypatch):
    # protect() then record: the entry is written after the chmod, so it is a hit, not a re-hash.
    manifest = store.ingest(make_tree(tmp_path / "m", {"a.bin": b"x" * 5000, "b.bin": b"y" * 5000}))
    monkeypatch.setattr(state_module.time, "time_ns", lambda: 2**62)  # every entry is settled
    reads = []
    monkeypatch.setattr(state_module, "file_sha256", lambda p, progress=None: reads.append(p))
    for entry in manifest.entries:
        store.verify_blob(entry.sha256)
    assert reads == []


def test_ingest_stores_identical_content_once_and_materializes_read_only(store, tmp_path):
    a = make_tree(tmp_path / "a", {"w.bin": b"weights" * 1000, "c.json": b"{}"})
    b = make_tree(tmp_path / "b", {"copy.bin": b"weights" * 1000})
    ma, mb = store.ingest(a), store.ingest(b)
    assert len(list((store.root / "cas").rglob("*"))) - len(list((store.root / "cas").rglob("*/"))) == 2
    assert store.blob_path(sha(b"weights" * 1000)).stat().st_mode & 0o777 == 0o444
    out = materialize(store, ma.digest)
    assert out == store.root / "checkouts" / ma.digest
    assert (out / "w.bin").read_bytes() == b"weights" * 1000
    assert (out / "w.bin").stat().st_ino == store.blob_path(sha(b"weights" * 1000)).stat().st_ino  # a hard link
    assert (out / "w.bin").stat().st_mode & 0o222 == 0  # read-only: editing it would edit the blob
    assert materialize(store, mb.digest) != out


def test_executables_are_copied_with_their_bit(store, tmp_path):
    root = make_tree(tmp_path / "x", {"tool": b"#!/bin/sh\necho ok\n"})
    (root / "tool").chmod(0o755)
    out = checkout(store, store.ingest(root).digest, tmp_path / "dest")
    assert (out / "tool").stat().st_mode & 0o111
    assert subprocess.run([str(out / "tool")], capture_output=True, text=True).stdout == "ok\n"


def test_a_flipped_byte_is_found_by_verify_and_refused_at_materialization(store, tmp_path):
    manifest = store.ingest(make_tree(tmp_path / "m", {"model.safetensors": os.urandom(100_000), "config.json": b"{}"}))
    assert verify(store) == []
    digest = next(e.sha256 for e in manifest.entries if e.path == "model.safetensors")
    flip_a_byte(store.blob_path(digest))
    problems = verify(store)
    assert len(problems) == 1 and problems[0].startswith(f"{store.blob_path(digest)}: corrupt blob (content hashes to ")
    with pytest.raises(CorruptStore, match=f"blob {store.blob_path(digest)} is corrupt"):
        materialize(store, manifest.digest)


def test_a_tampered_manifest_is_refused(store, tmp_path):
    manifest = store.ingest(make_tree(tmp_path / "m", {"a": b"1"}))
    path = store.manifest_path(manifest.digest)
    os.chmod(path, 0o644)
    path.write_bytes(path.read_bytes().replace(b'"a"', b'"b"'))
    with pytest.raises(CorruptStore, match="corrupt or tampered"):
        store.get_manifest(manifest.digest)
    assert any("corrupt or tampered manifest" in p for p in verify(store))


def test_a_changed_source_file_is_not_stored_under_its_old_digest(store, tmp_path):
    root = make_tree(tmp_path / "m", {"w.bin": b"x" * 1000})
    manifest, files = build_manifest(root, store.state)
    (root / "w.bin").write_bytes(b"y" * 1000)  # changed between hashing and storing
    with pytest.raises(CorruptStore, match="changed while it was stored"):
        store.put_blob(files["w.bin"], manifest.entries[0].sha256, owned=False)
    assert not store.has_blob(manifest.entries[0].sha256)


def record_of(key: str, manifest, created: str):
    """An action record of `manifest` under `key`, as the runner writes one."""
    from trtbuild.store.records import ActionRecord, Digest, Execution

    return ActionRecord(key=key, artifact=Digest(hash=manifest.digest, size_bytes=manifest.size), stage="test",
                        stage_version=1, target="t", recipe="r", created=created, fields=key_fields(),
                        execution=Execution(seconds=0, host="test"))


def test_records_keep_the_first_artifact_and_note_divergence(store, tmp_path):
    first = store.ingest(make_tree(tmp_path / "1", {"a": b"1"}))
    second = store.ingest(make_tree(tmp_path / "2", {"a": b"2"}))
    key = "e" * 64
    store.put_record(record_of(key, first, "2026-01-01T00:00:00Z"))
    kept = store.put_record(record_of(key, second, "2026-01-01T00:00:01Z"))
    assert kept.digest == first.digest and store.get_record(key).digest == first.digest
    divergent = json.loads((store.root / "ac" / f"{key}.divergent.json").read_text())
    assert divergent == [{"digest": second.digest, "created": "2026-01-01T00:00:01Z"}]


def test_refs_keep_an_append_only_history(store, tmp_path):
    d1 = store.ingest(make_tree(tmp_path / "1", {"a": b"1"})).digest
    d2 = store.ingest(make_tree(tmp_path / "2", {"a": b"2"})).digest
    store.update_ref("r", "t", d1, "k1")
    store.update_ref("r", "t", d1, "k1")  # unchanged: no new history entry
    store.update_ref("r", "t", d2, "k2")
    ref = store.read_ref("r", "t")
    assert ref.digest == d2 and [h.digest for h in ref.history] == [d1, d2]


def test_leftovers_of_interrupted_writes_do_not_count(store, tmp_path):
    manifest = store.ingest(make_tree(tmp_path / "m", {"a": b"1"}))
    # what a killed writer leaves: a temp blob, a temp manifest, an unfinished checkout
    (store.root / "tmp" / "blob-deadbeef-1-0000").write_bytes(b"partial")
    (store.root / "manifests" / ".x.json.1.tmp").write_bytes(b"[")
    (store.root / "checkouts" / manifest.digest).mkdir()
    assert verify(store) == []
    out = materialize(store, manifest.digest)
    assert (out / "a").read_bytes() == b"1"


def _record(store, key, digest, created, size: int = 0):
    from types import SimpleNamespace

    store.put_record(record_of(key, SimpleNamespace(digest=digest, size=size), created))


def test_gc_keeps_refs_and_lock_pins_and_drops_the_rest(store, tmp_path):
    digests = [store.ingest(make_tree(tmp_path / str(i), {"w": bytes([i]) * 1000})).digest for i in range(4)]
    for i, d in enumerate(digests):
        _record(store, f"{i}" * 64, d, f"2026-01-0{i + 1}T00:00:00Z")
    store.update_ref("r", "t", digests[0], "0" * 64)
    store.update_ref("r", "t", digests[1], "1" * 64)  # history: 0, 1; current: 1
    orphan = store.ingest(make_tree(tmp_path / "o", {"w": b"orphan"}))  # no record at all
    report = gc(store, pinned={digests[3]})
    assert report.records == [] and report.manifests == 1 and report.blobs == 1  # only the orphan
    assert not store.has_manifest(orphan.digest)

    report = gc(store, pinned={digests[3]}, keep_last=1)
    assert report.records == ["0" * 64, "2" * 64]  # 0 is old history, 2 is unreferenced
    assert store.has_manifest(digests[1]) and store.has_manifest(digests[3])
    assert not store.has_manifest(digests[0]) and not store.has_manifest(digests[2])
    assert verify(store) == []


def test_gc_max_size_evicts_oldest_unprotected(store, tmp_path):
    digests = [store.ingest(make_tree(tmp_path / str(i), {"w": bytes([i]) * 10_000})).digest for i in range(3)]
    for i, d in enumerate(digests):
        _record(store, f"{i}" * 64, d, f"2026-01-0{i + 1}T00:00:00Z")
    store.update_ref("r", "t", digests[0], "0" * 64)  # the oldest, but a ref points at it
    report = gc(store, pinned=set(), max_size=25_000)
    assert report.records == ["1" * 64] and report.size_after == 20_000
    report = gc(store, pinned={digests[2]}, max_size=1)
    assert report.over_budget and report.size_after == 20_000


def test_gc_waits_for_no_build(store, tmp_path):
    script = f"""
import time
from trtbuild.store.local import LocalStore
store = LocalStore({str(store.root)!r})
with store.using():
    print("holding", flush=True)
    time.sleep(5)
"""
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        from trtbuild.errors import TrtbuildError

        with pytest.raises(TrtbuildError, match="in use by a running build"):
            gc(store, pinned=set())
    finally:
        holder.kill()
        holder.wait()
    gc(store, pinned=set())  # free again once the build is gone


def test_verify_names_a_record_whose_artifact_is_missing(store, tmp_path):
    _record(store, "a" * 64, "b" * 64, "2026-01-01T00:00:00Z")
    [problem] = verify(store)
    assert problem.endswith(f"names artifact {'b' * 64}, whose manifest is missing")


# ---- opening a store creates nothing -------------------------------------------------------------

@pytest.mark.parametrize("command", [("cache", "verify"), ("cache", "ls"), ("cache", "gc"), ("cache", "gc", "--dry-run")])
def test_cache_commands_refuse_a_store_that_does_not_exist_and_create_nothing(run, tmp_path, command):
    typo = tmp_path / "typo"
    result = run(*command, "--store", typo)
    assert result.exit_code == 2
    assert result.stderr == f"store {typo}: no such store (nothing has been built there)\n"
    assert result.stdout == ""
    assert not typo.exists()


def test_cache_verify_refuses_a_folder_that_is_not_a_store(run, tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "README.md").write_text("not a store")
    result = run("cache", "verify", "--store", folder)
    assert result.exit_code == 2
    assert result.stderr == (f"store {folder}: not a trtbuild store (it has no cas/ folder; nothing has been built "
                             "there)\n")
    assert sorted(p.name for p in folder.iterdir()) == ["README.md"]


def test_a_build_that_fails_before_running_creates_no_store(run, ws, tmp_path):
    from conftest import minimal

    recipe = ws.recipe(minimal())
    store = tmp_path / "store"
    result = run("build", recipe, "--until", "nope", "--store", store)
    from trtbuild.builder.graph import STAGE_ORDER

    assert result.exit_code == 2
    # (.strip(): the blank line build errors begin with is another part of this issue)
    assert result.stderr.strip() == f"--until nope: not a stage ({', '.join(STAGE_ORDER)})"
    assert not store.exists()


def test_opening_and_reading_a_missing_store_writes_nothing(tmp_path):
    from trtbuild.errors import InvalidInput
    from trtbuild.store.local import open_store

    root = tmp_path / "later"
    with pytest.raises(InvalidInput, match=f"store {root}: no such store"):
        open_store(str(root))
    store = open_store(str(root), create=True)
    assert store.records() == [] and list(store.refs()) == [] and store.get_record("a" * 64) is None
    assert store.state.db_path is None and not root.exists()  # the stat cache stays in memory
    with store.using():  # a build's first write creates the layout
        assert store.exists() and store.state.db_path == root / "index.db"
    store.create()  # idempotent
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["ac", "cas", "checkouts", "locks", "manifests",
                                                                   "refs", "tmp"]
    assert (root / "index.db").is_file()



def test_a_store_made_for_work_refused_on_its_input_is_removed_unless_used_or_written(tmp_path):
    """using() creates the store; an InvalidInput out of it removes what it created (the missing
    folders above the root too), but never a store another process holds or one that got a blob."""
    import fcntl

    root = tmp_path / "a" / "b" / "store"

    def refused(store: LocalStore, before=lambda: None) -> None:
        with pytest.raises(InvalidInput, match="refused"):
            with store.using():
                store.claim_recipe("r", "recipe.yaml")  # what a build writes before its source is resolved
                before()
                raise InvalidInput("refused")

    refused(LocalStore(root))
    assert os.listdir(tmp_path) == []

    held = {}

    def another_process_attaches() -> None:  # a second open file description: flock treats it as another holder
        held["lock"] = open(root / "locks" / "store.lock", "a+")
        fcntl.flock(held["lock"], fcntl.LOCK_SH)

    refused(LocalStore(root), another_process_attaches)
    assert LocalStore(root).exists()
    held["lock"].close()
    refused(LocalStore(root))  # it was there before this call: not this call's to remove
    assert LocalStore(root).exists()

    shutil.rmtree(tmp_path / "a")
    source = make_tree(tmp_path / "src", {"x": b"x"}) / "x"
    refused(LocalStore(root), lambda: LocalStore(root).put_blob(source, sha(b"x")))
    assert LocalStore(root).has_blob(sha(b"x"))

    plain = tmp_path / "plain"  # a folder that is there but no store: only the layout goes
    make_tree(plain, {"notes.txt": b"mine"})
    refused(LocalStore(plain))
    assert os.listdir(plain) == ["notes.txt"]
    shutil.rmtree(tmp_path / "a")
    shutil.rmtree(tmp_path / "src")
    shutil.rmtree(plain)


# ---- cache verify --repair -----------------------------------------------------------------------

@pytest.fixture
def two_artifacts(store, tmp_path):
    """A store holding two artifacts with their records, refs and checkouts; `bad` is the one the
    tests damage, `good` must come through every repair untouched."""
    bad_tree = make_tree(tmp_path / "bad", {"model.safetensors": os.urandom(20_000), "config.json": b"{}"})
    good_tree = make_tree(tmp_path / "good", {"rank0.safetensors": os.urandom(20_000)})
    out = {}
    for name, tree in (("bad", bad_tree), ("good", good_tree)):
        manifest = store.ingest(tree)
        key = sha(name.encode())
        store.put_record(record_of(key, manifest, "2026-01-01T00:00:00Z"))
        store.update_ref("r", name, manifest.digest, key)
        materialize(store, manifest.digest)
        out[name] = (manifest, key, tree)
    return out


def _weights_blob(store, manifest) -> Path:
    return store.blob_path(next(e.sha256 for e in manifest.entries if e.path == "model.safetensors"))


def _assert_repaired(run, store, two_artifacts, first: list[str]) -> None:
    """`verify --repair` says what it removed, line by line, exits 0, and leaves a sound store."""
    manifest, key, tree = two_artifacts["bad"]
    result = run("cache", "verify", "--repair", "--store", store.root)
    assert result.exit_code == 0, result.stderr
    removals = first + [
        f"removed checkout {store.workspace().checkout_path(manifest.digest)} (its artifact is gone)",
        f"dropped action record {store.record_path(key)} (its artifact {manifest.digest} is bad): the next build rebuilds it",
        f"dropped ref {store.ref_path('r', 'bad')} (points at artifact {manifest.digest}, which is bad): "
        "the next build points it again",
    ]
    assert result.stdout.splitlines() == removals + [
        f"store {store.root}: repaired ({len(removals)} removal(s)); the next build rebuilds what was dropped"]
    again = run("cache", "verify", "--store", store.root)
    assert again.exit_code == 0 and again.stderr == ""
    assert again.stdout == f"store {store.root}: every blob, manifest, record and ref checks out\n"
    # what was dropped is what a build rebuilds; the other artifact is untouched
    assert store.get_record(key) is None and store.read_ref("r", "bad") is None
    assert not store.workspace().checkout_path(manifest.digest).exists()
    good, good_key, _ = two_artifacts["good"]
    assert store.get_record(good_key).digest == good.digest and store.read_ref("r", "good").digest == good.digest
    assert (materialize(store, good.digest) / "rank0.safetensors").is_file()
    rebuilt = store.ingest(tree)
    assert rebuilt.digest == manifest.digest
    assert (materialize(store, rebuilt.digest) / "model.safetensors").read_bytes() == (tree / "model.safetensors").read_bytes()
    assert verify(store) == []


def test_verify_repair_after_a_deleted_blob(run, store, two_artifacts):
    manifest, _, _ = two_artifacts["bad"]
    blob = _weights_blob(store, manifest)
    blob.unlink()
    result = run("cache", "verify", "--store", store.root)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == (
        f"{store.manifest_path(manifest.digest)}: names blob {blob.name} (model.safetensors), which is missing\n"
        f"store {store.root}: 1 problem(s) found; `trtbuild cache verify --repair` drops them\n")
    _assert_repaired(run, store, two_artifacts, [
        f"removed manifest {store.manifest_path(manifest.digest)} (names blob {blob.name} (model.safetensors), which is missing)"])


def test_verify_repair_after_a_flipped_byte_with_its_mtime_put_back(run, store, two_artifacts):
    manifest, _, _ = two_artifacts["bad"]
    blob = _weights_blob(store, manifest)
    before = blob.stat()
    flip_a_byte(blob)
    os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns))
    actual = hashlib.sha256(blob.read_bytes()).hexdigest()
    result = run("cache", "verify", "--store", store.root)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == (f"{blob}: corrupt blob (content hashes to {actual})\n"
                             f"store {store.root}: 1 problem(s) found; `trtbuild cache verify --repair` drops them\n")
    _assert_repaired(run, store, two_artifacts, [
        f"removed blob {blob} (corrupt blob (content hashes to {actual}))",
        f"removed manifest {store.manifest_path(manifest.digest)} (names blob {blob.name} (model.safetensors), "
        "which is corrupt)",
    ])


def test_verify_repair_after_a_tampered_manifest(run, store, two_artifacts):
    manifest, _, _ = two_artifacts["bad"]
    path = store.manifest_path(manifest.digest)
    os.chmod(path, 0o644)
    path.write_bytes(path.read_bytes().replace(b'"config.json"', b'"config.jsom"'))
    result = run("cache", "verify", "--store", store.root)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == (f"{path}: corrupt or tampered manifest (content does not hash to its name)\n"
                             f"store {store.root}: 1 problem(s) found; `trtbuild cache verify --repair` drops them\n")
    _assert_repaired(run, store, two_artifacts, [f"removed manifest {path} (corrupt or tampered)"])


def test_gc_dry_run_counts_exactly_what_the_sweep_removes(store, tmp_path):
    kept = store.ingest(make_tree(tmp_path / "k", {"w": b"kept" * 100}))
    _record(store, "1" * 64, kept.digest, "2026-01-01T00:00:00Z")
    store.update_ref("r", "t", kept.digest, "1" * 64)
    old = store.ingest(make_tree(tmp_path / "o", {"w": b"old" * 100}))
    _record(store, "2" * 64, old.digest, "2026-01-02T00:00:00Z")
    materialize(store, old.digest)
    store.ingest(make_tree(tmp_path / "x", {"w": b"orphan"}))  # no record at all
    (store.workspace().tmpdir("leftover") / "partial").write_bytes(b"x")
    logs = make_tree(tmp_path / "logs", {"stage.log": b"failed once"})
    store.workspace().keep_failure("1" * 64, logs)  # built since: its failure goes
    store.workspace().keep_failure("3" * 64, logs)  # never built: kept
    def contents() -> list[str]:  # (gc takes locks/store.lock; the stat cache is not content)
        return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*")
                      if "index.db" not in p.name and p.name != "store.lock")

    before = contents()
    dry = gc(store, pinned=set(), keep_last=1, dry_run=True)
    assert contents() == before
    real = gc(store, pinned=set(), keep_last=1)
    assert dry.as_json() == real.as_json()
    assert real.as_json() == {"records": ["2" * 64], "manifests": 2, "blobs": 2, "bytes_freed": 300 + 6,
                              "checkouts": 1, "tmp": 1, "failures": 1, "size_after": 400, "over_budget": False,
                              "measurements": 0}
    assert store.workspace().failures() == ["3" * 64] and store.manifest_digests() == [kept.digest]


def test_explain_on_a_store_nothing_was_built_into_creates_nothing(run, ws, tmp_path):
    from conftest import minimal

    (ws.root / "model").mkdir()
    ws.config(name="model/config.json")
    recipe = ws.recipe(minimal())
    missing = tmp_path / "nothing-yet"
    result = run("explain", recipe, "source", "--json", "--store", missing)
    assert result.exit_code == 0, result.stderr
    [source] = json.loads(result.stdout)
    assert source["in_store"] is False and len(source["key"]) == 64
    assert not missing.exists()


def test_report_into_a_store_that_does_not_exist_is_refused(run, ws, tmp_path):
    from conftest import minimal

    recipe = ws.recipe(minimal())
    missing = tmp_path / "nothing-yet"
    result = run("report", recipe, "--store", missing)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == f"store {missing}: no such store (nothing has been built there)\n"
    assert not missing.exists()


def test_a_store_that_cannot_be_created_is_one_line(run, ws):
    """A --store path under a file: exit 2 and one line, not a traceback."""
    from conftest import minimal

    (ws.root / "model").mkdir()
    blocker = ws.root / "file"
    blocker.write_text("not a folder")
    result = run("build", ws.recipe(minimal()), "--store", blocker / "store", "--until", "source")
    assert (result.exit_code, result.stderr) == (2, f"store {blocker / 'store'}: cannot create it (Not a directory)\n")


def test_a_store_reads_as_existing_only_once_every_folder_is_there(tmp_path, monkeypatch):
    """Four builds starting at once on a new store: the one that sees `exists()` true must find
    locks/ (and the rest) already made, or its open of locks/store.lock fails (CI, 2026-12-01)."""
    store = LocalStore(tmp_path / "store")
    seen = []
    real_mkdir = Path.mkdir

    def watching_mkdir(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        seen.append((self.relative_to(store.root).as_posix(), store.exists(),
                     sorted(p.name for p in store.root.iterdir())))

    monkeypatch.setattr(Path, "mkdir", watching_mkdir)
    store.create()
    monkeypatch.undo()
    made = {name.split("/")[0] for name, _, _ in seen} - {"."}
    for name, exists_now, present in seen:
        if exists_now:
            assert made <= set(present), f"exists() was true after {name} with only {present}"
    assert store.exists()
    with store.using():
        pass


def test_blobs_of_an_owned_folder_stay_trusted_after_the_folder_is_removed(store, tmp_path, monkeypatch):
    """A stage's output (tmp/) and a pull's staged blobs are the store's own: once ingested and
    their folder removed, a checkout hashes nothing again (a hard link dropping to one name moves
    the blob's ctime, which would make the stat cache re-hash every byte)."""
    store.create()
    work = store.workspace().tmpdir("stage")
    out = make_tree(work / "out", {"a.bin": b"x" * 5000, "b.bin": b"y" * 7000})
    manifest = store.ingest(out)
    shutil.rmtree(work)
    monkeypatch.setattr(state_module.time, "time_ns", lambda: 2**62)  # every entry is settled
    reads = []
    monkeypatch.setattr(state_module, "file_sha256", lambda p, progress=None: reads.append(p))
    for entry in manifest.entries:
        store.verify_blob(entry.sha256)
    materialize(store, manifest.digest)
    assert reads == []


def test_a_ctrl_c_as_a_work_folder_is_made_leaves_no_folder_behind(tmp_path, monkeypatch):
    """A Ctrl-C that lands just after tmp/'s folder is made (the moment a build's stage starts) is
    raised only once the folder is the block's to remove: none is left in tmp/."""
    import signal
    import tempfile
    import threading
    import time

    from trtbuild.store.local import LocalStore

    store = LocalStore(tmp_path / "store")
    store.create()
    real_mkdtemp = tempfile.mkdtemp

    def made_then_interrupted(*args, **kwargs):
        folder = real_mkdtemp(*args, **kwargs)
        # A terminal's Ctrl-C goes to the process; the kernel hands it to a thread that does not block
        # it: here, the other thread. Python then runs the handler in the main thread at its next check.
        signal.pthread_kill(other.ident, signal.SIGINT)
        time.sleep(0.2)  # the main thread passes many such checks meanwhile
        return folder

    monkeypatch.setattr(tempfile, "mkdtemp", made_then_interrupted)
    # Python's own Ctrl-C handler, as in a terminal: a run started in a shell's background (CI
    # runners, nohup) inherits SIGINT ignored, and an ignored signal raises nothing
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    # Another thread is alive, as in a build (progress, transfers), with SIGINT not blocked.
    release = threading.Event()
    other = threading.Thread(target=release.wait, daemon=True)
    other.start()
    entered = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with store.workspace().work_folder("checkpoint-0123") as work:
                entered.append(work)
    finally:
        release.set()
        other.join()
        signal.signal(signal.SIGINT, previous)
    assert list((store.root / "tmp").iterdir()) == []
    assert entered == []  # raised as the folder is handed over, before the block runs
