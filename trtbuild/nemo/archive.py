"""Open a NeMo source (.nemo tar, extracted .nemo folder, NeMo 2 folder) and extract tars safely."""

from __future__ import annotations

import os
import posixpath
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from trtbuild.errors import InvalidInput

# Generous defaults: a 405B bf16 .nemo is ~810 GB and holds a few thousand members at most.
DEFAULT_MAX_TOTAL_BYTES = 4 << 40  # 4 TiB
DEFAULT_MAX_MEMBERS = 200_000


@dataclass(frozen=True)
class Limits:
    """Caps checked before anything is written: a tar bomb fails fast instead of filling the disk."""

    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES
    max_members: int = DEFAULT_MAX_MEMBERS
    max_member_bytes: int | None = None  # None: only the total applies


@dataclass(frozen=True)
class Opened:
    """Where the checkpoint's files are on disk, and what form the source had."""

    root: Path          # the folder holding model_config.yaml, or context/ + weights/
    form: str           # "nemo-tar", "nemo-dir" or "nemo2-dir"
    compressed: bool = False


def open_source(source: Path, work: Path, limits: Limits | None = None) -> Opened:
    """Return the folder to read: a tar is extracted under `work`, folders are used in place."""
    source = Path(source)
    if source.is_dir():
        if (source / "context").is_dir():
            return Opened(source, "nemo2-dir")
        if (source / "model_config.yaml").is_file():
            return Opened(source, "nemo-dir")
        raise InvalidInput(f"{source}: not a NeMo checkpoint folder (no model_config.yaml, no context/)")
    if not source.is_file():
        raise InvalidInput(f"{source}: no such file or folder")
    dest = Path(work) / "nemo"
    dest.mkdir(parents=True, exist_ok=True)
    compressed = extract(source, dest, limits)
    if (dest / "context").is_dir():  # a NeMo 2 folder someone tarred up
        return Opened(dest, "nemo2-dir", compressed)
    if not (dest / "model_config.yaml").is_file():
        raise InvalidInput(f"{source}: archive has no model_config.yaml (not a .nemo file)")
    return Opened(dest, "nemo-tar", compressed)


def _open_tar(path: Path) -> tuple[tarfile.TarFile, bool]:
    # nemo.md section 1: written "w:" since Feb 2022, "w:gz" before; NeMo's _tar_open tries r: then r:gz.
    try:
        return tarfile.open(path, "r:"), False
    except tarfile.ReadError:
        pass
    try:
        return tarfile.open(path, "r:gz"), True
    except (tarfile.ReadError, OSError) as e:
        raise InvalidInput(f"{path}: not a .nemo archive (neither a tar nor a gzipped tar): {e}") from None


def _safe_name(name: str) -> str | None:
    """The member's normalized relative name, or None if it would land outside the destination."""
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return None
    norm = posixpath.normpath(name.replace("\\", "/"))
    if norm == ".":
        return "."
    if norm.startswith("/") or norm == ".." or norm.startswith("../") or ".." in norm.split("/"):
        return None
    return norm


def _check_members(path: Path, tar: tarfile.TarFile, limits: Limits) -> list[tarfile.TarInfo]:
    """Vet every member before writing anything: one bad member rejects the whole archive."""
    members: list[tarfile.TarInfo] = []
    total = 0
    for m in tar:
        if len(members) >= limits.max_members:
            raise InvalidInput(f"{path}: more than {limits.max_members} members (limit)")
        name = _safe_name(m.name)
        if name is None:
            raise InvalidInput(f"{path}: unsafe member name {m.name!r} (absolute or '..')")
        if m.isdev() or m.isfifo() or not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
            raise InvalidInput(f"{path}: member {m.name!r} is a device, fifo or other special file")
        if m.issparse():
            raise InvalidInput(f"{path}: member {m.name!r} is a sparse file (not allowed)")
        if m.issym():
            if m.linkname.startswith("/") or _safe_name(posixpath.join(posixpath.dirname(name), m.linkname)) is None:
                raise InvalidInput(f"{path}: member {m.name!r} links outside the archive ({m.linkname!r})")
        if m.islnk() and _safe_name(m.linkname) is None:
            raise InvalidInput(f"{path}: member {m.name!r} hard-links outside the archive ({m.linkname!r})")
        if limits.max_member_bytes is not None and m.size > limits.max_member_bytes:
            raise InvalidInput(f"{path}: member {m.name!r} is {m.size} bytes (limit {limits.max_member_bytes})")
        total += m.size
        if total > limits.max_total_bytes:
            raise InvalidInput(f"{path}: members total more than {limits.max_total_bytes} bytes (limit)")
        members.append(m)
    return members


def _inside(dest: Path, target: Path) -> bool:
    real_dest = os.path.realpath(dest)
    real = os.path.realpath(target)
    return real == real_dest or real.startswith(real_dest + os.sep)


def extract(path: Path, dest: Path, limits: Limits | None = None) -> bool:
    """Extract `path` into `dest` after vetting all members; returns whether it was gzipped."""
    limits = limits or Limits()
    tar, compressed = _open_tar(path)
    try:
        with tar:
            _extract_members(path, tar, dest, limits)
    except (tarfile.TarError, EOFError, zlib.error) as exc:  # truncated or corrupt after a good header
        raise InvalidInput(f"{path}: malformed .nemo archive ({type(exc).__name__}: {exc})") from None
    return compressed


def _extract_members(path: Path, tar: tarfile.TarFile, dest: Path, limits: Limits) -> None:
    members = _check_members(path, tar, limits)
    has_filter = hasattr(tarfile, "data_filter")  # Python >= 3.11.4 / 3.12 (PEP 706)
    for m in members:
        name = _safe_name(m.name)
        if name == ".":
            continue
        # Re-check against the disk as it is now: an earlier symlink member could redirect a path.
        if not _inside(dest, dest / name):
            raise InvalidInput(f"{path}: member {m.name!r} resolves outside the destination")
        if has_filter:
            try:
                tar.extract(m, dest, filter="data")
            except tarfile.FilterError as e:
                raise InvalidInput(f"{path}: member {m.name!r} rejected: {e}") from None
            except OSError as e:  # a name too long, a file where an earlier member made a folder, ...
                raise InvalidInput(f"{path}: member {m.name!r}: cannot write it ({e.strerror or e})") from None
            except KeyError:  # tarfile's answer to a hard link whose target it does not hold
                raise InvalidInput(f"{path}: member {m.name!r} hard-links {m.linkname!r}, which the archive "
                                   "does not hold") from None
        else:  # our own checks above are the guard; drop special bits, keep it removable by us
            m.mode = (m.mode & 0o755) | (0o700 if m.isdir() else 0o600)
            try:
                tar.extract(m, dest, set_attrs=False)
            except OSError as e:
                raise InvalidInput(f"{path}: member {m.name!r}: cannot write it ({e.strerror or e})") from None
            except KeyError:  # tarfile's answer to a hard link whose target it does not hold
                raise InvalidInput(f"{path}: member {m.name!r} hard-links {m.linkname!r}, which the archive "
                                   "does not hold") from None
