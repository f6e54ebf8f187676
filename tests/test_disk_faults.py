"""Disk full and read-only folders while trtbuild writes the local store, `pull --dest` or the lock
file (issue 14): one clear line naming the path, a non-zero exit (1 for a full disk, 2 for a path
that cannot be written), nothing half-written, and the store still verifies.

Real file systems, not mocks: a small tmpfs filled up to a few KiB (`mount -t tmpfs`), and
read-only bind mounts (root ignores permission bits, not a read-only mount). Both need root with
CAP_SYS_ADMIN; elsewhere the tests are skipped. Every mount is undone at the test's end, pass or fail.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import NEMO_DATA

TINY_HF = NEMO_DATA / "hf_tiny_llama_tied_bf16"  # its model.safetensors is 296 KiB
RECIPE = "schema: 1\nname: tiny\nsource: {path: model}\ngpus: [sm90]\nlimits: {max_input_len: 128, max_seq_len: 256}\n"
FREE_KIB = 200  # left on a "full" disk: the layout, index.db and the small files fit, the weights do not


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


@functools.lru_cache(maxsize=None)
def _cannot_mount() -> str | None:
    """Why this host cannot mount a tmpfs (not root, no CAP_SYS_ADMIN), or None."""
    probe = Path(tempfile.mkdtemp(prefix="trtbuild-mount-probe-"))
    try:
        _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe))
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"cannot mount a tmpfs here ({getattr(exc, 'stderr', b'') or exc})"
    _umount(probe)
    probe.rmdir()
    return None


@pytest.fixture
def full_disk(tmp_path):
    """A folder on an 8 MiB tmpfs with FREE_KIB left."""
    if _cannot_mount():
        pytest.skip(_cannot_mount())
    disk = tmp_path / "disk"
    disk.mkdir()
    _mount("-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk))
    try:
        stat = os.statvfs(disk)
        with open(disk / "filler", "wb") as f:
            f.write(b"\0" * (stat.f_bavail * stat.f_frsize - FREE_KIB * 1024))
        yield disk
    finally:
        _umount(disk)


@pytest.fixture
def read_only():
    """`read_only(folder)`: the folder becomes a read-only bind mount of itself until the test ends."""
    if _cannot_mount():
        pytest.skip(_cannot_mount())
    mounted: list[Path] = []

    def make(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        _mount("--bind", str(folder), str(folder))
        mounted.append(folder)
        _mount("-o", "remount,bind,ro", str(folder))
        return folder

    try:
        yield make
    finally:
        for folder in reversed(mounted):
            _umount(folder)


def project(folder: Path) -> Path:
    """A recipe beside a real tiny model folder; returns the recipe."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(TINY_HF, folder / "model")
    (folder / "tiny.yaml").write_text(RECIPE)
    return folder / "tiny.yaml"


def trtbuild(*args, store: Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRTBUILD_CACHE": str(store), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "trtbuild", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def verified(store: Path) -> str:
    result = trtbuild("cache", "verify", store=store)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A store holding the tiny model's checkpoint (target base-tp1), validated (torch's validation
    passes its gates, so pull takes it: trtbuild.lock.publication) and the recipe's lock."""
    root = tmp_path_factory.mktemp("built")
    recipe = project(root)
    result = trtbuild("build", recipe, "--until", "validate", store=root / "store")
    assert result.returncode == 0, result.stderr
    return root / "store", recipe.with_suffix(".lock")


def blob_of(store: Path, name: str) -> str:
    """Where the store keeps the bytes of the model file `name` (its sha256 names the blob)."""
    import hashlib

    digest = hashlib.sha256((TINY_HF / name).read_bytes()).hexdigest()
    return str(store / "cas" / "sha256" / digest[:2] / digest)


# ---- the local store runs out of space ---------------------------------------------------------------
def test_a_copy_onto_a_full_disk_raises_and_never_returns_the_digest_of_bytes_it_did_not_write(full_disk):
    """A write onto a full disk may be short (some bytes written, no error) before it fails: the
    store copies with unbuffered writes, so a copy that ignored the count named a truncated blob by
    the digest of the whole file."""
    from trtbuild.store.hash import copy_with_sha256

    with pytest.raises(OSError) as caught:
        copy_with_sha256(TINY_HF / "model.safetensors", full_disk / "copy")
    assert caught.value.errno == errno.ENOSPC


def test_a_source_ingested_into_a_full_store_says_so_in_one_line_and_leaves_a_store_that_verifies(tmp_path, full_disk):
    recipe = project(tmp_path / "project")
    store = full_disk / "store"
    result = trtbuild("build", recipe, "--until", "source", "--json", store=store)
    # Files are copied a few at once (store/ingest.py), so the copy that meets the full disk is the
    # weights' or, when their partial copy took the last blocks first, a small file's: the line names
    # that file's blob, and that blob is not in cas/.
    first, problem = result.stderr.splitlines()
    (named,) = [name for name in sorted(p.name for p in TINY_HF.iterdir())
                if problem == f"{blob_of(store, name)}: no space left on device"]
    assert (result.returncode, first, result.stdout) == (1, f"new store at {store}", "")  # the store stays
    assert not Path(blob_of(store, named)).exists()
    assert files(store / "tmp") == []  # the copy that did not fit is gone, as is the stage's folder
    assert not Path(blob_of(store, "model.safetensors")).exists()  # no truncated weights under cas/
    assert verified(store) == f"store {store}: every blob, manifest, record and ref checks out\n"
    (full_disk / "filler").unlink()  # space freed: the same build completes
    assert trtbuild("build", recipe, "--until", "source", store=store).returncode == 0


def test_blobs_pulled_into_a_full_store_say_so_in_one_line_and_leave_a_store_that_verifies(built, full_disk):
    from trtbuild.store.local import LocalStore

    remote, lock = built
    store = full_disk / "store"
    result = trtbuild("pull", lock, "--target", "base-tp1", "--store", remote, store=store)
    assert (result.returncode, result.stderr, result.stdout) == (1, f"{store}: no space left on device\n", "")
    assert os.listdir(full_disk) == ["filler"]  # the store this pull made stored nothing: it is gone, unannounced
    LocalStore(store).create()  # a store that was there stays, and still verifies
    again = trtbuild("pull", lock, "--target", "base-tp1", "--store", remote, store=store)
    assert (again.returncode, again.stderr, again.stdout) == (1, f"{store}: no space left on device\n", "")
    assert files(store / "tmp") == [] and store.joinpath("checkouts").is_dir() and files(store / "checkouts") == []
    verified(store)


# ---- --dest on a full or read-only file system -------------------------------------------------------
def test_dest_on_a_full_disk_is_one_line_and_nothing_half_written(built, tmp_path, full_disk):
    remote, lock = built
    dest = full_disk / "serve"
    result = trtbuild("pull", lock, "--target", "base-tp1", "--store", remote, "--dest", dest, store=tmp_path / "local")
    assert (result.returncode, result.stderr, result.stdout) == (  # the local store got base-tp1 before --dest failed
        1, f"new store at {tmp_path / 'local'}\n--dest {dest}: cannot write it (No space left on device)\n", "")
    assert os.listdir(full_disk) == ["filler"]  # no dest, no .serve.partial-* folder
    verified(tmp_path / "local")


@pytest.mark.parametrize("below", ["serve", "new/serve"], ids=["in-the-folder", "in-a-folder-to-create"])
def test_dest_on_a_read_only_file_system_is_one_line_and_nothing_written(built, tmp_path, read_only, below):
    remote, lock = built
    folder = read_only(tmp_path / "ro")
    dest = folder / below
    result = trtbuild("pull", lock, "--target", "base-tp1", "--store", remote, "--dest", dest, store=tmp_path / "local")
    assert (result.returncode, result.stderr, result.stdout) == (  # the local store got base-tp1 before --dest failed
        2, f"new store at {tmp_path / 'local'}\n--dest {dest}: cannot write it (Read-only file system)\n", "")
    assert os.listdir(folder) == []
    verified(tmp_path / "local")


# ---- the lock file and the store on read-only folders ------------------------------------------------
def test_a_lock_file_in_a_read_only_folder_is_one_line_naming_it(tmp_path, read_only):
    recipe = project(tmp_path / "project")
    read_only(recipe.parent)
    store = tmp_path / "store"
    result = trtbuild("build", recipe, "--until", "source", "--json", store=store)
    progress = [f"{status:>10} {name} ({stage}, Ns){detail}" for status, name, stage, detail in (
        ("built", "source", "source", " 000be9c80b6e"), *(("skipped", name, stage, "  after --until source") for name, stage in (
            ("base-tp1", "checkpoint"), ("reference", "reference"), ("base-tp1:validate", "validate"),
            ("base-tp1-sm90:twin", "engine"), ("base-tp1-sm90:validate", "validate"), ("base-tp1-sm90", "engine"))))]
    # the stages' lines (on stderr beside --json's stdout), then the one line of the failure
    assert (result.returncode, re.sub(r", \d+\.\ds\)", ", Ns)", result.stderr), result.stdout) == (
        2, f"new store at {store}\n" + "".join(f"{line}\n" for line in progress)
        + f"{recipe.with_suffix('.lock')}: read-only file system\n", "")
    assert sorted(os.listdir(recipe.parent)) == ["model", "tiny.yaml"]  # no temporary lock left behind
    verified(store)


def test_a_read_only_store_is_one_line_naming_it(built, tmp_path, read_only):
    remote, lock = built
    store = tmp_path / "store"
    shutil.copytree(remote, store)
    before = files(store)
    read_only(store)
    result = trtbuild("build", lock.with_suffix(".yaml"), "--until", "source", store=store)
    assert (result.returncode, result.stderr) == (2, f"{store}/locks/store.lock: read-only file system\n")
    assert files(store) == before
