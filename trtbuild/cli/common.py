"""What the command groups share: the console and the --store options."""

from __future__ import annotations

import click


def console():
    """rich's console; on a file or pipe as wide as the plain output (cli/plainout.py)."""
    from rich.console import Console

    out = Console()
    if not out.is_terminal:
        from trtbuild.cli.plainout import WIDTH

        out = Console(width=WIDTH)
    return out


STORE_OPTION = click.option("--store", "store_url", metavar="URL",
                            help="Artifact store: a folder (default: $TRTBUILD_CACHE, else ./cache).")

REMOTE_OPTION = click.option("--store", "store_url", metavar="URL",
                             help="The shared store: a folder or s3://bucket/prefix (AWS_ENDPOINT_URL for another "
                                  "S3-compatible server; the standard AWS credentials); default: the recipe's "
                                  "publish.store (for a lock file: the one it records). The local store is "
                                  "$TRTBUILD_CACHE, else ./cache.")


def moved_line(moved: dict, where: str) -> str:
    """What a push moved (transfer.Moved.as_json()), as `push` and `build --push` say it."""
    from trtbuild.plan.estimate import format_bytes

    return (f"{moved['blobs']} blobs ({format_bytes(moved['bytes'])}) sent, {moved['skipped_blobs']} already there; "
            f"{moved['records']} records, {moved['refs']} refs -> {where}")


def echo_pushed(pushed: dict, as_json: bool) -> None:
    """`push` and `build --push`: each target pushed and what moved (not with --json: the JSON says
    it), then on stderr every divergence and refusal."""
    if not as_json:
        for target in pushed["pushed"]:
            click.echo(f"pushed {target}")
        click.echo(moved_line(pushed["moved"], pushed["store"]))
    for line in pushed["moved"]["divergences"]:
        click.echo(f"divergence: {line}", err=True)
    for line in pushed["refused"]:
        click.echo(line, err=True)
