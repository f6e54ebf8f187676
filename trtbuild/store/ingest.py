"""Folder ingest, the byte path: a folder's files hashed into a manifest and their bytes put into
cas/ (taken, linked or copied while hashing). The store decides where blobs live and whether one is
already there; this module moves the bytes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

from trtbuild import fsfaults
from trtbuild.store.base import CorruptStore
from trtbuild.store.hash import Progress, copy_with_sha256, fsync_dir
from trtbuild.store.state import StatCache
from trtbuild.store.tree import Manifest, build_manifest

PutBlob = Callable[..., None]  # put_blob(source, digest, owned=..., link=...)


def ingest_folder(folder: Path, state: StatCache, put_blob: PutBlob, owned: bool, progress: Progress = None,
                  include=None, links_within: Optional[Path] = None, link: bool = False) -> Manifest:
    """Hash `folder`'s files into a manifest, then put each file's bytes into the store (put_blob)."""
    manifest, sources = build_manifest(folder, state, include=include, progress=progress,
                                       links_within=links_within)
    for entry in manifest.entries:
        put_blob(sources[entry.path], entry.sha256, owned=owned, link=link)
    return manifest


def write_blob(source: Path, digest: str, blob: Path, tmp: Path, state: StatCache, owned: bool = False,
               link: bool = False) -> None:
    """Put `source` at `blob` through `tmp` (a temp name in the store's tmp/): renamed when `owned`,
    hard-linked when `link`, else copied while hashing and refused unless the copy hashes to
    `digest`. The blob is made 0444 before its stat cache entry is written (see LocalStore.put_blob)."""
    blob.parent.mkdir(parents=True, exist_ok=True)
    try:
        placed = False
        if owned or link:
            try:
                (os.replace if owned else os.link)(source, tmp)
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                placed = True
            except OSError:
                placed = False
        if not placed:
            try:
                copied = copy_with_sha256(source, tmp)
            except OSError as exc:
                if not fsfaults.is_fault(exc):
                    raise
                raise fsfaults.at(exc, blob) from exc  # the blob it would be, not the temp file
            if copied != digest:
                raise CorruptStore(f"{source}: changed while it was stored (sha256 {copied}, expected {digest})")
        os.chmod(tmp, 0o444)
        os.replace(tmp, blob)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(blob.parent)
    state.put(blob, blob.stat(), digest)  # after chmod and rename: both move the ctime
