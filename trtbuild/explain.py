"""`trtbuild explain`: every field of every key on the way to a target, where each value came from,
and whether the store has it, so nobody has to guess why something rebuilt or did not."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from trtbuild import keys
from trtbuild.errors import InvalidInput
from trtbuild.graph import Graph
from trtbuild.runner import key_fields, resolve_source
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

    def as_json(self) -> dict:
        return {"name": self.id, "stage": self.stage, "key": self.key, "in_store": self.in_store, "digest": self.digest,
                "note": self.note, "fields": [{"field": f.name, "value": f.value, "origin": f.origin} for f in self.fields]}


def explain(graph: Graph, target: str, store: LocalStore, lock: Optional[dict] = None) -> list[NodeExplanation]:
    if target not in {n.id for n in graph.nodes}:
        raise InvalidInput(f"{target}: not a target of {graph.recipe} ({', '.join(n.id for n in graph.nodes)})")
    chain = graph.closure({target}).nodes
    digests: dict[str, Optional[str]] = {}
    out = []
    for node in chain:
        ex = NodeExplanation(node.id, node.stage.name if node.stage else node.kind)
        out.append(ex)
        digests[node.id] = None
        if node.impossible:
            ex.note = f"impossible: {node.impossible}"
            continue
        if node.stage is None:
            ex.note = node.unavailable
            continue
        inputs: dict[str, str] = {}
        origins: dict[str, str] = {}
        missing = [dep for dep in node.inputs.values() if digests.get(dep) is None]
        if missing:
            ex.note = f"key unknown until {', '.join(missing)} is in the store"
            continue
        for role, dep in node.inputs.items():
            inputs[role] = digests[dep]
            origins[role] = f"artifact of {dep}"
        resolution = None
        if node.kind == "source":
            resolution = resolve_source(node, store, locked=(lock or {}).get("source"))
            inputs[resolution.role] = resolution.digest
            pinned = ((lock or {}).get("source") or {}).get("digest")
            origins[resolution.role] = resolution.origin + (" (matches the lock file)" if pinned == resolution.digest
                                                            else " (differs from the lock file)" if pinned else "")
        if node.resolve is not None:
            for role, digest in node.resolve().items():
                inputs[role] = digest
                origins[role] = f"sha256 of the {role} ({node.runtime.get(role, role)}), not of its file names"
        fields = key_fields(node, inputs)
        ex.key = keys.action_key(fields)
        record = store.get_record(ex.key)
        ex.in_store = record is not None and store.has_manifest(record["digest"])
        ex.digest = record["digest"] if ex.in_store else None
        digests[node.id] = ex.digest
        ex.fields.append(FieldLine("stage", fields["stage"], "stage"))
        ex.fields.append(FieldLine("stage_version", fields["stage_version"], "stage code"))
        for role, value in fields["inputs"].items():
            ex.fields.append(FieldLine(f"inputs.{role}", value, origins[role]))
        for name, param in node.params.items():
            ex.fields.append(FieldLine(f"params.{name}", param.value, param.origin))
        for name, value in fields["toolchain"].items():
            ex.fields.append(FieldLine(f"toolchain.{name}", value, "toolchain probe (installed package)"))
        for name, value in fields["platform"].items():
            origin = "target" if name == "sm" else "recipe calibration.device (auto resolved on this host)"
            ex.fields.append(FieldLine(f"platform.{name}", value, origin))
        if resolution is not None:  # what went into the source digest
            for name, value in resolution.lock.items():
                if name == "files":
                    for file, digest in value.items():
                        ex.fields.append(FieldLine(f"source.files.{file}", digest, resolution.origin))
                elif name != "sizes":
                    ex.fields.append(FieldLine(f"source.{name}", value, resolution.origin))
    return out
