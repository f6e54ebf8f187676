"""`trtbuild plan` and `trtbuild schema`: what a recipe asks for, before anything is built."""

from __future__ import annotations

from pathlib import Path

import click

from trtbuild.errors import InvalidInput


@click.command()
@click.argument("recipes", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--gpu", "gpu", metavar="SM|PRODUCT|all",
              help="Plan only engines for this GPU (default: all in the recipe); a product (L4, RTX4090, ...) is "
                   "also the card the memory estimate assumes.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "github-matrix"]), default=None,
              help="table for people (the default), json for programs, github-matrix for a GitHub Actions "
                   "strategy.matrix.")
@click.option("--json", "as_json", is_flag=True, help="The same as --format json (as the other commands spell it).")
def plan(recipes: tuple[Path, ...], gpu: str | None, fmt: str | None, as_json: bool) -> None:
    """Expand RECIPES into targets and check each one (no GPU, no weights needed).

    Every target is `ok` or `impossible` with the reason: quantization the GPU cannot run, tp that
    does not divide the heads, limits beyond the model, weights that do not fit. Without RECIPES,
    plans the embedded demo recipe. Exit 0 for valid recipes (even with impossible targets), 2 for
    invalid input.
    """
    from trtbuild.plan.expand import plan_recipes
    from trtbuild.recipe.schema import default_recipe

    if as_json and fmt not in (None, "json"):
        raise InvalidInput(f"--json and --format {fmt}: pick one")
    fmt = "json" if as_json else fmt or "table"
    plans = plan_recipes(list(recipes) or [default_recipe()], gpu)

    from trtbuild.cli import render

    if fmt == "json":
        click.echo(render.plans_json(plans))
    elif fmt == "github-matrix":
        click.echo(render.github_matrix(plans, embedded=not recipes))
    else:
        from trtbuild.cli.common import console

        shown = console()
        for p in plans:
            render.print_table(p, shown)


@click.command()
def schema() -> None:
    """Print the JSON Schema of a recipe (for editors and linters)."""
    import json

    from trtbuild.recipe.schema import json_schema

    click.echo(json.dumps(json_schema(), indent=2))
