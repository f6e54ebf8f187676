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
    from trtbuild.report.write import write_report

    html, png = write_report(recipe, store_url, out_dir)
    click.echo(f"{html}\n{png}")
