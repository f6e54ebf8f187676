"""`trtbuild explain`: every field of every key on the way to a target, where each value came from,
and whether the store has it, so nobody has to guess why something rebuilt or did not."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from trtbuild.plan import engine_command
from trtbuild.host import hardware
from trtbuild.builder import nodekeys
from trtbuild.errors import InvalidInput
from trtbuild.builder.graph import ENGINE, Blocker, Graph, Node
from trtbuild.lock.lockfile import LockFile
from trtbuild.store.local import LocalStore


@dataclass
class FieldLine:
    name: str
    value: Any
    origin: str


@dataclass
class NodeExplanation:
    id: str
    stage: Optional[str]
    key: Optional[str] = None
    in_store: bool = False
    digest: Optional[str] = None
    note: Optional[str] = None
    fields: list[FieldLine] = field(default_factory=list)
    command: Optional[str] = None  # an engine's trtllm-build command line, as the stage would run it here
    command_note: Optional[str] = None
    flags: list[FieldLine] = field(default_factory=list)  # each trtllm-build flag and where it came from

    def as_json(self) -> dict:
        return {"name": self.id, "stage": self.stage, "key": self.key, "in_store": self.in_store, "digest": self.digest,
                "note": self.note, "fields": [{"field": f.name, "value": f.value, "origin": f.origin} for f in self.fields],
                "command": self.command, "command_note": self.command_note,
                "flags": [{"flag": f.name, "value": f.value, "origin": f.origin} for f in self.flags]}


def engine_command_of(graph: Graph, node: Node) -> tuple[str, str]:
    """The engine node's trtllm-build command line as the stage would run it on this host before
    any timing cache is stored, and a note saying what depends on the host and the store."""
    checkpoint = graph.node(node.inputs["checkpoint"]).params
    world_size = checkpoint["tp"].value * checkpoint["pp"].value
    local = len(hardware.detect_gpus())
    workers = engine_command.workers_for(world_size, local)
    argv = engine_command.build_argv(node.param_values(), workers, timing_cache_in=False)
    note = (f"run in a work folder holding {engine_command.CHECKPOINT_DIR}/; --workers {workers}: this host's "
            f"{local} GPU{'s' if local != 1 else ''}, capped by the world size {world_size} (at least 1); "
            f"--input_timing_cache {engine_command.TIMING_CACHE_IN} is added once a timing cache for this SM, "
            "TensorRT version and these tactic options is stored (shown as the first build runs)")
    return engine_command.shell_line(argv), note


def explain(graph: Graph, target: str, store: LocalStore, lock: Optional[LockFile] = None) -> list[NodeExplanation]:
    if target not in {n.id for n in graph.nodes}:
        raise InvalidInput(f"{target}: not a target of {graph.recipe} ({', '.join(n.id for n in graph.nodes)})")
    chain = graph.closure({target}).nodes
    digests: dict[str, Optional[str]] = {}
    out = []
    for node in chain:
        ex = NodeExplanation(node.id, node.stage.ident if node.stage else node.kind)
        out.append(ex)
        digests[node.id] = None
        if node.kind == ENGINE and not node.impossible:  # the command is known before any key is
            ex.command, ex.command_note = engine_command_of(graph, node)
            flags = node.params["flags"]
            ex.flags = [FieldLine(name, value, (flags.parts or {}).get(name, flags.origin))
                        for name, value in flags.value.items()]
        ruled_out = node.ruled_out()
        if ruled_out:
            ex.note = f"{ruled_out.kind.value}: {ruled_out.reason}" if ruled_out.kind == Blocker.PLAN else ruled_out.reason
            continue
        missing = [dep for dep in node.inputs.values() if digests.get(dep) is None]
        if missing:
            ex.note = f"key unknown until {', '.join(missing)} is in the store"
            continue
        keyed = nodekeys.key_node(node, {role: digests[dep] for role, dep in node.inputs.items()}, store,
                                  locked_source=lock.source if lock else None)
        ex.key = keyed.key
        found = nodekeys.lookup(store, keyed.key)
        ex.in_store = found.hit
        ex.digest = found.record.digest if found.hit else None
        if found.problem:
            ex.note = f"recorded, but the artifact is damaged and will be rebuilt: {found.problem}"
        digests[node.id] = ex.digest
        for name in ("stage", "stage_version"):
            ex.fields.append(FieldLine(name, keyed.fields[name], keyed.origins[name]))
        for part in ("inputs", "params", "toolchain", "platform"):
            for name, value in keyed.fields[part].items():
                ex.fields.append(FieldLine(f"{part}.{name}", value, keyed.origins[f"{part}.{name}"]))
        resolution = keyed.resolution
        if resolution is not None:  # what went into the source digest
            for name, value in resolution.lock.items():
                if name == "files":
                    for file, digest in value.items():
                        ex.fields.append(FieldLine(f"source.files.{file}", digest, resolution.origin))
                elif name != "sizes":
                    ex.fields.append(FieldLine(f"source.{name}", value, resolution.origin))
    return out


def explain_target(recipe, target: str, store_url: Optional[str] = None) -> list[NodeExplanation]:
    """`trtbuild explain RECIPE TARGET`: against --store (one nothing was built into yet reads as
    empty: every key is not in the store) and the recipe's lock there, when there is one."""
    from trtbuild.builder.pipeline import BuildRequest, build_graph_for
    from trtbuild.lock import lockfile
    from trtbuild.recipe.schema import load_recipe_or_demo
    from trtbuild.store.local import open_store

    loaded = load_recipe_or_demo(recipe)
    store = open_store(store_url, missing_ok=True)
    graph = build_graph_for(loaded, BuildRequest())
    lock = lockfile.read(lockfile.lock_path_for(loaded, store), older_ok=True)
    return explain(graph, target, store, lock)
