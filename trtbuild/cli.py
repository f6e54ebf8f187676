"""The `trtbuild` command line: parse arguments, call one function, print a table or JSON.

Heavy modules are imported inside the commands, so `trtbuild --help` stays fast and never imports
torch, transformers or ModelOpt.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

import click

from trtbuild import __version__
from trtbuild.errors import InvalidInput, TrtbuildError

DEFAULT_RECIPE = "smollm2-demo.yaml"


def default_recipe() -> Path:
    """The recipe embedded in the package: the bundled SmolLM2-135M demo."""
    return Path(str(resources.files("trtbuild").joinpath("recipes", DEFAULT_RECIPE)))


class _Group(click.Group):
    """Turns TrtbuildError into its lines on stderr and its exit code, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TrtbuildError as exc:
            for line in exc.messages:
                click.echo(line, err=True)
            raise click.exceptions.Exit(exc.exit_code) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="trtbuild")
def cli() -> None:
    """Turn model checkpoints into validated, cached, ready-to-serve TensorRT-LLM artifacts.

    A YAML recipe names a source model and a matrix of quantization variants, parallelism and GPU
    architectures. `trtbuild plan` expands it and checks every target before any GPU time is spent.
    """


def _console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    return console


def _parse_gpu(value: str | None) -> set[str] | None:
    if value is None or value == "all":
        return None
    from trtbuild import hardware

    try:
        return {hardware.resolve_gpu(value).sm}
    except ValueError as exc:
        raise InvalidInput(f"--gpu: {exc}") from None


@cli.command()
@click.argument("recipes", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--gpu", "gpu", metavar="SM|PRODUCT|all", help="Plan only engines for this GPU (default: all in the recipe).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "github-matrix"]), default="table", show_default=True,
              help="table for people, json for programs, github-matrix for a GitHub Actions strategy.matrix.")
def plan(recipes: tuple[Path, ...], gpu: str | None, fmt: str) -> None:
    """Expand RECIPES into targets and check each one (no GPU, no weights needed).

    Every target is `ok` or `impossible` with the reason: quantization the GPU cannot run, tp that
    does not divide the heads, limits beyond the model, weights that do not fit. Without RECIPES,
    plans the embedded demo recipe. Exit 0 for valid recipes (even with impossible targets), 2 for
    invalid input.
    """
    from trtbuild.plan import plan_recipe
    from trtbuild.recipe import load_recipe

    paths = list(recipes) or [default_recipe()]
    gpu_filter = _parse_gpu(gpu)
    loaded, errors = [], []
    for path in paths:  # validate everything first: an invalid recipe means nothing is printed
        try:
            loaded.append(load_recipe(path))
        except InvalidInput as exc:
            errors.extend(exc.messages)
    if errors:
        raise InvalidInput(*errors)
    plans = [plan_recipe(item, gpu_filter=gpu_filter) for item in loaded]

    from trtbuild import render

    if fmt == "json":
        click.echo(render.plans_json(plans))
    elif fmt == "github-matrix":
        click.echo(render.github_matrix(plans))
    else:
        console = _console()
        for p in plans:
            render.print_table(p, console)


@cli.command()
def schema() -> None:
    """Print the JSON Schema of a recipe (for editors and linters)."""
    import json

    from trtbuild.recipe import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


def main() -> None:
    cli(prog_name="trtbuild")


if __name__ == "__main__":
    sys.exit(main())
