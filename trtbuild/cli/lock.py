"""`trtbuild lock merge`: the lock files of a CI matrix's jobs, as one."""

from __future__ import annotations

from pathlib import Path

import click


@click.group("lock")
def lock_group() -> None:
    """Work with lock files (`RECIPE.lock`)."""


@lock_group.command("merge")
@click.argument("locks", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The merged lock (written atomically; left as it was on any error).")
def lock_merge(locks: tuple[Path, ...], out: Path) -> None:
    """Merge the locks of a CI matrix's jobs (each written by `build --lock-out` for its slice)
    into one. The same LOCKS in any order give the same bytes. Refused, one line, exit 2: locks of
    another recipe version or source, of a validated and a --no-validate build, two toolchains
    for one stage, or one target with two artifacts (both digests named)."""
    from trtbuild.lock.merge import write_merged

    merged = write_merged(list(locks), out)
    click.echo(f"merged {len(locks)} lock files ({len(merged.targets)} targets) into {out}")
