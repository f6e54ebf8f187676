"""The `trtbuild` command line: parse arguments, call one function, print a table or JSON.

Heavy modules are imported inside the commands, so `trtbuild --help` stays fast and never imports
torch, transformers or ModelOpt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from trtbuild import __version__
from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.facts.runtime_names import PULL_RUNTIMES, names_text

def default_recipe() -> Path:
    """The recipe embedded in the package: the bundled SmolLM2-135M demo (trtbuild.recipe.schema says where)."""
    from trtbuild.recipe.schema import default_recipe as embedded

    return embedded()


class _Group(click.Group):
    """Turns TrtbuildError, and a full disk or read-only folder (trtbuild.fsfaults), into its lines
    on stderr and its exit code, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TrtbuildError as exc:
            self._fail(exc)
        except OSError as exc:
            from trtbuild.fsfaults import user_error

            error = user_error(exc)
            if error is None:
                raise
            self._fail(error)

    @staticmethod
    def _fail(exc: TrtbuildError):
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
        from trtbuild.cli.plainout import WIDTH

        console = Console(width=WIDTH)
    return console


def _parse_gpu(value: str | None):
    """`--gpu` of `plan`: None (all), or the one GpuChoice (an SM, or a product whose memory counts)."""
    if value is None or value == "all":
        return None
    from trtbuild.facts.gpus import resolve_gpu

    try:
        return {resolve_gpu(value)}
    except ValueError as exc:
        raise InvalidInput(f"--gpu: {exc}") from None


@cli.command()
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
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe

    if as_json and fmt not in (None, "json"):
        raise InvalidInput(f"--json and --format {fmt}: pick one")
    fmt = "json" if as_json else fmt or "table"
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

    from trtbuild.cli import render

    if fmt == "json":
        click.echo(render.plans_json(plans))
    elif fmt == "github-matrix":
        click.echo(render.github_matrix(plans, embedded=not recipes))
    else:
        console = _console()
        for p in plans:
            render.print_table(p, console)


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
        from trtbuild.build.graph import STAGE_ORDER

        self.help = until_help(STAGE_ORDER)
        return super().get_help_record(ctx)


STORE_OPTION = click.option("--store", "store_url", metavar="URL",
                            help="Artifact store: a folder (default: $TRTBUILD_CACHE, else ./cache).")


def _load(recipe: Path | None):
    """RECIPE, or the embedded demo when it is None. `.embedded` of what it returns says whether it
    is the demo (also when RECIPE is a path to its file, as recipes/smollm2-demo.yaml is): its
    identity, its lock in the store and the commands that name it follow from that one fact."""
    from trtbuild.recipe.schema import load_recipe

    return load_recipe(recipe or default_recipe())


def _command(verb: str, loaded) -> str:
    """The command that does `verb` to this recipe: bare for the embedded demo."""
    return f"trtbuild {verb}" if loaded.embedded else f"trtbuild {verb} {loaded.path}"


def _recipe_store(store_url: str | None, loaded, verb: str) -> str:
    """The shared store of push / pull / ls: --store, else the recipe's publish.store, else one line
    (the embedded demo names none, and its file is the package's: only --store)."""
    from trtbuild.store import configured as configured_store

    if loaded.embedded and not store_url:
        raise InvalidInput(f"the embedded demo recipe: no store to {verb}: pass --store URL")
    return configured_store.shared(store_url, configured_store.of_recipe(loaded), loaded.path, verb)


@cli.command()
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
    from trtbuild.build.pipeline import BuildRequest
    from trtbuild.build.pipeline import build as run_build
    from trtbuild.cli.progress import ConsoleReporter
    from trtbuild.store.local import open_store

    from trtbuild.store import configured as configured_store

    from trtbuild.deploy import remote_cache

    loaded = _load(recipe)
    store_url, remote_url = configured_store.build_remote(store_url, loaded, push_after)
    remote_cache.require_remote(remote_url, push_after)
    remote = None
    if remote_url:  # the local store in front of the remote one
        remote = open_store(remote_url, create=True)
        remote.create()  # credentials, bucket, endpoint: one line now, not after the first stage
        store = open_store(None, create=True)
    else:
        store = open_store(store_url, create=True)  # created by the build's first write, not here
    request = BuildRequest(targets=list(targets), until=until, gpu=gpu, require_all=require_all, locked=locked,
                           materialize=as_json, validate=not no_validate, rebuild=list(rebuild), lock_out=lock_out)
    with ConsoleReporter() as reporter:
        outcome = run_build(loaded, store, request, reporter, remote=remote_cache.RemoteCache(remote) if remote else None)
    if push_after:
        outcome.pushed = remote_cache.publish_build(outcome, loaded, store, remote, list(targets), allow_unvalidated)
    if as_json:
        import json

        click.echo(json.dumps(outcome.as_json(), indent=2))
    else:
        from trtbuild.cli import render

        if not render.print_build_plain(outcome):  # a file or pipe: rich's text, without rich
            render.print_build(outcome, _console())
    if outcome.pushed is not None:
        from trtbuild.plan.estimate import format_bytes

        moved = outcome.pushed["moved"]
        if not as_json:
            for target in outcome.pushed["pushed"]:
                click.echo(f"pushed {target}")
            click.echo(f"{moved['blobs']} blobs ({format_bytes(moved['bytes'])}) sent, {moved['skipped_blobs']} already "
                       f"there; {moved['records']} records, {moved['refs']} refs -> {remote_url}")
        for line in moved["divergences"]:
            click.echo(f"divergence: {line}", err=True)
        for line in outcome.pushed["refused"]:
            click.echo(line, err=True)
    raise click.exceptions.Exit(outcome.exit_code)


@cli.command()
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("target")
@STORE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the fields as JSON.")
def explain(recipe: Path, target: str, store_url, as_json) -> None:
    """Show every field of the keys on the way to TARGET, where each value came from, and whether
    the store has the artifact."""
    from trtbuild.lock import lockfile
    from trtbuild.build.explain import explain as run_explain
    from trtbuild.build.pipeline import BuildRequest, build_graph_for
    from trtbuild.store.local import open_store

    loaded = _load(recipe)
    store = open_store(store_url, missing_ok=True)  # nothing built yet: every key reads as not in the store
    graph = build_graph_for(loaded, BuildRequest())
    lock = lockfile.read(lockfile.lock_path_for(loaded, store), older_ok=True)
    explained = run_explain(graph, target, store, lock)
    if as_json:
        import json

        click.echo(json.dumps([e.as_json() for e in explained], indent=2))
    else:
        from trtbuild.cli import render

        render.print_explain(explained, _console())


@cli.command()
@click.argument("folder", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--lock", "lock_path", type=click.Path(dir_okay=False, path_type=Path), metavar="LOCK",
              help="An engine's lock file (`RECIPE.lock`): when the engine does not fit, name its engine targets "
                   "that would.")
@click.option("--runtime", "runtimes", multiple=True, metavar="NAME[==VERSION]",
              help=f"A Hugging Face checkpoint: check only this runtime's loader: {names_text()}, at the "
                   "runtime table's default version or at ==VERSION, one the table covers (docs/runtimes.md; "
                   "repeatable; default: all of them).")
@click.option("--gpu", "gpus", multiple=True, metavar="SM",
              help="A Hugging Face checkpoint: it must be served on this SM (sm80 ... sm120; repeatable; default: "
                   "on at least one).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (the exit code is the same).")
def check(folder: Path, lock_path: Path | None, runtimes: tuple[str, ...], gpus: tuple[str, ...], as_json: bool) -> None:
    """Check that DIR can be served.

    An engine folder (config.json, rank<N>.engine, trtbuild.json): its SM, tensorrt_llm and tensorrt
    versions, world size and per-rank memory against this host's GPUs (NVML) and packages (no
    import of tensorrt); OK, or one line per difference. A Hugging Face checkpoint folder
    (config.json and safetensors, as an hf-checkpoint target holds): the loader rules of
    TensorRT-LLM's PyTorch backend (>=1.3), vLLM and SGLang on its configs and tensor headers, and
    the SMs each serves it on; one `defect:` line per tensor missing or wrong (whatever a loader
    does with it), then one line per runtime, or per reason it is rejected.

    Exit 0 when it fits / every asked runtime accepts it (on every asked SM) and it has no
    defects, 1 when not (a stand-in engine never fits), 2 when DIR is neither.
    """
    import json

    from trtbuild.deploy.engine_check import check as run_check, is_hf_checkpoint

    if is_hf_checkpoint(folder):
        from trtbuild.serving.check import RUNTIMES, check_checkpoint

        if lock_path is not None:
            raise InvalidInput(f"--lock applies to an engine folder; {folder} is a Hugging Face checkpoint")
        hf = check_checkpoint(folder, list(runtimes) or RUNTIMES, list(gpus) or None)
        if as_json:
            click.echo(json.dumps(hf.as_json(), indent=2))
        else:
            for line in hf.lines():
                click.echo(line)
        raise click.exceptions.Exit(0 if hf.accepted else 1)
    if runtimes or gpus:
        option = "--runtime" if runtimes else "--gpu"
        raise InvalidInput(f"{option} applies to a Hugging Face checkpoint folder; {folder} is not one")
    result = run_check(folder, lock_path)
    if as_json:
        click.echo(json.dumps(result.as_json(), indent=2))
    else:
        for line in result.lines():
            click.echo(line)
    raise click.exceptions.Exit(result.exit_code)


REMOTE_OPTION = click.option("--store", "store_url", metavar="URL",
                             help="The shared store: a folder or s3://bucket/prefix (AWS_ENDPOINT_URL for another "
                                  "S3-compatible server; the standard AWS credentials); default: the recipe's "
                                  "publish.store (for a lock file: the one it records). The local store is "
                                  "$TRTBUILD_CACHE, else ./cache.")


@cli.command()
@click.argument("recipe", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--target", "targets", multiple=True, metavar="GLOB", help="Push only matching targets (default: every built one).")
@click.option("--store", "store_url", metavar="URL",
              help="The shared store: a folder or s3://bucket/prefix (AWS_ENDPOINT_URL for another S3-compatible "
                   "server; the standard AWS credentials); default: the recipe's publish.store (the embedded demo "
                   "names none). What is pushed comes from the local store: $TRTBUILD_CACHE, else ./cache.")
@click.option("--allow-unvalidated", is_flag=True, help="Also push targets of a build run with --no-validate.")
@click.option("--json", "as_json", is_flag=True, help="Print what was pushed, refused and moved as JSON.")
def push(recipe: Path | None, targets, store_url, allow_unvalidated, as_json) -> None:
    """Publish what the last build of RECIPE (default: the embedded demo recipe) made, from the
    local store to --store (default: the recipe's publish.store), with their validation reports:
    blobs the store lacks, then manifests, then action records (the first writer of a key wins),
    then refs, and on s3:// the build's lock for deploy hosts' `trtbuild pull`. Refused, one line
    each: a target that failed a gate, one built with --no-validate (unless --allow-unvalidated),
    one a stand-in toolchain made. A bar of bytes is drawn on stderr when it is a terminal (never
    with --json). Exit 0 when everything chosen was pushed, 1 when a target was refused, 2 on
    invalid input.
    """
    from trtbuild.lock import lockfile
    from trtbuild.plan.estimate import format_bytes
    from trtbuild.recipe.schema import recipe_identity
    from trtbuild.deploy.push import plan_push
    from trtbuild.store.local import open_store
    from trtbuild.store.transfer import push as run_push

    if recipe is not None and recipe.suffix == ".lock":  # what `pull` takes; push publishes a recipe's build
        raise InvalidInput(f"{recipe}: a lock file; push takes the recipe it belongs to: {_recipe_of_lock(recipe)}")
    loaded = _load(recipe)
    named = "--store" if store_url else f"{recipe}: publish.store"
    store_url = _recipe_store(store_url, loaded, "push to")
    local = open_store(None)
    remote = open_store(store_url, create=True)
    if getattr(remote, "root", None) == getattr(local, "root", object()):
        raise InvalidInput(f"{named} {store_url}: that is the local store; push to another one")
    lock_path = lockfile.lock_path_for(loaded, local)
    lock = lockfile.read(lock_path)
    if lock is None:
        raise InvalidInput(f"{lock_path}: no lock file; run `{_command('build', loaded)}` first")
    if lock.recipe.digest != lockfile.recipe_digest(loaded):
        raise InvalidInput(f"{loaded.path} changed since {lock_path} was written; run `{_command('build', loaded)}` first")
    chosen = plan_push(lock, lock_path, local, list(targets), allow_unvalidated)
    from trtbuild.store.transfer import Moved

    moved = Moved()
    if chosen.items:
        from trtbuild.cli.transferbar import bar

        remote.check_claim(lock.recipe.name, recipe_identity(loaded))  # refused before anything is written
        with local.using(), remote.using(), bar("push", enabled=not as_json) as progress:
            moved = run_push(local, remote, chosen.items, lock=(lock.recipe.name, lock_path.read_bytes()),
                             progress=progress, claim=(lock.recipe.name, recipe_identity(loaded)))
    if as_json:
        import json

        click.echo(json.dumps({"store": store_url, "pushed": chosen.targets, "refused": chosen.refused,
                               "moved": moved.as_json()}, indent=2))
    else:
        for target in chosen.targets:
            click.echo(f"pushed {target}")
        click.echo(f"{moved.blobs} blobs ({format_bytes(moved.bytes)}) sent, {moved.skipped_blobs} already there; "
                   f"{moved.records} records, {moved.refs} refs -> {store_url}")
    for line in moved.divergences:
        click.echo(f"divergence: {line}", err=True)
    for line in chosen.refused:
        click.echo(line, err=True)
    raise click.exceptions.Exit(1 if chosen.refused else 0)


def _recipe_of_lock(lock: Path) -> str:
    """The command that pushes the recipe a lock file belongs to: the recipe beside it, the bare
    command for the embedded demo's (kept in the store as <name>.lock), else RECIPE."""
    beside = lock.with_suffix(".yaml")
    if beside.is_file():
        return f"`trtbuild push {beside}`"
    if lock.name == f"{_demo_name()}.lock":
        return "`trtbuild push` (the embedded demo)"
    return "`trtbuild push RECIPE`"


def _demo_name() -> str:
    return _load(None).recipe.name


@cli.command()
@click.argument("lock_or_recipe", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--target", default="auto", show_default=True, metavar="NAME|auto",
              help="The target to pull, or auto: the one that fits this host best.")
@click.option("--gpu", default="auto", show_default=True, metavar="auto|SM",
              help="auto: every GPU NVML sees; an SM: only this host's GPUs of that SM count.")
@click.option("--runtime", type=click.Choice(["auto", *PULL_RUNTIMES]), default="auto",
              show_default=True, help="What will serve it: a TensorRT engine, or an hf-checkpoint on TensorRT-LLM's "
              "PyTorch backend (1.3+), vLLM or SGLang.")
@click.option("--prefer", type=click.Choice(["throughput", "latency"]), default="throughput", show_default=True,
              help="Among targets that fit: the fewest GPUs (throughput) or the most (latency).")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Materialize into this folder (atomically); default: the local store's read-only checkout.")
@REMOTE_OPTION
@click.option("--dry-run", is_flag=True, help="Only choose: print the target pull would take and download nothing "
              "(the store is not contacted unless a target's format must be read from its record).")
@click.option("--allow-unvalidated", is_flag=True,
              help="Also pull (and choose among) targets of a --no-validate build, as `push --allow-unvalidated` "
                   "publishes them; never one whose validation failed or a stand-in made.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the choice, every target's fit and the path as JSON (also when nothing fits).")
def pull(lock_or_recipe: Path | None, target, gpu, runtime, prefer, dest, store_url, dry_run, allow_unvalidated,
         as_json) -> None:
    """Download a target of LOCK_OR_RECIPE (a `.lock` file, or a recipe: its lock, default: the
    embedded demo recipe) from --store (default: the recipe's publish.store; for a lock, the one it
    records) into the local store, verifying every blob, and print where it is. A recipe whose lock
    is not on this host (a deploy host) is pulled by the lock `trtbuild push` published in the
    store, read on every pull, when it is of this very recipe (its digest). With --target auto, choose for this host: engines
    of its SM and exact tensorrt_llm / tensorrt, hf-checkpoints a runtime here serves on its SM,
    what fits in memory, then --prefer, then the recipe's variant order. --dry-run only chooses: it
    prints the target it would pull and downloads nothing. A bar of bytes is drawn on stderr when it
    is a terminal (never with --json). Exit 0 pulled (or chosen), 1 nothing fits (every target is
    listed with the reason; with --json, also on stdout) or the store is damaged, 2 on invalid input.
    """
    from trtbuild.lock import lockfile
    from trtbuild.deploy.select import Host, build_hint, choose, no_fit_lines, targets_of
    from trtbuild.store import configured as configured_store

    variants, loaded = None, None
    if lock_or_recipe is not None and lock_or_recipe.suffix == ".lock":
        lock_path, push_command = lock_or_recipe, f"trtbuild push {lock_or_recipe.with_suffix('.yaml')}"
        recipe_words = str(lock_or_recipe.with_suffix(".yaml"))
    else:
        from trtbuild.store.local import open_store

        loaded = _load(lock_or_recipe)
        store_url = _recipe_store(store_url, loaded, "pull from")
        lock_path = lockfile.lock_path_for(loaded, open_store(None, missing_ok=True))  # the demo's: the local store's
        push_command, recipe_words = _command("push", loaded), "" if loaded.embedded else str(loaded.path)
        variants = loaded.recipe.variants
    opened = []

    def remote_store():  # opened when first needed: choosing from a recipe's lock needs no request at all
        from trtbuild.store.local import open_store

        if not opened:
            opened.append(open_store(store_url))
        return opened[0]

    lock, lock_name = lockfile.read(lock_path), str(lock_path)
    if lock is None and loaded is not None:  # a deploy host: the lock push published, if it is this recipe's
        lock_name, lock = _published_lock(remote_store(), loaded, lock_path)
    if lock is None:
        raise InvalidInput(f"{lock_path}: no lock file (pull reads the lock that `trtbuild build` wrote)")
    if loaded is None:  # a lock file: the store it records
        store_url = configured_store.shared(store_url, configured_store.of_lock(lock.recipe.publish_store, lock_path),
                                            lock_path, "pull from", lock=True)

    if not dry_run:  # a store that is not there is the first thing a pull says
        remote_store()

    def formats(target_id, entry):  # an hf-checkpoint's format: the recipe's variant, else its record
        from trtbuild.facts.nodeids import variant_of

        variant = variants.get(variant_of(target_id)) if variants else None
        if variant is not None:
            return variant.quant, variant.kv_cache
        record = remote_store().get_record(entry.key)
        params = record.fields.get("params") if record else None
        return (params.get("quant"), params.get("kv_cache")) if isinstance(params, dict) else None

    host = Host.probe(gpu)
    selection = choose(lock, host, runtime, prefer, formats, list(variants) if variants else None,
                       allow_unvalidated=allow_unvalidated)

    def print_json(name=None, digest=None, path=None, chosen=None, moved=None) -> None:
        """docs/schemas/pull.schema.json: pulled, chosen only (--dry-run), or nothing fits (all null)."""
        import json

        click.echo(json.dumps({"target": name, "digest": digest, "path": path,
                               "runtime": chosen.runtime if chosen else None, "moved": moved,
                               "host": host.as_json(), "candidates": [c.as_json() for c in selection.candidates]},
                              indent=2))

    if target == "auto":
        if selection.chosen is None:
            hint = build_hint(recipe_words, lock, host)
            if as_json:  # a deploy script reads every candidate's reasons; the lines still go to stderr
                print_json()
            raise TrtbuildError(*no_fit_lines(selection, host, lock_name, hint))
        name = selection.chosen.target
    else:
        servable = [tid for tid, _ in targets_of(lock)]
        if target not in servable:
            raise InvalidInput(f"--target {target}: not a target of {lock_name} ({', '.join(servable) or 'none'})")
        from trtbuild.lock.publication import lock_verdict

        held = lock_verdict(lock, target, allow_unvalidated)
        if held:  # what the store publishes is one rule (trtbuild/lock/publication.py): never pulled
            from trtbuild.lock.publication import OVERRIDABLE

            hint = " without --allow-unvalidated" if held in OVERRIDABLE else ""
            raise TrtbuildError(f"--target {target}: held back: {held}; not published, so not pulled{hint}")
        name = target
    entry = lock.targets[name]
    chosen = next((c for c in selection.candidates if c.target == name), None)
    if dry_run:  # the choice alone (a deploy script's question), without touching the artifact
        if as_json:
            print_json(name, entry.digest, chosen=chosen)
        else:
            gpus = f", {chosen.world_size} GPU{'s' if chosen.world_size != 1 else ''}" \
                if chosen and chosen.world_size else ""
            runtime_of = f" ({chosen.runtime}{gpus})" if chosen and chosen.runtime else ""
            click.echo(f"would pull {name}{runtime_of}: artifact {entry.digest}")
        return
    # What only a real pull needs: the local store (made here, not by a dry run) and the transfer code.
    from trtbuild.store.checkout import materialize
    from trtbuild.store.transfer import materialize_to
    from trtbuild.store.local import open_store
    from trtbuild.store.transfer import pull as run_pull

    local = open_store(None, create=True)
    remote = remote_store()
    record = remote.get_record(entry.key)
    if record is None and not remote.has_manifest(entry.digest):
        raise TrtbuildError(f"{name}: artifact {entry.digest} is not in store {store_url}; "
                            f"push it first (`{push_command} --store {store_url}`)")
    from trtbuild.cli.transferbar import bar

    with local.using():
        with bar(f"pull {name}", enabled=not as_json) as progress:  # bytes on a terminal's stderr, else nothing
            digest, moved = run_pull(remote, local, entry.key if record is not None and record.digest == entry.digest
                                     else entry.digest, progress)
        path = materialize_to(local, digest, dest) if dest is not None else materialize(local, digest)
    if as_json:
        print_json(name, digest, str(path), chosen, moved.as_json())
    else:
        click.echo(str(path))


def _published_lock(remote, loaded, lock_path: Path):
    """(where, lock): the lock push last published for `loaded` in `remote`, read now (never kept),
    when it is of this recipe; else one line. `lock_path`: where this host would keep its own."""
    from trtbuild.lock import lockfile
    from trtbuild.recipe.schema import recipe_identity

    where, raw = remote.published_lock(loaded.recipe.name)
    if raw is None:
        raise InvalidInput(f"{lock_path}: no lock file, and {remote.location} has none published ({where}): run "
                           f"`{_command('build', loaded)}` and `{_command('push', loaded)}` first")
    lock = lockfile.parse(raw, where)
    mine = lockfile.recipe_digest(loaded)
    if lock.recipe.digest != mine:
        raise InvalidInput(f"{where}: the lock push published is of recipe {lock.recipe.digest}; this recipe "
                           f"({recipe_identity(loaded)}) is {mine}: push it again from a build of this recipe")
    return where, lock


@cli.command("ls")
@click.argument("recipe", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--store", "store_url", metavar="URL",  # not REMOTE_OPTION: ls takes no lock and never reads the local store
              help="The shared store to list: a folder or s3://bucket/prefix (AWS_ENDPOINT_URL for another "
                   "S3-compatible server; the standard AWS credentials); default: RECIPE's publish.store. ls never "
                   "falls back to the local build store ($TRTBUILD_CACHE); to list what builds there published, "
                   "pass it as --store.")
@click.option("--compatible", is_flag=True,
              help="Judge each target against this host's GPUs and runtimes (the rules of `pull --target auto`).")
@click.option("--json", "as_json", is_flag=True, help="Print every published target, its validations and fit as JSON.")
def ls(recipe: Path | None, store_url, compatible, as_json) -> None:
    """List what the shared store --store (default: RECIPE's publish.store) publishes (its refs; with RECIPE, only
    that recipe's): per target its stage, size, the headline numbers of the validation whose figures
    decide (TensorRT-LLM's, else vLLM's, else torch's: KL mean, top-1 agreement, perplexity change)
    and the runner and device that measured them, its toolchain (STAND-IN when a stand-in made it)
    and age.
    --compatible adds whether it fits this host and, when not, why. Exit 0; 2 for a missing store
    or bad input.
    """
    from trtbuild.deploy import listing
    from trtbuild.store.local import open_store

    loaded = _load(recipe) if recipe is not None else None
    if loaded is not None:
        store_url = _recipe_store(store_url, loaded, "list")
    elif not store_url:
        raise InvalidInput("ls: no store to list: pass --store URL (or a RECIPE whose `publish.store` names one)")
    store = open_store(store_url)
    published = listing.list_published(store, loaded.recipe.name if loaded else None)
    host = None
    if compatible:
        from trtbuild.deploy.select import Host

        host = Host.probe()
        listing.judge(published, host, list(loaded.recipe.variants) if loaded else None)
    now = listing.utc_now()
    if as_json:
        import json

        click.echo(json.dumps({"store": store_url, "recipe": loaded.recipe.name if loaded else None,
                               "host": host.as_json() if host else None,
                               "published": [p.as_json(now) for p in published]}, indent=2))
        return
    if compatible:
        click.echo(f"host: {host.describe()}")
    if not published:
        what = f"of recipe {loaded.recipe.name} " if loaded else ""
        click.echo(f"nothing {what}is published in {store_url}")
        return
    for line in listing.table_lines(published, now, compatible):
        click.echo(line)


@cli.group()
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

        if not render.print_records_plain(records):  # a file or pipe: one record per line
            render.print_records(records, _console())


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
    from trtbuild.lock import lockfile
    from trtbuild.deploy import remote_cache
    from trtbuild.store.gc import gc, remote_gc
    from trtbuild.store.local import open_store

    store = open_store(store_url, create=False)
    limit = parse_size(max_size) if max_size else None
    remote = store.location.startswith("s3://")
    if remote:
        if dry_run and yes:
            raise InvalidInput("--dry-run and --yes: pick one")
        dry_run = not yes
        doomed: list[str] = []
        report = remote_gc(store, lambda: remote_cache.pushed_pins(store), keep_last=keep_last, max_size=limit,
                           dry_run=dry_run, named=doomed.append)
    else:
        pinned: set[str] = set()
        for path in store.workspace().registered_lockfiles():
            if path.exists():
                pinned |= lockfile.digests(path)
        report = gc(store, pinned, keep_last=keep_last, max_size=limit, dry_run=dry_run)
    if as_json:
        import json

        out = report.as_json()
        if remote:
            out.update(dry_run=dry_run, objects=doomed)
        click.echo(json.dumps(out, indent=2))
    else:
        from trtbuild.plan.estimate import format_bytes

        verb = "would remove" if dry_run else "removed"
        if remote:
            for where in doomed:
                click.echo(f"{verb} {where}")
        click.echo(f"{verb} {len(report.records)} records, {report.manifests} manifests, {report.blobs} blobs "
                   f"({format_bytes(report.bytes_freed)}), {report.checkouts} checkouts; store now {format_bytes(report.size_after)}")
        if remote and dry_run:
            click.echo(f"dry run: nothing was removed; `trtbuild cache gc --store {store.location} --yes` removes it")
        if report.over_budget:
            click.echo(f"still above --max-size {max_size}: what is left is pinned by refs or lock files", err=True)


def parse_size(text: str) -> int:
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not match:
        raise InvalidInput(f"--max-size {text}: not a size (examples: 500M, 50G, 2T)")
    number, unit = float(match.group(1)), match.group(2)
    return int(number * 1024 ** " kmgt".index(unit or " "))


@cli.group("lock")
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


@cli.command()
@click.argument("recipe", required=False, type=click.Path(dir_okay=False, path_type=Path))
@STORE_OPTION
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for report.html and report.png (default: <store>/reports/<recipe name>).")
def report(recipe: Path | None, store_url, out_dir: Path | None) -> None:
    """Write an HTML page and a PNG plot of RECIPE's matrix: per target its size, estimated memory,
    KL divergence, top-1 agreement, perplexity change and gates (default: the embedded recipe)."""
    from trtbuild.lock import lockfile
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.report.collect import rows
    from trtbuild.report.html import render_report
    from trtbuild.store.local import open_store

    loaded = _load(recipe)
    # With --out, a store nothing was built into yet reads as empty (a plan-only report);
    # without it the report goes into the store, which has to exist.
    store = open_store(store_url, missing_ok=out_dir is not None)
    plan = plan_recipe(loaded)
    lock = lockfile.read(lockfile.lock_path_for(loaded, store), older_ok=True)
    out_dir = out_dir or store.workspace("a report folder").report_dir(loaded.recipe.name)
    html, png = render_report(loaded.recipe.name, rows(plan, store, lock), out_dir)
    click.echo(f"{html}\n{png}")


@cli.command("path")
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
    from trtbuild.lock import lockfile
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.store.local import open_store

    recipe = Path(names[0]) if len(names) == 2 else None
    target = names[-1]
    loaded = _load(recipe)
    planned = [t.name for t in plan_recipe(loaded).targets]
    if target not in planned:
        raise InvalidInput(f"{target}: not a target of {loaded.recipe.name} ({', '.join(planned)})")
    build = "trtbuild build" + (f" {recipe}" if recipe is not None else "") + f" --target {target}"
    store = open_store(store_url, missing_ok=True)
    lock_path = lockfile.lock_path_for(loaded, store)
    lock = lockfile.read(lock_path, older_ok=True)
    entry = lock.targets.get(target) if lock is not None else None
    if entry is None:
        raise TrtbuildError(f"{target}: not built (not in {lock_path}); run `{build}`")
    if lock.recipe.digest != lockfile.recipe_digest(loaded):  # the lock names what an older recipe made
        raise TrtbuildError(f"{target}: {loaded.path} changed since {lock_path} was written; run `{build}`")
    problem = store.artifact_problem(entry.digest)
    if problem:
        raise TrtbuildError(f"{target}: artifact {entry.digest} is not whole in store {store.location} ({problem}); "
                            f"run `{build}`")
    from trtbuild.store.checkout import materialize

    with store.using():
        click.echo(str(materialize(store, entry.digest)))


@cli.command()
def schema() -> None:
    """Print the JSON Schema of a recipe (for editors and linters)."""
    import json

    from trtbuild.recipe.schema import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


# The garbage collector's first threshold for the command line. A command allocates tens of
# thousands of objects that live until it exits (modules, classes, pydantic's validators, the
# plan and graph); at the default of 700 the collector walked them some 115 times in a no-op
# build and found nothing to free: a tenth of its time. Collections still run, 1/140th as often.
GC_THRESHOLD = 100_000


def main() -> None:
    """The console script (and `python -m trtbuild`). Once the command is done, the process ends
    without the interpreter's module teardown: freeing botocore's service models, pydantic's
    schemas and the rest took 0.15-0.2 s of a 1 s re-push on a 2-core host (benchmarks/RESULTS.md),
    memory the OS takes back anyway. atexit handlers still run and output is flushed first; while
    another thread still works, the ordinary exit (which waits for it) is taken instead."""
    import gc

    from trtbuild import interrupt

    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    interrupt.install()  # Ctrl-C: exit 130 with one line (not click's "Aborted!", exit 1)
    try:
        cli(prog_name="trtbuild")
        code = 0
    except SystemExit as exc:
        code = exc.code
    except interrupt.Interrupted:
        code = None
    if interrupt.requested():  # also when its exception was dropped and the command still ended
        print(interrupt.LINE, file=sys.stderr)
        code = interrupt.EXIT
    _exit_without_teardown(code)


def _exit_without_teardown(code) -> None:
    import atexit
    import os
    import threading

    if code is None:
        code = 0
    elif not isinstance(code, int):  # SystemExit("message"): printed, status 1
        print(code, file=sys.stderr)
        code = 1
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()  # logging's flush, tempfile's finalizers, ...
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (| head): what was written is all it takes
            code = code or 120  # what the interpreter's own exit reports then
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
