"""`trtbuild cache ls|verify|gc`: inspect and maintain the artifact store."""

from __future__ import annotations

import click

from trtbuild.cli.common import STORE_OPTION
from trtbuild.errors import InvalidInput, TrtbuildError


@click.group()
def cache() -> None:
    """Inspect and maintain the artifact store."""


@cache.command("ls")
@STORE_OPTION
@click.option("--json", "as_json", is_flag=True)
def cache_ls(store_url, as_json) -> None:
    """List action records: what was built, from which recipe and target, when, how big. On a file
    or pipe, one record per line (the table as wide as its widest row)."""
    from trtbuild.store.local import open_store

    records = sorted(open_store(store_url, create=False).records(), key=lambda r: r.created)
    if as_json:
        import json

        from trtbuild.store.records import dump

        click.echo(json.dumps([{**{k: v for k, v in dump(r).items() if k != "fields"}, "standin": r.standin}
                               for r in records], indent=2))
    else:
        from trtbuild.cli import render
        from trtbuild.cli.common import console

        if not render.print_records_plain(records):  # a file or pipe: one record per line
            render.print_records(records, console())


@cache.command("verify")
@STORE_OPTION
@click.option("--repair", is_flag=True,
              help="Drop every bad object and the manifests, records, refs and checkouts that lean on it, "
                   "so the next build rebuilds them (exit 0 once repaired).")
def cache_verify(store_url, repair) -> None:
    """Re-hash every blob and manifest and check every record and ref; name each bad one (exit 1)."""
    from trtbuild.store.local import open_store
    from trtbuild.store.verify import repair as run_repair
    from trtbuild.store.verify import scan

    store = open_store(store_url, create=False)
    found, done = run_repair(store) if repair else (scan(store), [])
    for line in found.problems:
        click.echo(line, err=True)
    if not found.problems:
        click.echo(f"store {store.location}: every blob, manifest, record and ref checks out")
        return
    if not repair:
        raise TrtbuildError(f"store {store.location}: {len(found.problems)} problem(s) found; "
                            "`trtbuild cache verify --repair` drops them")
    for line in done:
        click.echo(line)
    click.echo(f"store {store.location}: repaired ({len(done)} removal(s)); the next build rebuilds what was dropped")


@cache.command("gc")
@STORE_OPTION
@click.option("--keep-last", type=click.IntRange(min=1), metavar="N", help="Keep only the last N artifacts of each ref's history.")
@click.option("--max-size", metavar="SIZE", help="Then drop the oldest unprotected records until the store fits (e.g. 50G).")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing (the default on s3://).")
@click.option("--yes", is_flag=True, help="On s3://: remove what the dry run lists.")
@click.option("--json", "as_json", is_flag=True)
def cache_gc(store_url, keep_last, max_size, dry_run, yes, as_json) -> None:
    """Remove what nothing needs. Never removes the artifact a ref points at, nor anything a lock
    file in use names (one written by `trtbuild build` against this store that still exists).
    On s3://: keeps what each ref points at now (with --keep-last N, the last N of its history) and
    what every lock file `push` ever published names (locks/<recipe>/<sha256>.lock; delete one to
    release its pins); lists every object it would remove and removes them
    only with --yes; refuses while a push holds a lease there."""
    from trtbuild.deploy.gc import collect_garbage

    collected = collect_garbage(store_url, keep_last, parse_size(max_size) if max_size else None, dry_run, yes)
    report = collected.report
    if as_json:
        import json

        click.echo(json.dumps(collected.as_json(), indent=2))
        return
    from trtbuild.plan.estimate import format_bytes

    verb = "would remove" if collected.dry_run else "removed"
    for where in collected.objects:
        click.echo(f"{verb} {where}")
    click.echo(f"{verb} {len(report.records)} records, {report.manifests} manifests, {report.blobs} blobs "
               f"({format_bytes(report.bytes_freed)}), {report.checkouts} checkouts; store now {format_bytes(report.size_after)}")
    if collected.remote and collected.dry_run:
        click.echo(f"dry run: nothing was removed; `trtbuild cache gc --store {collected.location} --yes` removes it")
    if report.over_budget:
        click.echo(f"still above --max-size {max_size}: what is left is pinned by refs or lock files", err=True)


def parse_size(text: str) -> int:
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not match:
        raise InvalidInput(f"--max-size {text}: not a size (examples: 500M, 50G, 2T)")
    number, unit = float(match.group(1)), match.group(2)
    return int(number * 1024 ** " kmgt".index(unit or " "))
