"""Materialize an artifact as a folder: hard links to the read-only blobs when on the same
filesystem, verified copies otherwise; every blob is checked against its digest first (through the
stat cache: a blob the store wrote and protected, unchanged since, is trusted without a re-read)."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from trtbuild.errors import InvalidInput
from trtbuild.store.base import CorruptStore, Store
from trtbuild.store.tree import Manifest


def _verified(store: Store, digest: str) -> Manifest:
    """The manifest, each blob checked against its digest and against the size the manifest lists
    (a blob is the size its hash says; a manifest listing another size is refused before anything
    is placed)."""
    manifest = store.get_manifest(digest)
    for entry in manifest.entries:
        store.verify_blob(entry.sha256)
        blob = store.blob_file(entry.sha256)
        if blob is not None and blob.stat().st_size != entry.size:
            raise CorruptStore(f"manifest {digest}: {entry.path!r} is listed with {entry.size} bytes, its blob "
                               f"{entry.sha256} has {blob.stat().st_size}")
    return manifest


def _whole(folder: Path, manifest: Manifest) -> bool:
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


def materialize(store: Store, digest: str) -> Path:
    """The store's checkout of the artifact, read-only; built once, verified each time. It is
    assembled in a tmp work folder and renamed into place, so a checkout that exists is complete,
    and nothing is ever written into its files (they are the blobs themselves)."""
    manifest = _verified(store, digest)
    work_area = store.workspace("checkout")
    final = work_area.checkout_path(digest)
    if _whole(final, manifest):
        return final
    with work_area.checkout_lock(digest):
        if _whole(final, manifest):  # another process finished it while we waited
            return final
        if final.exists():  # not made by this code (renames are atomic): rebuild it
            work_area.remove_checkout(digest)
        # the work folder goes however the block ends (a full disk, Ctrl-C): no half-made checkout
        # in tmp/; once renamed into place there is nothing left to remove
        with work_area.work_folder(f"checkout-{digest[:12]}") as work:
            work.chmod(0o755)
            for entry in manifest.entries:
                dest = work / entry.path
                dest.parent.mkdir(parents=True, exist_ok=True)
                store.place_blob(entry.sha256, dest, entry.executable)
            os.rename(work, final)
    return final


def _no_link_on_the_way(dest: Path, rel: str) -> None:
    """A folder of `dest` that is a link would take the file elsewhere (mkdir and open follow it)."""
    at = dest
    for part in PurePosixPath(rel).parts[:-1]:
        at = at / part
        if at.is_symlink():
            raise InvalidInput(f"{at}: a link in the destination (to {os.readlink(at)}); remove it first")


def checkout(store: Store, digest: str, dest: Path) -> Path:
    """Materialize into a folder outside the store (copies unless the filesystem allows links)."""
    manifest = _verified(store, digest)
    for entry in manifest.entries:
        _no_link_on_the_way(dest, entry.path)
    for entry in manifest.entries:
        target = dest / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            target.unlink()
        store.place_blob(entry.sha256, target, entry.executable)
    return dest
