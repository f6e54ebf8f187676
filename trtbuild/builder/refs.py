"""Which refs a run moves, once every node has run: a done node's ref moves to its artifact only when
the validations its recipe asks (and this host could run) passed (publication.held_back judges);
a validation's ref moves with the ref of the node it serves."""

from __future__ import annotations

from typing import Optional

from trtbuild.builder.graph import Blocker, Graph, Node
from trtbuild.builder.results import FAILED, SKIPPED, NodeResult
from trtbuild.facts.nodeids import TARGET_STAGES
from trtbuild.lock import publication
from trtbuild.store.local import CorruptStore, LocalStore
from trtbuild.store.summaries import ValidationSummary


# The order in which validations' figures decide (and head `ls` and the report): what the serving
# runtime measured before what torch did. A graph node's `runner` param names its runner.
DECIDING_ORDER = ("tensorrt_llm", "vllm", "torch")


def _runner(node: Node) -> Optional[str]:
    param = node.params.get("runner")
    return param.value if param else None


def _checks(graph: Graph, node: Node, results: dict[str, NodeResult]) -> tuple[list[publication.Check], list[Node], list[Node]]:
    """The node's validations as publication.held_back judges them (an engine's with its
    checkpoint's); the validations whose figures decide (ran and passed), deciding
    first; and the runtime validations this host could not run. A runtime validation (TensorRT-LLM's,
    vLLM's) skipped because this host lacks the runtime or a GPU is excused (ELSEWHERE) only when a
    torch validation ran and passed: then torch's figures decide alone."""
    ranks = {runner: n for n, runner in enumerate(DECIDING_ORDER)}
    own = sorted(graph.validations_of(node.id), key=lambda v: ranks.get(_runner(v), len(ranks)))
    validations = graph.validations_of(node.id)  # in graph order: torch's first, whose absence the others wait on
    if node.kind == "engine" and "checkpoint" in node.inputs:  # its checkpoint's figures judge it too (after its own)
        validations += graph.validations_of(node.inputs["checkpoint"])
    ran = [v for v in own if results[v.id].done]
    torch_passed = any(_runner(v) == "torch" and results[v.id].done for v in own)
    elsewhere = [v for v in own if results[v.id].status == SKIPPED and results[v.id].blocker == Blocker.HOST
                 and _runner(v) in DECIDING_ORDER[:-1]] if torch_passed else []
    checks = []
    for v in validations:
        done = results[v.id]
        if done.status == FAILED:
            state, detail = publication.FAILED, "its gates" if done.digest else ""
        elif done.done:
            state, detail = publication.PASSED, ""
        elif v in elsewhere:
            state, detail = publication.ELSEWHERE, ""
        else:
            state, detail = publication.NOT_RUN, str(done.status)
        checks.append(publication.Check(v.id, state, detail, tuple(done.standin)))
    return checks, ran, elsewhere


def _ref_verdict(graph: Graph, node: Node, results: dict[str, NodeResult],
                 validated: bool = True) -> tuple[Optional[str], list[Node], list[Node]]:
    """Whether a done node's ref may move: (why not, or None; the validations that decided, deciding
    first; the runtime validations this host could not run). A target's is publication.held_back's
    verdict (so is any node with validations); a node that is neither (the source, a calibration set,
    ...) always moves."""
    checks, ran, elsewhere = _checks(graph, node, results)
    if node.serves is not None or (node.kind not in TARGET_STAGES and not checks):  # no target, nothing judges it
        return None, ran, elsewhere
    why = publication.held_back(validated, checks, results[node.id].standin)
    return (why, [], []) if why else (None, ran, elsewhere)


def move_refs(graph: Graph, store: LocalStore, results: dict[str, NodeResult], validated: bool = True) -> None:
    """Point each done node's ref at its artifact when `_ref_verdict` allows it: a ref never names an
    artifact that has not passed what the recipe asks and this host could measure. A validation's
    ref moves with the ref of the node it serves, so that the validations a store holds beside a
    target are those of its artifact: the ref of a runtime validation this host could not run is
    removed unless it names a validation of this very artifact (made on another host)."""
    served = {n.id for n in graph.nodes}
    for node in graph.nodes:
        result = results[node.id]
        if not result.done or (node.kind == "validate" and node.serves in served):
            continue
        why, decided, elsewhere = _ref_verdict(graph, node, results, validated)
        if why:
            result.ref = why
            continue
        store.update_ref(graph.recipe, node.id, result.digest, result.key)
        for validation in decided:
            done = results[validation.id]
            store.update_ref(graph.recipe, validation.id, done.digest, done.key)
            said = done.summary if isinstance(done.summary, ValidationSummary) else None
            result.decided_by.append({"validation": validation.id, "runner": said.runner if said else None,
                                      "device": said.device if said else None})
        for validation in elsewhere:
            if not _validates(store, graph.recipe, validation, results):
                store.delete_ref(graph.recipe, validation.id)


def _validates(store: LocalStore, recipe: str, validation: Node, results: dict[str, NodeResult]) -> bool:
    """Whether the validation's ref names a validation of what this run made (the same inputs: the
    candidate, the reference and the calibration set)."""
    try:
        ref = store.read_ref(recipe, validation.id)
    except CorruptStore:  # a malformed ref names nothing: it goes
        return False
    record = store.get_record(ref.key) if ref is not None else None
    if record is None:
        return False
    return all(record.fields.inputs.get(role) == results[dep].digest for role, dep in validation.inputs.items())
