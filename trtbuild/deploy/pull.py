"""`trtbuild pull`: choose a target of a lock for this host (deploy/select.py) and download it from
the shared store into the local store, every blob verified, then materialize it.

The lock is a `.lock` file as given, or a recipe's: the one beside it, else (a deploy host, which
has only the recipe) the lock `trtbuild push` published in the store, read on every pull and used
only when it is of this very recipe (its digest).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from trtbuild.errors import InvalidInput, TrtbuildError

if TYPE_CHECKING:
    from trtbuild.bench.warmstart import Installed
    from trtbuild.deploy.push import ProgressBar
    from trtbuild.deploy.select import Candidate, Host, Selection
    from trtbuild.lock.lockfile import LockFile
    from trtbuild.recipe.schema import LoadedRecipe
    from trtbuild.store.base import Store
    from trtbuild.store.transfer import Moved


@dataclass
class Pulled:
    """docs/schemas/pull.schema.json: pulled, chosen only (--dry-run), or nothing fits (all None)."""

    host: Host
    selection: Selection
    target: Optional[str] = None
    digest: Optional[str] = None
    path: Optional[Path] = None
    chosen: Optional[Candidate] = None  # the candidate of `target`, when it was judged
    moved: Optional[Moved] = None
    serving_command: Optional[list[str]] = None  # a gguf target's packaged server command, run from `path`
    warm_start: Optional[Installed] = None  # with --warm-start: the cache installed, refused or none captured

    def as_json(self) -> dict:
        return {"target": self.target, "digest": self.digest, "path": str(self.path) if self.path else None,
                "runtime": self.chosen.runtime if self.chosen else None,
                "moved": self.moved.as_json() if self.moved else None, "serving_command": self.serving_command,
                "host": self.host.as_json(), "candidates": [c.as_json() for c in self.selection.candidates],
                "chosen_by": self.selection.chosen_by_json(),
                **({"warm_start": self.warm_start.as_json()} if self.warm_start is not None else {})}


class NothingFits(TrtbuildError):
    """No target of the lock fits this host: every target's reasons, as lines; `.pulled` for --json."""

    def __init__(self, pulled: Pulled, *lines: str) -> None:
        super().__init__(*lines)
        self.pulled = pulled


@dataclass
class _Source:
    """Where the lock and the artifacts come from; the shared store is opened when first needed
    (choosing from a recipe's lock needs no request at all)."""

    lock: LockFile
    lock_name: str
    store_url: Optional[str]
    push_command: str  # how the artifact gets there, named when it is not
    recipe_words: str  # the recipe as the hint to build names it ("" for the demo)
    loaded: Optional[LoadedRecipe]
    opened: Optional[Store] = None
    store_exists: Optional[bool] = None  # asked once, by the first measurements() call

    def store(self) -> Store:
        from trtbuild.store.local import open_store

        if self.opened is None:
            self.opened = open_store(self.store_url)
        return self.opened

    def measurements(self, digest: str) -> list:
        """The artifact's serving measurements in the shared store (one listing; none from a store that
        is not there yet: a dry run may choose before anything was pushed)."""
        from trtbuild.store.local import open_store

        store = self.opened or open_store(self.store_url, missing_ok=True)
        if self.store_exists is None:
            self.store_exists = store.exists()
        return store.bench_records(digest) if self.store_exists else []

    def formats(self, target_id: str, entry):
        """An hf-checkpoint's (quant, kv_cache): the recipe's variant, else its record in the store."""
        from trtbuild.facts.nodeids import variant_of

        variants = self.loaded.recipe.variants if self.loaded else None
        variant = variants.get(variant_of(target_id)) if variants else None
        if variant is not None:
            return variant.quant, variant.kv_cache
        record = self.store().get_record(entry.key)
        return (record.fields.params.get("quant"), record.fields.params.get("kv_cache")) if record else None


def pull(lock_or_recipe: Optional[Path], target: str = "auto", gpu: str = "auto", runtime: str = "auto",
         prefer: str = "throughput", dest: Optional[Path] = None, store_url: Optional[str] = None,
         dry_run: bool = False, allow_unvalidated: bool = False, progress: Optional[ProgressBar] = None,
         warm_start: bool = False) -> Pulled:
    """Choose `target` (auto: the best fit for this host) and, unless `dry_run`, pull it into the
    local store (verified) and materialize it (into `dest`, else the store's read-only checkout);
    with `warm_start`, then install the warm-start cache captured on it that matches this host
    (bench/warmstart.pull_install: `.warm_start` says which, or the line refusing it).
    Raises NothingFits, or one line for anything else that stops it."""
    from trtbuild.deploy.select import Host, build_hint, choose, no_fit_lines

    source = _open_source(lock_or_recipe, store_url)
    if not dry_run:  # a store that is not there is the first thing a pull says
        source.store()
    lock = source.lock
    variants = list(source.loaded.recipe.variants) if source.loaded else None
    host = Host.probe(gpu)
    selection = choose(lock, host, runtime, prefer, source.formats, variants, allow_unvalidated=allow_unvalidated,
                       measurements=source.measurements if target == "auto" else None)
    pulled = Pulled(host, selection)
    if target == "auto":
        if selection.chosen is None:
            hint = build_hint(source.recipe_words, lock, host)
            raise NothingFits(pulled, *no_fit_lines(selection, host, source.lock_name, hint))
        name = selection.chosen.target
    else:
        name = _named_target(lock, source.lock_name, target, allow_unvalidated)
    entry = lock.targets[name]
    pulled.target, pulled.digest = name, entry.digest
    pulled.chosen = next((c for c in selection.candidates if c.target == name), None)
    if dry_run:  # the choice alone (a deploy script's question), without touching the artifact
        return pulled
    pulled.digest, pulled.path, pulled.moved = _download(source, name, entry, dest, progress, warm_start)
    if entry.stage == "gguf":
        pulled.serving_command = _gguf_command(pulled.path)
    if warm_start:  # after the artifact is here: a refused cache never undoes the pull (the CLI exits 1)
        from trtbuild.bench.warmstart import pull_install

        chosen_runtime = pulled.chosen.runtime if pulled.chosen else None
        pulled.warm_start = pull_install(source.store(), name, pulled.digest, pulled.path,
                                         runtime if runtime != "auto" else chosen_runtime)
    return pulled


def _gguf_command(folder: Path) -> list[str]:
    """The llama.cpp server command a gguf artifact packages (serving/llamacpp_server.json); one line
    when the pulled folder has none (the artifact is not what its stage writes)."""
    from trtbuild.builder.stages.gguf import SERVER_FILE, read_serving

    serving = read_serving(folder)
    if serving is None:
        raise TrtbuildError(f"{folder / SERVER_FILE}: not found; a gguf artifact packages its server command there")
    return list(serving.command)


def _open_source(lock_or_recipe: Optional[Path], store_url: Optional[str]) -> _Source:
    from trtbuild.lock import lockfile
    from trtbuild.store import configured

    if lock_or_recipe is not None and lock_or_recipe.suffix == ".lock":  # nor the recipe, the planner or a store
        loaded, lock_path = None, lock_or_recipe
        push_command, recipe_words = f"trtbuild push {lock_or_recipe.with_suffix('.yaml')}", str(lock_or_recipe.with_suffix(".yaml"))
    else:
        from trtbuild.deploy.shared import shared_store
        from trtbuild.recipe.schema import load_recipe_or_demo
        from trtbuild.store.local import open_store

        loaded = load_recipe_or_demo(lock_or_recipe)
        store_url = shared_store(store_url, loaded, "pull from")
        lock_path = lockfile.lock_path_for(loaded, open_store(None, missing_ok=True))  # the demo's: the local store's
        push_command, recipe_words = loaded.command("push"), "" if loaded.embedded else str(loaded.path)
    source = _Source(lockfile.read(lock_path), str(lock_path), store_url, push_command, recipe_words, loaded)
    if source.lock is None and loaded is not None:  # a deploy host: the lock push published, if it is this recipe's
        source.lock_name, source.lock = _published_lock(source.store(), loaded, lock_path)
    if source.lock is None:
        raise InvalidInput(f"{lock_path}: no lock file (pull reads the lock that `trtbuild build` wrote)")
    if loaded is None:  # a lock file: the store it records
        source.store_url = configured.shared(store_url, configured.of_lock(source.lock.recipe.publish_store, lock_path),
                                             lock_path, "pull from", lock=True)
    return source


def _published_lock(remote: Store, loaded: LoadedRecipe, lock_path: Path) -> tuple[str, LockFile]:
    """(where, lock): the lock push last published for `loaded` in `remote`, read now (never kept),
    when it is of this recipe; else one line. `lock_path`: where this host would keep its own."""
    from trtbuild.lock import lockfile
    from trtbuild.recipe.schema import recipe_identity

    where, raw = remote.published_lock(loaded.recipe.name)
    if raw is None:
        raise InvalidInput(f"{lock_path}: no lock file, and {remote.location} has none published ({where}): run "
                           f"`{loaded.command('build')}` and `{loaded.command('push')}` first")
    lock = lockfile.parse(raw, where)
    mine = lockfile.recipe_digest(loaded)
    if lock.recipe.digest != mine:
        raise InvalidInput(f"{where}: the lock push published is of recipe {lock.recipe.digest}; this recipe "
                           f"({recipe_identity(loaded)}) is {mine}: push it again from a build of this recipe")
    return where, lock


def _named_target(lock: LockFile, lock_name: str, target: str, allow_unvalidated: bool) -> str:
    """--target NAME: a servable target of the lock that the store publishes, else one line."""
    from trtbuild.deploy.select import targets_of
    from trtbuild.lock.publication import OVERRIDABLE
    from trtbuild.lock.verdict import lock_verdict

    servable = [tid for tid, _ in targets_of(lock)]
    if target not in servable:
        raise InvalidInput(f"--target {target}: not a target of {lock_name} ({', '.join(servable) or 'none'})")
    held = lock_verdict(lock, target, allow_unvalidated)
    if held:  # what the store publishes is one rule (trtbuild/lock/publication.py): never pulled
        hint = " without --allow-unvalidated" if held in OVERRIDABLE else ""
        raise TrtbuildError(f"--target {target}: held back: {held}; not published, so not pulled{hint}")
    return target


def _download(source: _Source, name: str, entry, dest: Optional[Path], progress: Optional[ProgressBar],
              warm_start: bool = False):
    """(digest, path, moved): the artifact pulled into the local store (made here, not by a dry
    run), verified, and materialized."""
    from trtbuild.deploy.push import no_bar
    from trtbuild.store.checkout import materialize
    from trtbuild.store.local import open_store
    from trtbuild.store.transfer import materialize_to
    from trtbuild.store.transfer import pull as run_pull

    local = open_store(None, create=True)
    remote = source.store()
    record = remote.get_record(entry.key)
    if record is None and not remote.has_manifest(entry.digest):
        raise TrtbuildError(f"{name}: artifact {entry.digest} is not in store {source.store_url}; "
                            f"push it first (`{source.push_command} --store {source.store_url}`)")
    with local.using():
        with (progress or no_bar)(f"pull {name}") as bar:  # bytes on a terminal's stderr, else nothing
            digest, moved = run_pull(remote, local, entry.key if record is not None and record.digest == entry.digest
                                     else entry.digest, bar, warm_start)
        path = materialize_to(local, digest, dest) if dest is not None else materialize(local, digest)
    return digest, path, moved
