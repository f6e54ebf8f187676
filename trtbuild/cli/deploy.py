"""`trtbuild push`, `pull`, `ls` and `check`: publish a build to a shared store, take a target from
it onto a deploy host, list what it publishes, and check that a folder can be served here."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

from trtbuild.cli.common import REMOTE_OPTION
from trtbuild.facts.runtime_names import PULL_RUNTIMES, names_text


def _bar(as_json: bool):
    """A bar of bytes on a terminal's stderr (never with --json), opened by the transfer."""
    from trtbuild.cli.transferbar import bar

    return lambda label: bar(label, enabled=not as_json)


@click.command()
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
    from trtbuild.cli.common import echo_pushed
    from trtbuild.deploy.push import push_recipe

    pushed = push_recipe(recipe, store_url, list(targets), allow_unvalidated, _bar(as_json)).as_json()
    if as_json:
        click.echo(json.dumps(pushed, indent=2))
    echo_pushed(pushed, as_json)
    raise click.exceptions.Exit(1 if pushed["refused"] else 0)


@click.command()
@click.argument("lock_or_recipe", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--target", default="auto", show_default=True, metavar="NAME|auto",
              help="The target to pull, or auto: the one that fits this host best.")
@click.option("--gpu", default="auto", show_default=True, metavar="auto|SM",
              help="auto: every GPU NVML sees; an SM: only this host's GPUs of that SM count.")
@click.option("--runtime", type=click.Choice(["auto", *PULL_RUNTIMES]), default="auto",
              show_default=True, help="What will serve it: a TensorRT engine, an hf-checkpoint on TensorRT-LLM's "
              "PyTorch backend (1.3+), vLLM or SGLang, or a gguf target on llama.cpp (llama-cpp-python's server, "
              "on the CPU).")
@click.option("--prefer", type=click.Choice(["throughput", "latency"]), default="throughput", show_default=True,
              help="Among targets that fit: by serving measurements on this host's GPU (or CPU, for gguf) when "
                   "they compare two (highest output tok/s; lowest end-to-end p50), else the fewest GPUs "
                   "(throughput) or the most (latency).")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Materialize into this folder (atomically); default: the local store's read-only checkout.")
@REMOTE_OPTION
@click.option("--dry-run", is_flag=True, help="Only choose: print the target pull would take and download nothing "
              "(the store is not contacted unless a target's format must be read from its record).")
@click.option("--allow-unvalidated", is_flag=True,
              help="Also pull (and choose among) targets of a --no-validate build, as `push --allow-unvalidated` "
                   "publishes them; never one whose validation failed or a stand-in made.")
@click.option("--warm-start", is_flag=True,
              help="Then install the warm-start cache captured on the artifact (vLLM's or TensorRT-LLM's compile "
                   "and autotune caches, `bench --capture-warm-start`) where the runtime looks ($VLLM_CACHE_ROOT, "
                   "default ~/.cache/vllm), only when this host matches every part of its key; else one line "
                   "naming the part that differs, nothing installed, exit 1.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the choice, every target's fit and the path as JSON (also when nothing fits).")
def pull(lock_or_recipe: Path | None, target, gpu, runtime, prefer, dest, store_url, dry_run, allow_unvalidated,
         warm_start, as_json) -> None:
    """Download a target of LOCK_OR_RECIPE (a `.lock` file, or a recipe: its lock, default: the
    embedded demo recipe) from --store (default: the recipe's publish.store; for a lock, the one it
    records) into the local store, verifying every blob, and print where it is. A recipe whose lock
    is not on this host (a deploy host) is pulled by the lock `trtbuild push` published in the
    store, read on every pull, when it is of this very recipe (its digest). With --target auto, choose for this host: engines
    of its SM and exact tensorrt_llm / tensorrt, hf-checkpoints a runtime here serves on its SM,
    what fits in memory, then --prefer, then the recipe's variant order; gguf targets (llama.cpp, on
    the CPU, where llama-cpp-python is installed) only after those, so a host without an NVIDIA GPU
    takes one. --dry-run only chooses: it prints the target it would pull and downloads nothing. A
    gguf target's packaged server command is printed on stderr (in the JSON: serving_command). A bar of bytes is drawn on stderr when it
    is a terminal (never with --json). Exit 0 pulled (or chosen), 1 nothing fits (every target is
    listed with the reason; with --json, also on stdout) or the store is damaged, 2 on invalid input.
    --warm-start then installs the artifact's warm-start cache that matches this host (a line on
    stderr; in the JSON: warm_start), or refuses the one captured elsewhere with one line naming the
    part of its key that differs (exit 1, the artifact pulled, no cache installed); none captured:
    a line saying so, exit 0.
    """
    from trtbuild.deploy import pull as deploy_pull

    try:
        pulled = deploy_pull.pull(lock_or_recipe, target, gpu, runtime, prefer, dest, store_url, dry_run,
                                  allow_unvalidated, _bar(as_json), warm_start=warm_start)
    except deploy_pull.NothingFits as exc:
        if as_json:  # a deploy script reads every candidate's reasons; the lines still go to stderr
            click.echo(json.dumps(exc.pulled.as_json(), indent=2))
        raise
    if pulled.selection.note and target == "auto":  # how it was chosen: by measured figures, or by the rule
        click.echo(pulled.selection.note, err=True)
    if as_json:
        click.echo(json.dumps(pulled.as_json(), indent=2))
    elif dry_run:
        from trtbuild.deploy.select import served_on

        chosen = pulled.chosen
        runtime_of = f" ({chosen.runtime}, {served_on(chosen.runtime, chosen.world_size)})" \
            if chosen and chosen.runtime else ""
        click.echo(f"would pull {pulled.target}{runtime_of}: artifact {pulled.digest}")
    else:
        click.echo(str(pulled.path))
        if pulled.serving_command:  # on stderr: stdout stays the folder alone, for `cd "$(trtbuild pull ...)"`
            click.echo(f"serve it from that folder: {shlex.join(pulled.serving_command)}", err=True)
    if pulled.warm_start is not None:  # the artifact is pulled either way; a refused cache is exit 1
        click.echo(pulled.warm_start.line, err=True)
        if pulled.warm_start.refused:
            raise click.exceptions.Exit(1)


@click.command("ls")
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

    listed = listing.list_store(recipe, store_url, compatible)
    if as_json:
        click.echo(json.dumps(listed.as_json(), indent=2))
        return
    if compatible:
        click.echo(f"host: {listed.host.describe()}")
    if not listed.published:
        what = f"of recipe {listed.recipe} " if listed.recipe else ""
        click.echo(f"nothing {what}is published in {listed.store}")
        return
    for line in listing.table_lines(listed.published, listed.now, compatible):
        click.echo(line)


@click.command()
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
    does with it), then one line per runtime, or per reason it is rejected. A GGUF folder
    (model.gguf, as a gguf target holds): this host's llama.cpp loads it (llama-cpp-python, in a
    process of its own) and its report.json and packaged server options are checked; OK with the
    llama-cpp-python version, the file's type and architecture and the server command, or one line
    per problem naming the file (llama.cpp's reason when it cannot load it).

    Exit 0 when it fits / every asked runtime accepts it (on every asked SM) and it has no
    defects / llama.cpp loads it, 1 when not (a stand-in engine never fits), 2 when DIR is none of
    these.
    """
    from trtbuild.deploy.check import check_folder

    checked = check_folder(folder, lock_path, runtimes, gpus)
    if as_json:
        click.echo(json.dumps(checked.as_json(), indent=2))
    else:
        for line in checked.lines():
            click.echo(line)
    raise click.exceptions.Exit(checked.exit_code)
