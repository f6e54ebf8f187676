"""`trtbuild build`: recipe -> plan -> stage graph -> run against the store -> refs and lock file."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from trtbuild.builder import graph as graphs
from trtbuild.host import hardware
from trtbuild.lock import lockfile
from trtbuild.host import toolchain
from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.plan.expand import parse_gpu, plan_recipe, select
from trtbuild.recipe.schema import LoadedRecipe, recipe_identity
from trtbuild.builder.runner import FAILED, IMPOSSIBLE, NodeResult, RunOptions, run_graph
from trtbuild.store.local import LocalStore


@dataclass
class BuildRequest:
    targets: list[str] = field(default_factory=list)  # globs
    until: Optional[str] = None
    gpu: str = "all"  # all | auto | an SM or product
    require_all: bool = False
    locked: bool = False
    materialize: bool = False
    validate: bool = True  # False: --no-validate (the lock file says so)
    rebuild: list[str] = field(default_factory=list)  # globs: build these anew even when the store has them
    lock_out: Optional[Path] = None  # --lock-out: this run's targets only, written there (RECIPE.lock untouched)


@dataclass
class BuildOutcome:
    recipe: str
    results: list[NodeResult]
    lock_path: Optional[Path]
    graph: Optional[graphs.Graph] = None
    pushed: Optional[dict] = None  # --push: what was published, refused and moved

    @property
    def exit_code(self) -> int:
        refused = bool(self.pushed and self.pushed["refused"])
        return 1 if refused or any(r.status == FAILED for r in self.results) else 0

    def as_json(self) -> dict:
        out = {"recipe": self.recipe, "lock": str(self.lock_path) if self.lock_path else None,
               "targets": [r.as_json() for r in self.results]}
        if self.pushed is not None:
            out["push"] = self.pushed
        return out


def build_graph_for(loaded: LoadedRecipe, request: BuildRequest, registry=None, state=None) -> graphs.Graph:
    """`state`: the store's stat cache, which keeps what planning read of the source (plan_recipe)."""
    # --gpu auto plans every engine; the runner builds this host's SMs (RunOptions.host_sms)
    plan = plan_recipe(loaded, gpu_filter=None if request.gpu == "auto" else parse_gpu(request.gpu), state=state)
    plan = select(plan, request.targets)
    graph = graphs.build_graph(plan, registry, validate=request.validate)
    if request.targets:  # the chosen targets, their validations (and twins), and everything those need
        chosen = {t.name for t in plan.targets}
        graph = graph.closure(chosen | {n.id for n in graph.nodes if n.serves in chosen})
    return graph


def build(loaded: LoadedRecipe, store: LocalStore, request: BuildRequest, reporter=None, registry=None,
          remote=None) -> BuildOutcome:
    """`remote` (remote_cache.RemoteCache): looked up when the local store misses a key."""
    if request.until is not None and request.until not in graphs.STAGE_ORDER:
        raise InvalidInput(f"--until {request.until}: not a stage ({', '.join(graphs.STAGE_ORDER)})")
    lock_path = lockfile.lock_path_for(loaded, store)
    locked = lockfile.check_locked(lock_path, loaded) if request.locked else None
    graph = build_graph_for(loaded, request, registry, store.state)
    known = _recipe_nodes(loaded, request, graph, registry, store.state)
    # --locked: the run stops where the lock would change (with --lock-out: the recipe and source only)
    pinned = lockfile.Pinned(lock_path, locked, targets=request.lock_out is None) if locked else None
    if pinned:
        pinned.planned(known, request.validate)
    previous = lockfile.read(lock_path, older_ok=True)
    options = RunOptions(until=request.until, require_all=request.require_all, materialize=request.materialize,
                         validated=request.validate, pinned=pinned,
                         locked_source=previous.source if previous else None,
                         recipe_identity=recipe_identity(loaded),
                         rebuild=frozenset(_rebuilt(graph, request.rebuild)),
                         host_sms=frozenset(g.sm for g in hardware.detect_gpus()) if request.gpu == "auto" else None,
                         remote=remote)
    run = run_graph(graph, store, options, reporter)
    results, resolutions = run.results, run.resolutions
    if request.require_all:  # (the runner already fails what this host cannot build)
        for r in results:
            if r.status == IMPOSSIBLE:
                r.reason = f"--require-all: {r.reason}"
                r.status = FAILED
    source = resolutions["source"].lock if "source" in resolutions else None
    written = request.lock_out or lock_path
    if any(r.digest for r in results):
        lockfile.write(written, loaded, source, results, _toolchains(graph, results), validated=request.validate,
                       partial_of=lock_path if request.lock_out else None,
                       made_from={node.id: list(node.inputs.values()) for node in graph.nodes}, known=known,
                       pinned=pinned)
        store.workspace().register_lockfile(written)
    return BuildOutcome(loaded.recipe.name, results, written, graph)


def _recipe_nodes(loaded: LoadedRecipe, request: BuildRequest, graph: graphs.Graph, registry, state) -> set[str]:
    """Every node id a build of the recipe has (all targets, every SM, validations): a lock entry
    of another id describes nothing this recipe builds. `graph` when the request is the whole."""
    if not request.targets and request.gpu in ("all", "auto") and request.validate:
        return {n.id for n in graph.nodes}
    return {n.id for n in build_graph_for(loaded, BuildRequest(), registry, state).nodes}


def _rebuilt(graph: graphs.Graph, patterns: list[str]) -> set[str]:
    """--rebuild GLOB: the matching nodes; a pattern matching nothing is a typo, refused."""
    chosen: set[str] = set()
    for pattern in patterns:
        matched = {n.id for n in graph.nodes if fnmatch.fnmatchcase(n.id, pattern)}
        if not matched:
            raise InvalidInput(f"--rebuild {pattern}: matches no node of {graph.recipe} ({', '.join(n.id for n in graph.nodes)})")
        chosen |= matched
    return chosen


def _toolchains(graph: graphs.Graph, results: list[NodeResult]) -> dict[str, dict]:
    """The lock records the toolchain once per stage id (`checkpoint:convert` and `checkpoint:export`
    are different stages with different packages), from the nodes this run keyed."""
    keyed = {r.id for r in results if r.key}
    out: dict[str, dict] = {}
    for node in graph.nodes:
        if node.id in keyed and node.stage and node.stage.toolchain:
            out.setdefault(node.stage.ident, toolchain.stage_fingerprint(node.stage.toolchain, node.runtime.image))
    return out


def checkout_target(recipe: Optional[Path], target: str, store_url: Optional[str] = None) -> Path:
    """`trtbuild path`: the folder of TARGET's artifact as RECIPE's lock (None: the embedded demo's)
    names it, the store's read-only checkout, made if it is not there yet. One line when TARGET is
    not a target of the recipe (InvalidInput), or not built, or not whole in the store."""
    from trtbuild.recipe.schema import load_recipe_or_demo
    from trtbuild.store.checkout import materialize
    from trtbuild.store.local import open_store

    loaded = load_recipe_or_demo(recipe)
    planned = [t.name for t in plan_recipe(loaded).targets]
    if target not in planned:
        raise InvalidInput(f"{target}: not a target of {loaded.recipe.name} ({', '.join(planned)})")
    build_command = "trtbuild build" + (f" {recipe}" if recipe is not None else "") + f" --target {target}"
    store = open_store(store_url, missing_ok=True)
    lock_path = lockfile.lock_path_for(loaded, store)
    lock = lockfile.read(lock_path, older_ok=True)
    entry = lock.targets.get(target) if lock is not None else None
    if entry is None:
        raise TrtbuildError(f"{target}: not built (not in {lock_path}); run `{build_command}`")
    if lock.recipe.digest != lockfile.recipe_digest(loaded):  # the lock names what an older recipe made
        raise TrtbuildError(f"{target}: {loaded.path} changed since {lock_path} was written; run `{build_command}`")
    problem = store.artifact_problem(entry.digest)
    if problem:
        raise TrtbuildError(f"{target}: artifact {entry.digest} is not whole in store {store.location} ({problem}); "
                            f"run `{build_command}`")
    with store.using():
        return materialize(store, entry.digest)
