"""The shared store of `push`, `pull` and `ls` for a recipe: --store, else its publish.store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from trtbuild.errors import InvalidInput
from trtbuild.store import configured

if TYPE_CHECKING:
    from trtbuild.recipe.schema import LoadedRecipe


def shared_store(store_url: Optional[str], loaded: LoadedRecipe, verb: str) -> str:
    """--store, else the recipe's publish.store, else one line (the embedded demo names none, and
    its file is the package's: only --store)."""
    if loaded.embedded and not store_url:
        raise InvalidInput(f"the embedded demo recipe: no store to {verb}: pass --store URL")
    return configured.shared(store_url, configured.of_recipe(loaded), loaded.path, verb)
