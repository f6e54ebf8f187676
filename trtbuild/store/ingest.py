"""Folder ingest, the byte path: a folder's files hashed into a manifest and their bytes put into
cas/ (taken, linked or copied). The store decides where blobs live and whether one is already
there; this module moves the bytes.

A copy reads each byte once more than the hash that named it, unless the file system does the
copying: when the stat cache vouches for the source as it is now (hashed when its stat was the
same, settled), the bytes go by reflink (FICLONE: btrfs, XFS, bcachefs; a copy-on-write clone, so a
later edit of the source never reaches the blob) or else by copy_file_range (the kernel copies page
to page, nothing passes through Python), and the source's stat is compared before and after: a
source written meanwhile moves its ctime (nobody can set it back), and the copy is redone while
hashing, refused unless it hashes to the digest. Without the stat cache's word (a file changed in
the tick it was hashed, a store without index.db) or on a file system that does neither, the copy
hashes every byte it writes, from the same buffer. A user's folder is never hard-linked: a link
shares the inode, so an edit of the user's file would change the blob (DVC protects linked files by
making the workspace read-only; trtbuild does not change the user's files); only files nobody edits
in place (a download cache's, `link`) are.

Files are put in parallel (each copy's fsync waits on the disk while another file is copied).
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

from trtbuild import fsfaults
from trtbuild.store.errors import CorruptStore
from trtbuild.store.hash import Progress, copy_with_sha256, fsync_dir
from trtbuild.store.state import StatCache, settled
from trtbuild.store.tree import Manifest, build_manifest

PutBlob = Callable[..., None]  # put_blob(source, digest, owned=..., link=...)

FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h
# What a file system or kernel answers when it cannot clone or copy in the kernel: try the next way.
NOT_HERE = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.EBADF}
WORKERS = 4  # files in flight: enough to keep a disk busy while the other core copies


def ingest_folder(folder: Path, state: StatCache, put_blob: PutBlob, owned: bool, progress: Progress = None,
                  include=None, links_within: Optional[Path] = None, link: bool = False) -> Manifest:
    """Hash `folder`'s files into a manifest (through the stat cache), then put each distinct
    file's bytes into the store (put_blob), several files at a time."""
    manifest, sources = build_manifest(folder, state, include=include, progress=progress,
                                       links_within=links_within)
    distinct = {e.sha256: e for e in manifest.entries}  # two files, one blob: put once
    workers = min(WORKERS, len(distinct))
    if workers <= 1:
        for entry in distinct.values():
            put_blob(sources[entry.path], entry.sha256, owned=owned, link=link)
        return manifest
    with ThreadPoolExecutor(workers, thread_name_prefix="trtbuild-ingest") as pool:
        for done in [pool.submit(put_blob, sources[e.path], e.sha256, owned=owned, link=link)
                     for e in distinct.values()]:
            done.result()
    return manifest


def write_blob(source: Path, digest: str, blob: Path, tmp: Path, state: StatCache, owned: bool = False,
               link: bool = False) -> None:
    """Put `source` at `blob` through `tmp` (a temp name in the store's tmp/): renamed when `owned`,
    hard-linked when `link`, else copied (copy_blob), durable before the rename. The blob is made
    0444 before its stat cache entry is written (see LocalStore.put_blob)."""
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
                copy_blob(source, tmp, digest, state)
            except OSError as exc:
                if not fsfaults.is_fault(exc):
                    raise
                raise fsfaults.at(exc, blob) from exc  # the blob it would be, not the temp file
        os.chmod(tmp, 0o444)
        os.replace(tmp, blob)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(blob.parent)
    state.put(blob, blob.stat(), digest)  # after chmod and rename: both move the ctime


def copy_blob(source: Path, dest: Path, digest: str, state: StatCache) -> str:
    """Copy `source` (whose sha256 is `digest`) to the new file `dest`, fsynced; returns how:
    "reflink" or "kernel" when the stat cache vouched for the source and it stayed unchanged
    throughout, else "hashed" (each byte hashed as it is written). CorruptStore when the bytes
    copied do not hash to `digest` (the source changed)."""
    how = _copy_vouched(source, dest, digest, state)
    if how is not None:
        return how
    copied = copy_with_sha256(source, dest)
    if copied != digest:
        raise CorruptStore(f"{source}: changed while it was stored (sha256 {copied}, expected {digest})")
    return "hashed"


def _copy_vouched(source: Path, dest: Path, digest: str, state: StatCache) -> Optional[str]:
    """The copy without reading the bytes into Python, when the stat cache says the source, with
    its stat as it is now, hashes to `digest`, and the source is unchanged after the copy (a write
    after `started` moves its ctime past `before`'s, which `settled` put a whole tick earlier).
    None when that cannot be vouched for or the file system does neither copy (dest then empty)."""
    source = Path(os.path.abspath(source))
    started = time.time_ns()
    with open(source, "rb") as fin:
        before = os.fstat(fin.fileno())
        if state.get(source, before) != digest or not settled(before, started):
            return None
        with open(dest, "wb") as fout:
            how = _clone(fin.fileno(), fout.fileno(), before.st_size)
            if how is None:
                return None
            if state.get(source, os.fstat(fin.fileno())) != digest:
                fout.truncate(0)
                return None  # written to meanwhile: copied again while hashing, and judged by its hash
            os.fsync(fout.fileno())
    return how


def _clone(fin: int, fout: int, size: int) -> Optional[str]:
    """Reflink `fin` into `fout`, else copy it in the kernel; None when the file system does neither."""
    try:
        fcntl.ioctl(fout, FICLONE, fin)
        return "reflink"
    except OSError as exc:
        if exc.errno not in NOT_HERE:
            raise
    copied = 0
    try:
        while copied < size:
            n = os.copy_file_range(fin, fout, size - copied, copied, copied)
            if n == 0:  # the file is shorter than its stat said: it changed; the caller's check sees it
                break
            copied += n
    except OSError as exc:
        if exc.errno not in NOT_HERE:
            raise
        os.ftruncate(fout, 0)
        return None
    return "kernel"
