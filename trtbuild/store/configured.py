"""The configured remote: the recipe's `publish.store` as the default store of push, pull and ls,
and the read-through remote of build when it is s3://. `--store` always wins.

A folder is relative to the file that names it (the recipe, or the lock file beside it, which
records `publish.store` as the recipe spells it), so a checkout anywhere finds the same folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from trtbuild.errors import InvalidInput

if TYPE_CHECKING:  # the recipe's models are not needed to read a lock or a store URL
    from trtbuild.recipe.schema import LoadedRecipe


def resolve(value: Optional[str], base_dir: Path) -> Optional[str]:
    """An s3:// URL as written; a folder made absolute against `base_dir`."""
    if value is None or value.startswith("s3://"):
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base_dir / path).resolve())


def of_recipe(loaded: LoadedRecipe) -> Optional[str]:
    return resolve(loaded.recipe.publish.store, loaded.base_dir)


def of_lock(recorded: Optional[str], lock_path: Path) -> Optional[str]:
    return resolve(recorded, lock_path.resolve().parent)


def shared(store_url: Optional[str], configured: Optional[str], named_by: Path, verb: str, lock: bool = False) -> str:
    """The store push / pull / ls use: --store, else the configured one, else one line."""
    if store_url:
        return store_url
    if configured:
        return configured
    if lock:
        raise InvalidInput(f"{named_by}: no store to {verb}: pass --store URL (the lock records no `publish.store`)")
    raise InvalidInput(f"{named_by}: no store to {verb}: pass --store URL or set `publish.store` in the recipe")


def build_remote(store_url: Optional[str], loaded: LoadedRecipe, push_asked: bool) -> tuple[Optional[str], Optional[str]]:
    """(the build's store URL, the s3:// remote it reads through) for `trtbuild build`: --store as
    given; without it the local store, in front of publish.store when that is s3://. A folder
    publish.store is the shared store of push and pull only (build --store FOLDER means the build's
    own store, a different thing), so `build --push` refuses it."""
    if store_url:
        return store_url, store_url if store_url.startswith("s3://") else None
    configured = of_recipe(loaded)
    if configured is None:
        return None, None
    if configured.startswith("s3://"):
        return None, configured
    if push_asked:
        raise InvalidInput(f"--push: {loaded.path}: publish.store {configured} is a folder; build --push publishes "
                           f"to s3:// only (`trtbuild push {loaded.path}` publishes to the folder)")
    return None, None
