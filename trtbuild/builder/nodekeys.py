"""A graph node's action key: the one place that assembles what a key contains (input digests,
source resolution, parameters, toolchain, platform) with where each value came from, and the
store lookup that decides whether the key is a hit. The runner and `explain` both call it, so what
`explain` shows is what the runner keyed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from trtbuild import keys
from trtbuild.host import hardware
from trtbuild.host import toolchain
from trtbuild.builder.graph import Node
from trtbuild.store.records import ActionRecord
from trtbuild.builder.stages import source as sources
from trtbuild.builder.stages.base import StageRuntime
from trtbuild.builder.stages.source import Resolved, SourceContext
from trtbuild.store.local import LocalStore


@dataclass
class KeyedNode:
    node: Node
    key: str
    fields: dict[str, Any]  # exactly what keys.action_key hashed
    origins: dict[str, str]  # "inputs.source", "params.quant", "platform.device", ... -> where it came from
    runtime: dict[str, Any]  # the node's runtime plus what resolution found (paths): never keyed
    resolution: Optional[Resolved] = None  # for the source node


@dataclass
class Lookup:
    """What the store has under a key: a record whose artifact is whole (`hit`), a record whose
    artifact is damaged (`problem` says how: the key must be rebuilt), or nothing."""

    record: Optional[ActionRecord] = None
    problem: Optional[str] = None
    notes: list[str] = field(default_factory=list)
    pulled_from: Optional[str] = None  # the remote store the artifact was just pulled from (verified)
    pulled: Optional[dict] = None  # what that pull moved (blobs, bytes)

    @property
    def hit(self) -> bool:
        return self.record is not None and self.problem is None


def resolve_source(node: Node, store: LocalStore, progress=None, locked: Optional[dict] = None) -> Resolved:
    """Identify what a source node reads (hashes through the stat cache, hub or bucket metadata):
    nothing is copied or converted. The lock entry names the source as the recipe does."""
    work = store.workspace("a source's downloads")
    runtime = {**node.runtime.as_json(), "downloads": str(work.downloads_dir())}
    if work.state_db_path() is not None:  # a store not created yet (explain) has its stat cache in memory
        runtime["state_db"] = str(work.state_db_path())
    ctx = SourceContext(runtime=StageRuntime.of(runtime), state=store.state, downloads=work.downloads_dir(), locked=locked,
                        progress=progress)
    found = sources.resolve(ctx)
    lock = {"kind": runtime["kind"], "location": runtime["location"], "digest": found.digest, **found.lock}
    return Resolved(found.role, found.digest, lock, {**runtime, **found.runtime}, found.origin)


def resolved_platform(node: Node) -> tuple[dict[str, Any], dict[str, str]]:
    """The platform part of the key and its origins: `auto` devices resolved on this host, because
    ModelOpt's output differs between CPU and CUDA (reference/modelopt.md section 8)."""
    values, origins = {}, {}
    for name, param in node.platform.items():
        values[name], origins[f"platform.{name}"] = param.value, param.origin
        if name == "device":
            values[name] = hardware.resolve_device(param.value)
            if param.value == "auto":
                origins[f"platform.{name}"] += f" (auto, resolved on this host to {values[name]})"
    return values, origins


def key_node(node: Node, input_digests: dict[str, str], store: LocalStore, locked_source: Optional[dict] = None,
             progress=None) -> KeyedNode:
    """The node's key. `input_digests`: role -> artifact digest of each input node."""
    inputs = dict(input_digests)
    origins = {f"inputs.{role}": f"artifact of {dep}" for role, dep in node.inputs.items()}
    runtime = node.runtime.as_json()
    resolution = None
    if node.kind == "source":
        resolution = resolve_source(node, store, progress, locked_source)
        inputs[resolution.role] = resolution.digest
        runtime = resolution.runtime
        pinned = (locked_source or {}).get("digest")
        origins[f"inputs.{resolution.role}"] = resolution.origin + (
            " (matches the lock file)" if pinned == resolution.digest else " (differs from the lock file)" if pinned else "")
    if node.texts:
        for role, digest in node.text_digests(store.state).items():
            inputs[role] = digest
            origins[f"inputs.{role}"] = f"sha256 of the {role} ({getattr(node.runtime, role, None) or role}), not of its file names"
    platform, platform_origins = resolved_platform(node)
    fields = {
        "stage": node.stage.name,
        "stage_version": node.stage.version,
        "inputs": inputs,
        "params": node.param_values(),
        "toolchain": toolchain.stage_fingerprint(node.stage.toolchain, node.runtime.image),
        "platform": platform,
    }
    origins.update({"stage": "stage", "stage_version": "stage code"})
    origins.update({f"params.{name}": param.origin for name, param in node.params.items()})
    origins.update({f"toolchain.{name}": "recipe: toolchain.image (the image pins every package in it)" if name == "image"
                    else "toolchain probe (installed package)" for name in fields["toolchain"]})
    origins.update(platform_origins)
    return KeyedNode(node, keys.action_key(fields), fields, origins, runtime, resolution)


def lookup(store: LocalStore, key: str, remote=None) -> Lookup:
    """The store's answer for a key. A record counts only if every byte of its artifact is there
    and checks out; a damaged one is reported (and rebuilt by the runner), never served. `remote`
    (a remote_cache.RemoteCache): where a miss is looked up next, its artifact pulled and verified."""
    record = store.get_record(key)
    found = Lookup() if record is None else Lookup(record, store.artifact_problem(record.digest))
    if found.hit or remote is None:
        return found
    pulled = remote.fetch(store, key, replace=record is not None)
    if pulled.record is None:
        return Lookup(found.record, found.problem, [pulled.note] if pulled.note else [])
    return Lookup(pulled.record, store.artifact_problem(pulled.record.digest), pulled_from=remote.location,
                  pulled=pulled.moved.as_json())
