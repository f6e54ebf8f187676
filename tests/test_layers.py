"""The layout shows the flow (issue #24): imports go down the layers, never back up, and no two
modules import each other. Read from the code's own import statements (module level, inside
functions and under TYPE_CHECKING alike: a lazy import is still an arrow)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "trtbuild"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """module -> the trtbuild modules (or packages) it names in an import: `from PKG import MOD`
    names MOD, `from MOD import NAME` names MOD (NAME only says what it takes)."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module(p) for p in paths}
    out: dict[str, set[str]] = {}
    for path in paths:
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    names.add(submodule if submodule in modules else node.module)
        out[_module(path)] = {n for n in names if n == "trtbuild" or n.startswith("trtbuild.")}
    return out


IMPORTS = _imports()


def _importers(prefix: str) -> dict[str, list[str]]:
    """Who names a module under `prefix` (a folder's modules or one module), with what."""
    found: dict[str, list[str]] = {}
    for module, names in IMPORTS.items():
        hits = sorted(n for n in names if n == prefix or n.startswith(prefix + "."))
        if hits:
            found[module] = hits
    return found


def test_nothing_imports_the_command_line_but_the_console_script():
    outside = {m: n for m, n in _importers("trtbuild.cli").items()
               if m != "trtbuild.__main__" and not m.startswith("trtbuild.cli")}
    assert outside == {}


@pytest.mark.parametrize("lower, higher", [
    ("trtbuild.plan", "trtbuild.builder"),  # the planner does not import execution (its model config included)
    ("trtbuild.plan", "trtbuild.cli"),
    ("trtbuild.recipe", "trtbuild.plan"),
    ("trtbuild.model", "trtbuild.plan"),
    ("trtbuild.lock", "trtbuild.deploy"),
    ("trtbuild.builder", "trtbuild.deploy"),  # stages and pipeline do not import a verb's module
])
def test_a_lower_layer_does_not_import_a_higher_one(lower, higher):
    back_up = {m: n for m, n in _importers(higher).items() if m == lower or m.startswith(lower + ".")}
    assert back_up == {}


def test_the_graph_asks_the_stage_registry_for_host_needs_not_the_runners():
    """builder/graph.py gets what a node needs of a host (and how a text is digested) from the stages
    (stages/needs.py, through the registry), not by reaching into checkpoint/ or validate/'s runners."""
    reached = sorted(n for n in IMPORTS["trtbuild.builder.graph"]
                     if n.startswith(("trtbuild.checkpoint", "trtbuild.validate.")) and n != "trtbuild.validate.gates")
    assert reached == []


def _owner(name: str) -> str | None:
    """The module of this tree that an imported name is (or is defined in)."""
    while name and name not in IMPORTS:
        name = name.rpartition(".")[0]
    return name or None


@pytest.mark.parametrize("folder", ["trtbuild.lock", "trtbuild.cli", "trtbuild.deploy", "trtbuild.plan",
                                    "trtbuild.recipe", "trtbuild.builder"])
def test_no_two_modules_of_a_folder_import_each_other(folder):
    inside = {m for m in IMPORTS if m.startswith(folder + ".")}
    edges = {m: {_owner(n) for n in IMPORTS[m]} & inside - {m} for m in inside}
    circles = sorted((a, b) for a in inside for b in edges[a] if a < b and a in edges[b])
    assert circles == []


# The layers from the ground up (docs/architecture.md draws them); a module may import its own
# layer or one below it, never one above.
LAYERS = [
    ["trtbuild.errors", "trtbuild.interrupt", "trtbuild.keys", "trtbuild.fsfaults"],
    ["trtbuild.facts", "trtbuild.host", "trtbuild.model"],
    ["trtbuild.recipe", "trtbuild.nemo"],
    ["trtbuild.store"],
    ["trtbuild.checkpoint"],
    ["trtbuild.plan", "trtbuild.serving", "trtbuild.validate"],
    ["trtbuild.lock"],
    ["trtbuild.builder", "trtbuild.bench"],
    ["trtbuild.report", "trtbuild.deploy"],
    ["trtbuild.cli"],
    ["trtbuild.__main__"],
]


def _layer(module: str) -> int | None:
    for rank, members in enumerate(LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members):
            return rank
    return None


def test_every_module_has_a_layer():
    assert sorted(m for m in IMPORTS if m != "trtbuild" and _layer(m) is None) == []


def test_no_import_runs_back_up_a_layer():
    back_up = sorted((m, n) for m, names in IMPORTS.items() if m != "trtbuild"
                     for n in names if n != "trtbuild" and _layer(n) > _layer(m))
    assert back_up == []


def _a_circle(inside: set[str]) -> list[str]:
    """One circle of imports among `inside`'s modules (its modules in order), or [] when there is none."""
    edges = {m: sorted({_owner(n) for n in IMPORTS[m]} & inside - {m}) for m in inside}
    state: dict[str, str] = {}  # "open" while on the path, "done" after

    def visit(module: str, path: list[str]) -> list[str]:
        state[module] = "open"
        for nxt in edges[module]:
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [module, nxt] if nxt in path else [module, nxt]
            if nxt not in state and (found := visit(nxt, path + [module])):
                return found
        state[module] = "done"
        return []

    for module in sorted(inside):
        if module not in state and (found := visit(module, [])):
            return found
    return []


@pytest.mark.parametrize("folder", ["trtbuild.store", "trtbuild.builder", "trtbuild.deploy", "trtbuild"])
def test_no_circle_of_imports(folder):
    """No circle of any length: the store's transports, workspace and cache layer included (its
    errors sit below them all)."""
    assert _a_circle({m for m in IMPORTS if m.startswith(folder + ".")}) == []
