"""`<recipe>.lock`: the resolved source, the toolchain per stage, and each target's key and artifact.

YAML with sorted keys so it diffs well; written atomically by `trtbuild build`; `--locked` refuses
to run when the recipe or the source no longer match it. Never holds secrets: only names,
digests, versions and paths the recipe already shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import yaml

from trtbuild.errors import InvalidInput
from trtbuild.validate import gates
from trtbuild.keys import canonical_json
from trtbuild.recipe import LoadedRecipe
from trtbuild.store.hash import atomic_write, bytes_sha256

if TYPE_CHECKING:
    from trtbuild.store.base import Store

LOCK_SCHEMA = 1
HEADER = "# Written by `trtbuild build`: commit it; `trtbuild build --locked` checks against it. Do not edit.\n"


def recipe_digest(loaded: LoadedRecipe) -> str:
    """sha256 of the validated recipe (comments and formatting do not count)."""
    return bytes_sha256(canonical_json(loaded.recipe.model_dump(mode="json", by_alias=True)))


def lock_path_for(loaded: LoadedRecipe, store: "Store", embedded: bool) -> Path:
    """Beside the recipe (`recipes/x.yaml` -> `recipes/x.lock`); the embedded default recipe has no
    folder of its own, so its lock lives in the store."""
    if embedded:
        return store.embedded_lock_path(loaded.recipe.name)
    return loaded.path.with_suffix(".lock")


def read(path: Path) -> Optional[dict]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        return None
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{path}: not a trtbuild lock file ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict) or data.get("schema") != LOCK_SCHEMA:
        raise InvalidInput(f"{path}: not a trtbuild lock file of schema {LOCK_SCHEMA}")
    return data


def digests(path: Path) -> set[str]:
    """Every artifact digest a lock file names (what `cache gc` must keep)."""
    data = read(path) or {}
    return {t["digest"] for t in (data.get("targets") or {}).values() if isinstance(t, dict) and t.get("digest")}


def check_locked(path: Path, loaded: LoadedRecipe) -> dict:
    """For `--locked`: the lock must exist and match the recipe; returns it."""
    data = read(path)
    if data is None:
        raise InvalidInput(f"--locked: {path}: no lock file; run `trtbuild build` without --locked to write it")
    if data.get("recipe", {}).get("digest") != recipe_digest(loaded):
        raise InvalidInput(f"--locked: {loaded.path} changed since {path} was written; rebuild without --locked and commit the new lock")
    return data


def write(path: Path, loaded: LoadedRecipe, source: Optional[dict], results: list, toolchains: dict[str, dict],
          validated: bool = True) -> dict:
    """Write the lock, keeping entries of targets this run did not touch when the recipe is unchanged."""
    digest = recipe_digest(loaded)
    previous = read(path) if path.exists() else None
    targets: dict[str, dict] = {}
    if previous and previous.get("recipe", {}).get("digest") == digest:
        targets.update(previous.get("targets") or {})
        source = source or previous.get("source")
        toolchains = {**(previous.get("toolchain") or {}), **toolchains}
    for r in results:
        if r.digest:
            targets[r.id] = {"stage": r.stage, "key": r.key, "digest": r.digest}
            if "gates" in r.summary:  # validation: the headline numbers and whether the gates passed
                targets[r.id]["metrics"] = {k: float(f"{v:.6g}") if isinstance(v, float) else v
                                            for k, v in r.summary["metrics"].items()}
                targets[r.id]["gates_passed"] = not gates.failed_gates(r.summary)
    data = {
        "schema": LOCK_SCHEMA,
        "recipe": {"name": loaded.recipe.name, "digest": digest},
        "source": source,
        "toolchain": toolchains,
        "targets": targets,
        "validation": "run" if validated else "skipped (--no-validate)",
    }
    atomic_write(path, (HEADER + yaml.safe_dump(data, sort_keys=True, default_flow_style=False)).encode())
    return data
