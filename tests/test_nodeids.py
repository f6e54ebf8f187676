"""trtbuild/facts/nodeids.py is the one maker and parser of node ids (issue #24: plan, pull, ls, push and
the lock each had the grammar): target ids made from their parts read back as those parts, and the
ids of nodes derived from a target are never read as targets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trtbuild.facts import nodeids

VARIANTS = st.from_regex(r"[a-z0-9]+(-[a-z0-9]+)*", fullmatch=True)
SMS = st.sampled_from(["sm80", "sm86", "sm89", "sm90", "sm100", "sm120"])


@pytest.mark.parametrize("made, expected", [
    (nodeids.checkpoint_id("fp8", 1, 1), "fp8-tp1"),
    (nodeids.checkpoint_id("int4-awq", 2, 2), "int4-awq-tp2-pp2"),
    (nodeids.engine_id("fp8-fp8kv", 4, 1, "sm90"), "fp8-fp8kv-tp4-sm90"),
    (nodeids.engine_id("base", 2, 4, "sm100"), "base-tp2-pp4-sm100"),
    (nodeids.hf_id("nvfp4"), "nvfp4-hf"),
])
def test_target_ids(made, expected):
    assert made == expected


@given(variant=VARIANTS, tp=st.integers(1, 64), pp=st.integers(1, 64), sm=SMS)
def test_a_target_id_reads_back_as_its_variant_and_an_engine_as_its_checkpoint(variant, tp, pp, sm):
    checkpoint, engine, hf = (nodeids.checkpoint_id(variant, tp, pp), nodeids.engine_id(variant, tp, pp, sm),
                              nodeids.hf_id(variant))
    assert [nodeids.variant_of(i) for i in (checkpoint, engine, hf)] == [variant] * 3
    assert nodeids.checkpoint_of_engine(engine, sm) == checkpoint


@pytest.mark.parametrize("node_id, stage, target, variant", [
    ("fp8-tp1", "checkpoint", True, "fp8"),
    ("fp8-tp1-sm90", "engine", True, "fp8"),
    ("fp8-hf", "hf-checkpoint", True, "fp8"),
    ("fp8-tp1-sm90:twin", "engine", False, None),  # an engine's stage, derived from a target
    ("fp8-hf:validate-vllm", "validate", False, None),
    ("fp8-tp1:validate", "validate", False, None),
    ("fp8-quantized", "quantize", False, None),
    ("fp8-hf-export", "hf-export", False, None),
    ("source", "source", False, None),
    ("reference", "reference", False, None),
])
def test_what_is_a_target(node_id, stage, target, variant):
    assert (nodeids.is_target(node_id, stage), nodeids.variant_of(node_id)) == (target, variant)


def test_no_module_but_nodeids_spells_the_grammar_of_an_id():
    """`-tp2`, `-hf`, `:validate`, `:twin` ... are written (in an f-string or a constant) by
    facts/nodeids.py only; every other module calls it, so the grammar cannot drift."""
    import ast
    import re
    from pathlib import Path

    grammar = re.compile(r"^(-(tp|hf|export|quantized)\b|:(validate|twin)\b)")  # -pp follows -tp
    root = Path(__file__).resolve().parents[1]
    found = []
    for path in sorted((root / "trtbuild").rglob("*.py")):
        if path.name == "nodeids.py":
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                    and grammar.match(node.value):
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.value!r}")
    assert found == []
