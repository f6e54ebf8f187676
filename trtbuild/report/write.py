"""`trtbuild report`: a recipe's rows (its plan, the store's records and its lock: collect.py)
written as report.html and report.png (html.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def write_report(recipe: Optional[Path], store_url: Optional[str] = None,
                 out_dir: Optional[Path] = None) -> tuple[Path, Path]:
    """(report.html, report.png) of RECIPE (None: the embedded demo), in `out_dir`, else the
    store's report folder. With `out_dir`, a store nothing was built into yet reads as empty (a
    plan-only report); without it the report goes into the store, which has to exist."""
    from trtbuild.lock import lockfile
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe_or_demo
    from trtbuild.report.collect import rows
    from trtbuild.report.html import render_report
    from trtbuild.store.local import open_store

    loaded = load_recipe_or_demo(recipe)
    store = open_store(store_url, missing_ok=out_dir is not None)
    plan = plan_recipe(loaded)
    lock = lockfile.read(lockfile.lock_path_for(loaded, store), older_ok=True)
    from trtbuild.report.serving import serving_rows

    out_dir = out_dir or store.workspace("a report folder").report_dir(loaded.recipe.name)
    matrix = rows(plan, store, lock)
    digests = {name: entry.digest for name, entry in lock.targets.items()} if lock else {}
    serving = serving_rows(matrix, digests, store) if store.exists() else []
    return render_report(loaded.recipe.name, matrix, out_dir, serving)
