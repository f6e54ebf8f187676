"""File digests: sha256 in large chunks (hashlib releases the GIL, so threads hash in parallel)."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Callable, Optional

CHUNK = 4 * 1024 * 1024
Progress = Optional[Callable[[int], None]]  # called with the number of bytes just processed


def _chunks(f, progress: Progress = None):
    """The file's bytes in CHUNK-sized views of one reused buffer (each valid until the next)."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    while True:
        n = f.readinto(buffer)
        if not n:
            return
        yield view[:n]
        if progress:
            progress(n)


def file_sha256(path: str | os.PathLike, progress: Progress = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        for chunk in _chunks(f, progress):
            digest.update(chunk)
    return digest.hexdigest()


def copy_with_sha256(src: str | os.PathLike, dst: str | os.PathLike, progress: Progress = None) -> str:
    """Copy src to dst (fsynced) and return the sha256 of what was written: one read, not two (the
    bytes are hashed and written from the same buffer)."""
    digest = hashlib.sha256()
    with open(src, "rb", buffering=0) as fin, open(dst, "wb", buffering=0) as fout:
        for chunk in _chunks(fin, progress):
            digest.update(chunk)
            _write_all(fout, chunk)
        os.fsync(fout.fileno())
    return digest.hexdigest()


def _write_all(out, data: memoryview) -> None:
    """An unbuffered write may take only part of `data` (a disk that is filling up) without an error;
    write the rest until it is all written or the disk says why not (ENOSPC)."""
    while data:
        data = data[out.write(data):]


def bytes_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_digest(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write to a temp file beside `path`, fsync, rename, fsync the folder: all or nothing. A
    failure (a full disk, a read-only folder) is raised naming `path`, not the temp file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):  # on a read-only folder, removing fails as creating did
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    fsync_dir(path.parent)
