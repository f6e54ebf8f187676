"""The ingest byte path (store/ingest.py, store/hash.py): what goes into cas/ is the source's bytes
and hashes to its name, by whichever way the file system allows; a source written during its
copy is never stored under the digest of other bytes."""

from __future__ import annotations

import errno
import hashlib
import os
import time
from pathlib import Path

import pytest

from trtbuild.store import ingest
from trtbuild.store.base import CorruptStore
from trtbuild.store.hash import copy_with_sha256, file_sha256
from trtbuild.store.local import LocalStore
from trtbuild.store.state import RACY_NS, StatCache
from trtbuild.store.tree import build_manifest


def settled_files(folder: Path, contents: dict[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in contents.items():
        (folder / name).write_bytes(data)
    time.sleep(2 * RACY_NS / 1e9)  # the stat cache keeps a digest only for a file settled before its read


def big_files(root: Path) -> list[Path]:
    """Files of 1 MiB or more anywhere under `root` (only the test's weights are that large)."""
    return [p for p in root.rglob("*") if p.is_file() and p.stat().st_size >= 1 << 20]


CONTENTS = {"config.json": b"{}", "a.bin": os.urandom(3 << 20) + b"a", "b.bin": os.urandom(9 << 20),
            "same.bin": b"x" * 1000, "twin.bin": b"x" * 1000, "empty.bin": b""}


def test_an_ingested_folder_is_its_sources_bytes_and_each_blob_hashes_to_hashlibs_digest(tmp_path):
    settled_files(tmp_path / "model", CONTENTS)
    store = LocalStore(tmp_path / "store")
    with store.using():
        manifest = store.ingest(tmp_path / "model")
    assert {e.path: e.sha256 for e in manifest.entries} == {
        name: hashlib.sha256(data).hexdigest() for name, data in CONTENTS.items()}
    for entry in manifest.entries:
        blob = store.blob_file(entry.sha256)
        assert blob.read_bytes() == CONTENTS[entry.path]
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == entry.sha256
        assert oct(blob.stat().st_mode & 0o777) == "0o444"
    assert len(big_files(tmp_path / "store")) == 2  # a.bin's and b.bin's blobs: no temp copy left
    assert {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()} == CONTENTS  # the source untouched


def _vouched(tmp_path: Path, data: bytes) -> tuple[Path, str, StatCache]:
    settled_files(tmp_path / "src", {"f.bin": data})
    state = StatCache(tmp_path / "index.db")
    source = tmp_path / "src" / "f.bin"
    return source, state.sha256(source), state


def test_a_file_the_stat_cache_vouches_for_is_copied_by_the_file_system_and_equals_its_source(tmp_path):
    """Here (ext4: no reflink) the kernel copies; on btrfs or XFS it is a reflink. Either way the
    bytes are the source's, and no byte went through Python's hash."""
    data = os.urandom(5 << 20) + b"tail"
    source, digest, state = _vouched(tmp_path, data)
    how = ingest.copy_blob(source, tmp_path / "dest", digest, state)
    assert how in ("reflink", "kernel")
    assert (tmp_path / "dest").read_bytes() == data and file_sha256(tmp_path / "dest") == digest


def test_without_reflink_or_kernel_copy_the_copy_hashes_every_byte_and_is_still_exact(tmp_path, monkeypatch):
    data = os.urandom(2 << 20)
    source, digest, state = _vouched(tmp_path, data)

    def unsupported(*args, **kwargs):
        raise OSError(errno.EOPNOTSUPP, "not on this file system")

    monkeypatch.setattr(ingest.fcntl, "ioctl", unsupported)
    monkeypatch.setattr(ingest.os, "copy_file_range", lambda *a: (_ for _ in ()).throw(OSError(errno.EXDEV, "x")))
    assert ingest.copy_blob(source, tmp_path / "dest", digest, state) == "hashed"
    assert (tmp_path / "dest").read_bytes() == data


def test_reflink_is_used_where_the_file_system_clones(tmp_path, monkeypatch):
    """A file system that clones (simulated: FICLONE copies the bytes) is asked first."""
    data = os.urandom(1 << 20)
    source, digest, state = _vouched(tmp_path, data)
    asked = []

    def clone(fout, request, fin):
        asked.append(request)
        os.write(fout, os.pread(fin, len(data), 0))

    monkeypatch.setattr(ingest.fcntl, "ioctl", clone)
    assert ingest.copy_blob(source, tmp_path / "dest", digest, state) == "reflink"
    assert asked == [ingest.FICLONE] and (tmp_path / "dest").read_bytes() == data


def test_a_file_the_stat_cache_does_not_vouch_for_is_copied_while_hashing(tmp_path):
    data = os.urandom(1 << 20)
    settled_files(tmp_path / "src", {"f.bin": data})
    digest = hashlib.sha256(data).hexdigest()
    assert ingest.copy_blob(tmp_path / "src" / "f.bin", tmp_path / "dest", digest, StatCache(None)) == "hashed"
    assert (tmp_path / "dest").read_bytes() == data
    with pytest.raises(CorruptStore, match="changed while it was stored"):  # a digest the bytes do not have
        ingest.copy_blob(tmp_path / "src" / "f.bin", tmp_path / "dest2", "0" * 64, StatCache(None))


@pytest.mark.parametrize("rewrite", ["other bytes", "the same bytes"])
def test_a_source_written_during_its_copy_is_refused_or_stored_as_the_bytes_hashed(tmp_path, monkeypatch, rewrite):
    """The design's guarantee: a write during the file system's copy moves the source's ctime, so
    the copy is redone while hashing, and the blob holds exactly the bytes its name hashes (the
    same bytes written back: stored; other bytes: refused, nothing left in cas/ or tmp/)."""
    settled_files(tmp_path / "model", {"config.json": b"{}", "w.bin": os.urandom(2 << 20)})
    store = LocalStore(tmp_path / "store")
    original = (tmp_path / "model" / "w.bin").read_bytes()
    with store.using():
        build_manifest(tmp_path / "model", store.state)  # as a `path:` source's key was computed
    real_clone = ingest._clone

    def clone_then_write(fin, fout, size):
        how = real_clone(fin, fout, size)
        if os.fstat(fin).st_size == len(original):
            with open(tmp_path / "model" / "w.bin", "r+b") as f:
                f.write(original[:10] if rewrite == "the same bytes" else b"0123456789")
        return how

    monkeypatch.setattr(ingest, "_clone", clone_then_write)
    with store.using():
        if rewrite == "other bytes":
            with pytest.raises(CorruptStore, match=r"w\.bin: changed while it was stored"):
                store.ingest(tmp_path / "model")
            assert big_files(tmp_path / "store") == []  # neither a blob nor a temp copy of w.bin
        else:
            manifest = store.ingest(tmp_path / "model")
            for entry in manifest.entries:
                assert file_sha256(store.blob_file(entry.sha256)) == entry.sha256
            assert len(big_files(tmp_path / "store")) == 1


def test_copy_with_sha256_writes_and_hashes_the_same_bytes(tmp_path):
    data = os.urandom((4 << 20) * 2 + 123)  # more than two chunks
    (tmp_path / "src").write_bytes(data)
    progress = []
    assert copy_with_sha256(tmp_path / "src", tmp_path / "dst", progress.append) == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "dst").read_bytes() == data and sum(progress) == len(data)
    assert file_sha256(tmp_path / "dst") == hashlib.sha256(data).hexdigest()
