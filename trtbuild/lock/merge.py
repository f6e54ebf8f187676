"""`trtbuild lock merge`: the per-job locks of a CI matrix (each job builds a slice and writes only
its targets, `build --lock-out`) become the recipe's one lock.

Deterministic: the inputs are read in path order, and the lock is written with sorted keys, so the
same inputs in any order give the same bytes. Locks that disagree cannot be merged honestly and are
refused, one line: another recipe version or source, another validation mode, another toolchain for
a stage, one target with two artifacts, or an entry made from another artifact than the one the
merged lock names for its input (a validation of another checkpoint: an answer about something else).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import yaml

from trtbuild.lock import lockfile
from trtbuild.errors import InvalidInput
from trtbuild.lock.lockfile import LockedTarget, LockFile
from trtbuild.store.hash import atomic_write

HEADER = "# Written by `trtbuild lock merge`: commit it; `trtbuild build --locked` checks against it. Do not edit.\n"
TAKES = "lock merge takes the lock files `trtbuild build --lock-out PATH` writes (one per CI job)"


def merge(paths: list[Path]) -> LockFile:
    """One lock holding every input's targets; InvalidInput (one line) when two inputs disagree."""
    locks: list[tuple[Path, LockFile]] = []
    for path in sorted(paths, key=str):  # path order: the same inputs name the same culprits in any order
        lock = _read(path)
        if lock is None:
            raise InvalidInput(f"lock merge: {path}: no such lock file")
        locks.append((path, lock))
    first_path, first = locks[0]
    toolchain: dict[str, tuple[Path, dict]] = {}
    targets: dict[str, tuple[Path, LockedTarget]] = {}
    for path, lock in locks:
        _same_build(first_path, first, path, lock)
        for stage, versions in lock.toolchain.items():
            seen = toolchain.setdefault(stage, (path, versions))
            if seen[1] != versions:  # one lock records one toolchain per stage
                raise InvalidInput(f"lock merge: toolchain of stage {stage}: {path} has {_versions(versions)}, "
                                   f"{seen[0]} has {_versions(seen[1])}; every job must build in the same image")
        for target_id, entry in lock.targets.items():
            seen_path, seen = targets.setdefault(target_id, (path, entry))
            if seen != entry:
                raise InvalidInput(_conflict(target_id, seen_path, seen, path, entry))
    for target_id, (path, entry) in sorted(targets.items()):
        for dep, digest in sorted((entry.inputs or {}).items()):
            if dep in targets and targets[dep][1].digest != digest:
                dep_path, named = targets[dep]
                raise InvalidInput(f"lock merge: target {target_id}: {path} records it as made from {dep} {digest}, "
                                   f"{dep_path} has {dep} {named.digest}; merge the --lock-out locks of one CI run")
    return LockFile(recipe=first.recipe, source=first.source, validation=first.validation,
                    toolchain={stage: versions for stage, (_, versions) in sorted(toolchain.items())},
                    targets={tid: entry for tid, (_, entry) in sorted(targets.items())})


def write_merged(paths: list[Path], out: Path) -> LockFile:
    """Merge, then write `out` atomically: on any error it is left as it was."""
    merged = merge(paths)
    try:
        atomic_write(out, lockfile.render(merged, HEADER))
    except OSError as exc:
        raise InvalidInput(f"lock merge: cannot write {out}: {exc.strerror or exc}") from None
    return merged


def _read(path: Path) -> Optional[LockFile]:
    """A job's lock; a recipe given in its place (`lock merge RECIPE`) is named as one, with what
    lock merge takes, instead of a lock reader's advice about rebuilding."""
    try:
        return lockfile.read(path)
    except InvalidInput:
        if _is_recipe(path):
            raise InvalidInput(f"lock merge: {path} is a recipe, not a lock file; {TAKES}") from None
        raise


def _is_recipe(path: Path) -> bool:
    """A YAML mapping with a recipe's `name:` and no `targets:` (a lock has `recipe:` and `targets:`)."""
    try:
        text = path.read_text()
        if lockfile._too_deep(text):
            return False
        data = yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):  # (UnicodeDecodeError is a ValueError)
        return False
    return isinstance(data, dict) and "name" in data and "targets" not in data


def _same_build(first_path: Path, first: LockFile, path: Path, lock: LockFile) -> None:
    """What is one per lock must be one across the jobs."""
    if lock.recipe != first.recipe:
        raise InvalidInput(f"lock merge: {path} is of recipe {lock.recipe.name} at {lock.recipe.digest}, {first_path} "
                           f"of {first.recipe.name} at {first.recipe.digest}; merge the locks of one CI run "
                           "(one version of the recipe)")
    if lock.source != first.source:
        raise InvalidInput(f"lock merge: {path} pins source {_source(lock.source)}, {first_path} at "
                           f"{_source(first.source, digest_only=True)}; every job must build from one source "
                           "(build --locked)")
    if lock.validation != first.validation:
        raise InvalidInput(f"lock merge: {path} records validation {lock.validation!r}, {first_path} "
                           f"{first.validation!r}; merge locks of builds that all validated, or all ran --no-validate")


def _conflict(target_id: str, a_path: Path, a: LockedTarget, b_path: Path, b: LockedTarget) -> str:
    head = f"lock merge: target {target_id}: "
    if a.digest == b.digest and a.key == b.key:
        fields = [name for name in LockedTarget.model_fields if getattr(a, name) != getattr(b, name)]
        return f"{head}{a_path} and {b_path} record artifact {a.digest} differently ({', '.join(fields)})"
    why = (f"same key {a.key}: a stage that is not bit-reproducible built it in both jobs" if a.key == b.key
           else f"keys {a.key} and {b.key}: built from different inputs")
    return f"{head}{a_path} has artifact {a.digest}, {b_path} has {b.digest} ({why})"


def _source(source: Optional[dict[str, Any]], digest_only: bool = False) -> str:
    if not source:
        return "none"
    if digest_only:
        return str(source.get("digest"))
    return f"{source.get('kind')} {source.get('location')} at {source.get('digest')}"


def _versions(versions: dict[str, Optional[str]]) -> str:
    return ", ".join(f"{name} {version or 'none'}" for name, version in sorted(versions.items()))
