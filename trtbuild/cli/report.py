"""`trtbuild report`: an HTML page and a PNG plot of a recipe's matrix."""

from __future__ import annotations

from pathlib import Path

import click

from trtbuild.cli.common import STORE_OPTION


@click.command()
@click.argument("recipe", required=False, type=click.Path(dir_okay=False, path_type=Path))
@STORE_OPTION
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for report.html and report.png (default: <store>/reports/<recipe name>).")
def report(recipe: Path | None, store_url, out_dir: Path | None) -> None:
    """Write an HTML page and a PNG plot of RECIPE's matrix: per target its size, estimated memory,
    KL divergence, top-1 agreement, perplexity change and gates (default: the embedded recipe)."""
    from trtbuild.lock import lockfile
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe_or_demo
    from trtbuild.report.collect import rows
    from trtbuild.report.html import render_report
    from trtbuild.store.local import open_store

    loaded = load_recipe_or_demo(recipe)
    # With --out, a store nothing was built into yet reads as empty (a plan-only report);
    # without it the report goes into the store, which has to exist.
    store = open_store(store_url, missing_ok=out_dir is not None)
    plan = plan_recipe(loaded)
    lock = lockfile.read(lockfile.lock_path_for(loaded, store), older_ok=True)
    out_dir = out_dir or store.workspace("a report folder").report_dir(loaded.recipe.name)
    html, png = render_report(loaded.recipe.name, rows(plan, store, lock), out_dir)
    click.echo(f"{html}\n{png}")
