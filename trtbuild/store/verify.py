"""`cache verify`: re-hash every blob and manifest (no stat cache) and check every record and ref."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trtbuild.errors import TrtbuildError
from trtbuild.store.hash import bytes_sha256, file_sha256, is_digest
from trtbuild.store.local import LocalStore
from trtbuild.store.tree import BadTree, Manifest


def verify(store: LocalStore, progress=None) -> list[str]:
    """One line per bad object, naming it; an empty list means the store is sound."""
    problems: list[str] = []
    blobs = sorted(p for p in (store.root / "cas" / "sha256").glob("*/*") if p.is_file())

    def check_blob(path: Path) -> str | None:
        if not is_digest(path.name) or path.parent.name != path.name[:2]:
            return f"{path}: not a blob name"
        actual = file_sha256(path, progress)
        if actual != path.name:
            return f"{path}: corrupt blob (content hashes to {actual})"
        store.state.put(path, path.stat(), actual)  # the verified hash refreshes the stat cache
        return None

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 2)) as pool:
        problems += [p for p in pool.map(check_blob, blobs) if p]
    present = {p.name for p in blobs}

    manifests: dict[str, Manifest] = {}
    for path in sorted((store.root / "manifests").glob("*.json")):
        data = path.read_bytes()
        if bytes_sha256(data) != path.stem:
            problems.append(f"{path}: corrupt or tampered manifest (content does not hash to its name)")
            continue
        try:
            manifest = Manifest.from_bytes(data, str(path))
        except BadTree as exc:
            problems.append(str(exc))
            continue
        manifests[path.stem] = manifest
        for entry in manifest.entries:
            if entry.sha256 not in present:
                problems.append(f"{path}: names blob {entry.sha256} ({entry.path}), which is missing")

    for path in sorted((store.root / "ac").glob("*.json")):
        if path.name.endswith(".divergent.json"):
            continue
        try:
            record = store.get_record(path.stem)
        except TrtbuildError as exc:
            problems.append(str(exc))
            continue
        if record is None:
            problems.append(f"{path}: action record of an older layout (it is rebuilt at the next build)")
        elif record.digest not in manifests and not store.manifest_path(record.digest).exists():
            problems.append(f"{path}: names artifact {record.digest}, whose manifest is missing")

    for recipe, target, ref in store.refs():
        if ref.digest not in manifests:
            problems.append(f"{store.ref_path(recipe, target)}: points at artifact {ref.digest}, whose manifest is missing or bad")
    return problems
