"""Manifests and tree digests: an artifact is the canonical JSON list of its files
(relative POSIX path, size, sha256, executable bit); its digest is the sha256 of that JSON."""

from __future__ import annotations

import os
import stat as statmod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Optional

from trtbuild.errors import TrtbuildError
from trtbuild.keys import canonical_json
from trtbuild.store.hash import Progress, bytes_sha256, is_digest
from trtbuild.store.state import StatCache


class BadTree(TrtbuildError):
    """A folder or manifest that cannot be an artifact (links leaving it, unsafe paths, bad digests)."""


@dataclass(frozen=True)
class Entry:
    path: str  # relative POSIX path
    size: int
    sha256: str
    executable: bool = False

    def as_json(self) -> dict:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "executable": self.executable}


@dataclass(frozen=True)
class Manifest:
    entries: tuple[Entry, ...]

    def to_bytes(self) -> bytes:
        return canonical_json([e.as_json() for e in self.entries])

    @property
    def digest(self) -> str:
        return bytes_sha256(self.to_bytes())

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    @classmethod
    def from_entries(cls, entries: Iterable[Entry], name: str = "manifest") -> "Manifest":
        ordered = tuple(sorted(entries, key=lambda e: e.path))
        for a, b in zip(ordered, ordered[1:]):
            if a.path == b.path:
                raise BadTree(f"{name} lists {a.path!r} twice")
        files = {e.path for e in ordered}
        for e in ordered:  # a checkout could not make both the file and the folder
            folder = next((str(f) for f in PurePosixPath(e.path).parents if str(f) in files), None)
            if folder is not None:
                raise BadTree(f"{name} lists {folder!r} as a file and as the folder of {e.path!r}")
        return cls(ordered)

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "manifest") -> "Manifest":
        """Parse and check a stored manifest: safe relative paths, real digests, nothing else."""
        import json

        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadTree(f"{name}: not a JSON manifest ({exc})") from None
        if not isinstance(raw, list):
            raise BadTree(f"{name}: a manifest is a JSON list of entries")
        entries = []
        for item in raw:
            if not isinstance(item, dict) or set(item) != {"path", "size", "sha256", "executable"}:
                raise BadTree(f"{name}: malformed entry {item!r}")
            check_relative(item["path"], name)
            if not (isinstance(item["size"], int) and item["size"] >= 0 and isinstance(item["sha256"], str)
                    and is_digest(item["sha256"]) and isinstance(item["executable"], bool)):
                raise BadTree(f"{name}: malformed entry for {item['path']!r}")
            entries.append(Entry(item["path"], item["size"], item["sha256"], item["executable"]))
        return cls.from_entries(entries, name)


NAME_MAX = 255  # bytes in one file name: ext4, XFS, btrfs, APFS and NTFS all stop there


def check_relative(path: object, where: str) -> None:
    """Manifests with absolute paths, `..`, empty parts, backslashes, NUL or names too long for a file
    system are rejected (design.md s.4)."""
    if not isinstance(path, str) or not path:
        raise BadTree(f"{where}: entry path {path!r} is not a relative path")
    parts = PurePosixPath(path).parts
    if path.startswith("/") or "\\" in path or any(p in ("..", ".", "") for p in path.split("/")) or not parts:
        raise BadTree(f"{where}: unsafe path {path!r} (absolute, '..' or not normalized)")
    if "\x00" in path:  # no file system can name it
        raise BadTree(f"{where}: unsafe path {path!r} (a NUL byte)")
    long = next((p for p in path.split("/") if len(p.encode("utf-8", "surrogatepass")) > NAME_MAX), None)
    if long is not None:
        raise BadTree(f"{where}: unsafe path {path[:80]!r}... (a name of {len(long.encode('utf-8', 'surrogatepass'))} "
                      f"bytes; file systems hold {NAME_MAX})")


def walk_files(root: Path, include: Optional[Callable[[str], bool]] = None,
               links_within: Optional[Path] = None) -> list[tuple[str, Path, bool]]:
    """(relative path, file to read, executable) for every file under root. A symlink is stored as
    the file it points to when that file is inside root (or inside `links_within`, a folder that
    encloses root); a link leaving it rejects the tree."""
    root = root.resolve()
    fence = links_within.resolve() if links_within is not None else root
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(dirnames):
            if (base / name).is_symlink():  # os.walk does not descend into linked folders
                raise BadTree(f"{base / name}: links to a folder are not stored in artifacts")
        for name in sorted(filenames):
            path = base / name
            rel = path.relative_to(root).as_posix()
            if include is not None and not include(rel):
                continue
            target = path
            if path.is_symlink():
                target = path.resolve()
                if not target.is_relative_to(fence):
                    raise BadTree(f"{path}: symlink points outside the artifact ({os.readlink(path)})")
                if not target.is_file():
                    raise BadTree(f"{path}: symlink does not point to a file")
            st = target.stat()
            if not statmod.S_ISREG(st.st_mode):
                raise BadTree(f"{path}: not a regular file")
            found.append((rel, target, bool(st.st_mode & 0o111)))
    return found


def build_manifest(root: Path, state: StatCache, include: Optional[Callable[[str], bool]] = None,
                   progress: Progress = None, workers: Optional[int] = None,
                   links_within: Optional[Path] = None) -> tuple[Manifest, dict[str, Path]]:
    """Hash a folder in parallel (stat cache first) into its manifest; also returns where each
    entry's bytes are, so the caller can ingest them without walking again."""
    files = walk_files(root, include, links_within)

    def one(item: tuple[str, Path, bool]) -> Entry:
        rel, path, executable = item
        return Entry(rel, path.stat().st_size, state.sha256(path, progress), executable)

    with ThreadPoolExecutor(max_workers=workers or min(8, (os.cpu_count() or 2))) as pool:
        entries = list(pool.map(one, files))
    return Manifest.from_entries(entries), {rel: path for rel, path, _ in files}
