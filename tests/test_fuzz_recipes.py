"""Bad recipes, generated and mutated (hypothesis): `trtbuild plan` and `trtbuild build --until source`
answer each with exactly one line on stderr naming the file (and the YAML path), exit 2, print
nothing on stdout and write nothing: not the store (not even created), not the tmp folder, not the
recipe's folder (each listed before and after).

The budget is fixed and the search derandomized, so CI runs the same examples every time.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtbuild.cli import cli
from trtbuild.recipe import _model_at
from trtbuild.yamlsource import format_path

from conftest import RECIPES, minimal

FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# The recipes mutated: every shipped one, and conftest's minimal one (its config beside it).
BASES = {p.name: yaml.safe_load(p.read_text()) for p in sorted(RECIPES.glob("*.yaml"))}
BASES["minimal.yaml"] = yaml.safe_load(minimal().replace("{config}", "config.json"))
COMMANDS = (("plan",), ("build", "--until", "source"))


# ---- the sandbox: a recipe folder, a store path and a tmp folder, listed before and after -----

class Sandbox:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.recipe = root / "recipes" / "recipe.yaml"
        self.store = root / "store"
        self.tmp = root / "tmp"
        self.recipe.parent.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(exist_ok=True)
        (self.recipe.parent / "config.json").write_text('{"model_type": "llama"}')  # minimal()'s

    def listing(self) -> set[tuple[str, int, int]]:
        return {(str(p.relative_to(self.root)), p.lstat().st_size, p.lstat().st_mtime_ns) for p in self.root.rglob("*")}

    def env(self) -> dict[str, str]:
        return {"TRTBUILD_CACHE": str(self.store), "TMPDIR": str(self.tmp)}


@pytest.fixture
def sandbox(tmp_path, monkeypatch) -> Sandbox:
    box = Sandbox(tmp_path)
    for name, value in box.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(tempfile, "tempdir", str(box.tmp))  # what trtbuild's tempfile calls would use
    return box


def run_bad(box: Sandbox, content: "str | bytes", command: tuple[str, ...]) -> str:
    """Write the recipe, run the command in-process, check exit 2 / one stderr line / nothing written;
    return that line."""
    if isinstance(content, str):
        content = content.encode("utf-8")
    box.recipe.write_bytes(content)
    before = box.listing()
    result = CliRunner().invoke(cli, [command[0], str(box.recipe), *command[1:]], catch_exceptions=False)
    assert (result.exit_code, result.stdout) == (2, ""), result.stderr
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, result.stderr
    assert box.listing() == before
    assert not box.store.exists()
    return result.stderr


def names_path(line: str, box: Sandbox, yaml_path: tuple) -> bool:
    """`FILE:LINE:COL: YAML.PATH: message` for this recipe and this path."""
    pattern = rf"{re.escape(str(box.recipe))}:\d+:\d+: {re.escape(format_path(yaml_path))}: \S.*\n"
    return re.fullmatch(pattern, line) is not None


# ---- the YAML loader against documents built to exhaust it --------------------------------------

def laughs(levels: int, width: int = 9) -> str:
    """The billion-laughs document: each level a list of `width` aliases of the level below."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_billion_laughs_is_refused_fast(sandbox, command):
    start = time.monotonic()
    line = run_bad(sandbox, laughs(9), command)
    assert time.monotonic() - start < 5
    assert line == (f"{sandbox.recipe}:1:20: l4[0][2][0][5][2]: the document expands to more than 10000 values "
                    "(aliases that repeat aliases?)\n")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_an_alias_inside_its_own_anchor_is_refused(sandbox, command):
    assert run_bad(sandbox, "schema: 1\nname: &a [x, *a]\n", command) == (
        f"{sandbox.recipe}:2:7: name[1]: an alias refers to the node that contains it\n")


@pytest.mark.parametrize("depth", [65, 200, 5000])
def test_deep_nesting_is_refused(sandbox, depth):
    line = run_bad(sandbox, "a: " + "[" * depth + "]" * depth + "\n", ("plan",))
    if depth <= 200:  # the loader reaches the limit: the line names where
        path = format_path(("a",) + (0,) * 63)
        assert line == f"{sandbox.recipe}:1:{4 + 63}: {path}: nested deeper than 64 levels\n"
    else:  # PyYAML's own composer recurses first
        assert line == f"{sandbox.recipe}: nested deeper than 64 levels\n"
