"""Materialize an artifact as a folder: hard links to the read-only blobs when on the same
filesystem, verified copies otherwise; every blob is checked against its digest first."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from filelock import FileLock

from trtbuild.store.hash import copy_with_sha256
from trtbuild.store.local import CorruptStore, LocalStore

def _place(store: LocalStore, digest: str, executable: bool, dest: Path) -> None:
    blob = store.blob_path(digest)
    if not executable:
        try:
            os.link(blob, dest)
            return
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
    copied = copy_with_sha256(blob, dest)
    if copied != digest:
        raise CorruptStore(f"blob {blob} is corrupt: its sha256 is {copied}; run `trtbuild cache verify`")
    os.chmod(dest, 0o555 if executable else 0o444)


def _whole(folder: Path, manifest) -> bool:
    """Every file of the manifest is there with its size (a cheap check; blobs are verified apart)."""
    if not folder.is_dir():
        return False
    for entry in manifest.entries:
        try:
            if (folder / entry.path).stat().st_size != entry.size:
                return False
        except FileNotFoundError:
            return False
    return True


def materialize(store: LocalStore, digest: str) -> Path:
    """checkouts/<digest>/ holding the artifact's files, read-only; built once, verified each time.
    It is assembled under tmp/ and renamed into place, so a checkout that exists is complete, and
    nothing is ever written into its files (they are the blobs themselves)."""
    manifest = store.get_manifest(digest)
    for entry in manifest.entries:
        store.verify_blob(entry.sha256)
    final = store.checkout_path(digest)
    if _whole(final, manifest):
        return final
    with FileLock(str(store.root / "locks" / f"checkout-{digest}.lock")):
        if _whole(final, manifest):  # another process finished it while we waited
            return final
        if final.exists():  # not made by this code (renames are atomic): rebuild it
            shutil.rmtree(final)
        work = store.tmpdir(f"checkout-{digest[:12]}")
        work.chmod(0o755)
        for entry in manifest.entries:
            dest = work / entry.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            _place(store, entry.sha256, entry.executable, dest)
        os.rename(work, final)
    return final


def checkout(store: LocalStore, digest: str, dest: Path) -> Path:
    """Materialize into a folder outside the store (copies unless the filesystem allows links)."""
    manifest = store.get_manifest(digest)
    for entry in manifest.entries:
        store.verify_blob(entry.sha256)
        target = dest / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            target.unlink()
        _place(store, entry.sha256, entry.executable, target)
    return dest
