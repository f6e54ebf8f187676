"""Each runtime fact exists once, in the runtime table (trtbuild/data/runtime-support.json, read by
trtbuild.facts.serving): the runtimes that click accepts, that `pull` chooses among, that `check`
judges, that `ls` and `plan` show, and what each loader accepts, all come from it; no other module
spells a list of runtimes or a runtime's label."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import click
import pytest
from pydantic import ValidationError

from trtbuild.facts import serving

ROOT = Path(__file__).resolve().parents[1]


def _command(name: str) -> click.Command:
    from trtbuild.cli import cli

    return cli.commands[name]


def _option(command: click.Command, name: str) -> click.Option:
    return next(p for p in command.params if p.name == name)


def test_every_reader_offers_the_runtimes_of_the_table():
    from trtbuild.deploy import select
    from trtbuild.serving import check, options

    from trtbuild.facts import runtime_names

    table = tuple(serving.table().runtimes)
    assert serving.RUNTIMES == runtime_names.RUNTIMES == table  # the command line's quick read is the table's
    # pull's candidates, in preference order: llama.cpp (a GGUF, on the CPU) after every GPU runtime
    pulled = (serving.ENGINE_RUNTIME, *table, runtime_names.LLAMACPP_RUNTIME)
    assert select.RUNTIMES == pulled
    assert tuple(_option(_command("pull"), "runtime").type.choices) == ("auto", *pulled)
    assert tuple(inspect.signature(check.check_checkpoint).parameters["runtimes"].default) == table
    help_text = _option(_command("check"), "runtimes").help
    assert all(name in help_text for name in table)
    # per-runtime code (exclusion matching, packaged options) exists for exactly the table's runtimes
    assert set(check.MATCHERS) - {"defects"} == set(table)
    assert set(options.RUNTIME_OPTIONS) == set(table) and set(options.runtime_versions()) == set(table)
    # a host reports the version of every runtime's package
    host = select.Host(gpus=(), tensorrt_llm=None, tensorrt=None,
                       runtimes={r: None for r in table})
    assert {r: host.runtime_version(r) for r in table} == {r: None for r in table}


def test_every_runtime_version_has_one_loader_row():
    rows = [(row.runtime, version) for row in serving.table().loaders for version in row.versions]
    assert sorted(rows) == sorted((name, v) for name, r in serving.RUNTIME_INFO.items() for v in r.versions)


def test_trtllm_loader_facts_are_the_tables():
    # written from tensorrt_llm/_torch/modules/linear.py get_quant_method and mode.py (the cited sources)
    accepted, kv = serving.loader_algos("trtllm")
    assert kv == ("FP8", "INT8", "NVFP4")  # KV_CACHE_QUANT_ALGO_LIST
    assert {"FP8", "NVFP4", "W4A16_AWQ", "W4A8_AWQ", "W8A16"} <= set(accepted)
    assert "W8A8_SQ_PER_CHANNEL" not in accepted  # parses as a QuantAlgo, has no linear method
    assert "W8A8_SQ_PER_CHANNEL" in serving.known_algos("trtllm")
    assert set(accepted) <= set(serving.known_algos("trtllm"))


def _strings(node: ast.AST) -> list[str]:
    return [e.value for e in getattr(node, "elts", []) if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def test_no_module_outside_facts_spells_a_list_of_runtimes_or_a_runtime_label():
    """A second list of runtime names (a click Choice, a preference order, the packages a host
    reports) or a label such as `trtllm>=1.3` in code is a second copy of the table: adding a
    runtime would miss it."""
    names = set(serving.RUNTIMES)
    labels = {r.label for name, r in serving.RUNTIME_INFO.items() if r.label != name}
    found = []
    for path in sorted((ROOT / "trtbuild").rglob("*.py")):
        if path.parent.name == "facts":
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and len(names & set(_strings(node))) >= 2:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {_strings(node)}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                    and any(label in node.value for label in labels):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert found == []


def test_a_row_of_an_unknown_runtime_or_source_is_refused_when_the_table_is_read():
    data = json.loads((ROOT / "trtbuild" / "data" / serving.TABLE_FILE).read_text())
    data["weights"][0] = {**data["weights"][0], "runtime": "tgi"}
    with pytest.raises(ValidationError, match="weights: runtime 'tgi' is not one of trtllm, vllm, sglang"):
        serving.RuntimeTable.model_validate(data)
    data = json.loads((ROOT / "trtbuild" / "data" / serving.TABLE_FILE).read_text())
    data["loaders"][0] = {**data["loaders"][0], "cite": ["nowhere"]}
    with pytest.raises(ValidationError, match="cites 'nowhere', which is not one of its sources"):
        serving.RuntimeTable.model_validate(data)
    data = json.loads((ROOT / "trtbuild" / "data" / serving.TABLE_FILE).read_text())
    data["kv_cache"][0] = {**data["kv_cache"][0], "serves": ["sm75"]}
    with pytest.raises(ValidationError, match="'sm75' is not an SM of trtbuild/data/gpus.json"):
        serving.RuntimeTable.model_validate(data)
