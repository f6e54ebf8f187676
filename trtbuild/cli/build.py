"""`trtbuild build`, `explain` and `path`: build a recipe through the store, say why a key is what
it is, and where a built target's artifact is."""

from __future__ import annotations

from pathlib import Path

import click

from trtbuild.cli.common import STORE_OPTION


def until_help(stage_order: dict[str, int]) -> str:
    """`--until`'s help, from graph.STAGE_ORDER: its steps in order, stages of one step joined by `/`."""
    steps: dict[int, list[str]] = {}
    for stage, rank in stage_order.items():
        steps.setdefault(rank, []).append(stage)
    listed = ", ".join("/".join(steps[rank]) for rank in sorted(steps))
    return f"Stop after this stage (stages joined by / stop together): {listed}."


class _UntilOption(click.Option):
    """Its help lists graph.STAGE_ORDER, imported only when help is shown (graph imports the stages)."""

    def get_help_record(self, ctx):
        from trtbuild.builder.graph import STAGE_ORDER

        self.help = until_help(STAGE_ORDER)
        return super().get_help_record(ctx)


@click.command()
@click.argument("recipe", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--target", "targets", multiple=True, metavar="GLOB", help="Build only matching targets (and what they need).")
@click.option("--until", metavar="STAGE", cls=_UntilOption)
@click.option("--gpu", default="all", show_default=True, metavar="auto|SM|PRODUCT|all",
              help="Engines to build: auto = those for the SMs of this host's GPUs (the others are skipped, naming "
              "the SM they need, even with --require-all), an SM or product, or all.")
@click.option("--store", "store_url", metavar="URL",
              help="Artifact store: a folder (default: $TRTBUILD_CACHE, else ./cache), or s3://BUCKET/PREFIX: a "
                   "remote behind the local store, whose action cache is read when the local store misses (the "
                   "artifact is pulled and verified instead of built). Without --store, the recipe's publish.store "
                   "is that remote when it is s3:// (a folder publish.store is for push and pull only).")
@click.option("--push", "push_after", is_flag=True,
              help="Then publish what the build made to the s3:// remote (--store, else publish.store), refusing "
                   "what `trtbuild push` refuses.")
@click.option("--allow-unvalidated", is_flag=True, help="With --push: also publish targets of a --no-validate build.")
@click.option("--require-all", is_flag=True, help="Targets this host cannot build (or impossible ones) fail instead of being skipped.")
@click.option("--locked", is_flag=True,
              help="Stop (exit 2, one line naming the lock file, the node and both digests) wherever this build would "
                   "change RECIPE.lock, which is left byte for byte as it was: another recipe or source digest, "
                   "validation mode, key or artifact for a node than the lock records, a node it lacks or one the "
                   "recipe no longer has. Nothing is built under a key the lock does not record; an artifact built "
                   "under its key whose bytes differ stays in the store (content-addressed, named by no ref). With "
                   "--lock-out only the recipe and source are checked (against RECIPE.lock).")
@click.option("--no-validate", "no_validate", is_flag=True,
              help="Skip accuracy validation (for people who know what they are doing; the lock file records it).")
@click.option("--rebuild", "rebuild", multiple=True, metavar="GLOB",
              help="Build these nodes anew even when the store has them; the new artifact replaces the recorded one.")
@click.option("--lock-out", "lock_out", type=click.Path(dir_okay=False, path_type=Path), metavar="PATH",
              help="Write this run's lock to PATH, holding only the targets this run built or found (a CI job's "
                   "slice, for `trtbuild lock merge`); RECIPE.lock is left as it is (--locked checks against it), "
                   "and --push publishes what PATH names.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary (with read-only artifact paths).")
def build(recipe: Path | None, targets, until, gpu, store_url, push_after, allow_unvalidated, require_all, locked,
          no_validate, rebuild, lock_out, as_json) -> None:
    """Build RECIPE's targets through the artifact store (default: the embedded demo recipe).

    Each stage's output is stored by content under an action key naming everything that shaped it:
    a second run rebuilds nothing unless something changed. Writes RECIPE's lock file beside it
    (with --lock-out, this run's lock to PATH instead).
    Exit 0 when every requested target was built, cached or skipped; 1 when one failed; 2 on
    invalid input.
    """
    from trtbuild.builder.pipeline import BuildRequest
    from trtbuild.cli.progress import ConsoleReporter
    from trtbuild.deploy.remote_cache import build_and_publish

    request = BuildRequest(targets=list(targets), until=until, gpu=gpu, require_all=require_all, locked=locked,
                           materialize=as_json, validate=not no_validate, rebuild=list(rebuild), lock_out=lock_out)
    with ConsoleReporter() as reporter:
        outcome = build_and_publish(recipe, store_url, request, reporter, push_after, allow_unvalidated)
    if as_json:
        import json

        click.echo(json.dumps(outcome.as_json(), indent=2))
    else:
        from trtbuild.cli import render
        from trtbuild.cli.common import console

        if not render.print_build_plain(outcome):  # a file or pipe: rich's text, without rich
            render.print_build(outcome, console())
    if outcome.pushed is not None:
        from trtbuild.cli.common import echo_pushed

        echo_pushed(outcome.pushed, as_json)
    raise click.exceptions.Exit(outcome.exit_code)


@click.command()
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("target")
@STORE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the fields as JSON.")
def explain(recipe: Path, target: str, store_url, as_json) -> None:
    """Show every field of the keys on the way to TARGET, where each value came from, and whether
    the store has the artifact."""
    from trtbuild.builder.explain import explain_target

    explained = explain_target(recipe, target, store_url)
    if as_json:
        import json

        click.echo(json.dumps([e.as_json() for e in explained], indent=2))
    else:
        from trtbuild.cli import render
        from trtbuild.cli.common import console

        render.print_explain(explained, console())


@click.command("path")
@click.argument("names", nargs=-1, metavar="[RECIPE] TARGET")
@STORE_OPTION
def path_of(names: tuple[str, ...], store_url) -> None:
    """Print the folder of TARGET's artifact as RECIPE's lock names it (default: the embedded demo
    recipe): the local store's read-only checkout, made if it is not there yet, for `trtbuild check`
    and the runtimes. Exit 0; 1 when TARGET is not built (or its artifact is not whole in the
    store); 2 when it is not a target of RECIPE.
    """
    if len(names) not in (1, 2):
        raise click.UsageError(f"expected [RECIPE] TARGET, got {len(names)} argument(s)")
    from trtbuild.builder.pipeline import checkout_target

    recipe = Path(names[0]) if len(names) == 2 else None
    click.echo(str(checkout_target(recipe, names[-1], store_url)))
