"""Bad recipes, generated and mutated (hypothesis): `trtbuild plan` and `trtbuild build --until source`
answer each with exactly one line on stderr naming the file (and the YAML path), exit 2, print
nothing on stdout and write nothing: not the store (not even created), not the tmp folder, not the
recipe's folder (each listed before and after).

The budget is fixed and the search derandomized, so CI runs the same examples every time.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
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
from trtbuild.recipe.schema import Recipe
from trtbuild.recipe.yamlerrors import model_at
from trtbuild.recipe.yamlsource import format_path

from conftest import RECIPES, TINY_LLAMA, minimal

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
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
        # The configs the recipes name, so that a mutation the schema let through would plan (exit 0).
        shutil.copytree(RECIPES / "configs", self.recipe.parent / "configs")
        (self.recipe.parent / "config.json").write_text(json.dumps(TINY_LLAMA))  # minimal()'s

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


# ---- mutations of valid recipes: each makes exactly one thing wrong -----------------------------

HUGE = "__huge__"  # a placeholder, replaced by a long run of digits once dumped


def nodes(data, path=()):
    """(path, value) of every value in a recipe, except inside engine.flags (free-form by design)."""
    yield path, data
    if path[:2] == ("engine", "flags"):
        return
    if isinstance(data, dict):
        for key, value in data.items():
            yield from nodes(value, path + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from nodes(value, path + (i,))


def put(data, path, value):
    data = copy.deepcopy(data)
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return data


def dump(data, digits: int = 0) -> str:
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=10_000)
    assert f"'{HUGE}" not in text  # written plain, so the placeholder becomes a plain integer
    return text.replace(HUGE, "9" * digits)


def kind(value) -> str:
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}[type(value)]


# Values of another YAML kind than the one a field holds (never null: null means "unset" to Optional fields).
OTHER_KIND = {
    "dict": st.sampled_from([[1, 2], 7, "text", True]),
    "list": st.sampled_from([{"a": 1}, 7, "text", False]),
    "str": st.sampled_from([7, 2.5, True, [], ["x"], {"a": "b"}]),
    "int": st.sampled_from(["7", 2.5, True, [7], {"a": 7}]),
    "float": st.sampled_from(["0.5", True, [0.5], {"a": 0.5}]),
    "bool": st.sampled_from([1, "true", [True], {"a": True}]),
}
# Fields whose strings must match a pattern or a list of names (free strings such as paths may be anything).
CONSTRAINED = re.compile(r"^(name|dtype|source\.(hf|s3)|variants\.[^.]+\.(quant|kv_cache)|gpus\[\d+\]|backends\[\d+\]|"
                         r"(calibration|validate)\.device|validate\.engines|toolchain\.image)$")
NON_ASCII = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12).filter(
    lambda s: any(ord(c) > 127 for c in s))


@st.composite
def mutation(draw):
    """(base recipe, mutated text, the YAML path the error must name)."""
    name = draw(st.sampled_from(sorted(BASES)))
    base = BASES[name]
    every = [(p, v) for p, v in nodes(base) if p]
    how = draw(st.sampled_from(["wrong type", "unknown key", "huge number", "unicode", "missing key"]))
    if how == "wrong type":
        path, value = draw(st.sampled_from(every))
        return name, dump(put(base, path, draw(OTHER_KIND[kind(value)]))), path
    if how == "unknown key":
        models = [p for p, v in [((), base)] + every if isinstance(v, dict) and model_at(p + ("x",), Recipe)]
        path = draw(st.sampled_from(models))
        model = model_at(path + ("x",), Recipe)
        known = {n for n in model.model_fields} | {f.alias for f in model.model_fields.values() if f.alias}
        key = draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in known and k != "<<"))
        target = dict(base) if not path else None
        mutated = put(base, path, {**(target or _get(base, path)), key: 1}) if path else {**base, key: 1}
        return name, dump(mutated), path + (key,)
    if how == "huge number":
        ints = [(p, v) for p, v in every if kind(v) in ("int", "float")]
        path, value = draw(st.sampled_from(ints))
        if kind(value) == "float":
            return name, dump(put(base, path, draw(st.sampled_from([float("nan"), float("inf"), -float("inf")])))), path
        digits = draw(st.integers(min_value=11, max_value=6000))
        return name, dump(put(base, path, HUGE if draw(st.booleans()) else "-" + HUGE), digits), path
    if how == "unicode":
        strings = [(p, v) for p, v in every if kind(v) == "str" and CONSTRAINED.match(format_path(p))]
        path, _ = draw(st.sampled_from(strings))
        return name, dump(put(base, path, draw(NON_ASCII))), path
    required = draw(st.sampled_from(["schema", "name", "source"]))
    return name, dump({k: v for k, v in base.items() if k != required}), (required,)


def _get(data, path):
    for part in path:
        data = data[part]
    return data


@FUZZ
@given(case=mutation(), command=st.sampled_from(COMMANDS), share=st.booleans())
def test_a_mutated_recipe_gets_one_line_naming_the_path(sandbox, case, command, share):
    name, text, path = case
    if share and path[:1] != ("variants",) and "variants" in BASES[name]:
        # One variant's mapping also under a second name, through an anchor and an alias: valid, so
        # the one error is still the mutation's.
        first = text.index("variants:\n  ") + len("variants:\n  ")
        variant = text[first:text.index(":", first)]
        assert f"  {variant}: &" not in text
        lines = text.replace(f"  {variant}:", f"  {variant}: &shared", 1).split("\n")
        end = next(i for i in range(lines.index("variants:") + 1, len(lines)) if not lines[i].startswith(" "))
        text = "\n".join(lines[:end] + ["  again: *shared"] + lines[end:])
    line = run_bad(sandbox, text, command)
    assert names_path(line, sandbox, path), (line, text)


def yaml_values():
    scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=8)


@FUZZ
@given(value=yaml_values(), command=st.sampled_from(COMMANDS))
def test_a_document_that_is_not_a_mapping_is_one_line(sandbox, value, command):
    text = yaml.safe_dump(value, allow_unicode=True)
    assert run_bad(sandbox, text, command) == f"{sandbox.recipe}:1:1: a recipe is a YAML mapping (schema, name, source, ...)\n"


@FUZZ
@given(base=st.sampled_from(sorted(BASES)), where=st.floats(0, 1), bad=st.binary(min_size=1, max_size=4),
       command=st.sampled_from(COMMANDS))
def test_invalid_utf8_is_one_line_naming_the_byte(sandbox, base, where, bad, command):
    good = dump(BASES[base]).encode()
    at = int(where * len(good))
    content = good[:at] + bad + good[at:]
    try:
        content.decode("utf-8")
        return  # these bytes happen to be UTF-8 (hypothesis also draws plenty that are not)
    except UnicodeDecodeError as exc:
        expected = f"{sandbox.recipe}: not UTF-8 text ({exc.reason} at byte {exc.start})\n"
    assert run_bad(sandbox, content, command) == expected


@pytest.mark.parametrize("value, problem", [
    ("9" * 4301, "Exceeds the limit (4300 digits) for integer string conversion: value has 4301 digits; "
                 "use sys.set_int_max_str_digits() to increase the limit"),
    ("2001-13-45", "month must be in 1..12"),
], ids=["4301 digits", "month 13"])
def test_a_scalar_yaml_cannot_construct_is_one_line(sandbox, value, problem):
    assert run_bad(sandbox, minimal(f"limits: {{max_batch_size: {value}}}").replace("{config}", "config.json"),
                   ("plan",)) == f"{sandbox.recipe}:7:26: limits.max_batch_size: cannot read this value: {problem}\n"


@pytest.mark.parametrize("text, path, problem", [
    (minimal("backends: *g", gpus="&g [sm90]"), ("backends", 0), "'sm90' is not one of engine, hf-checkpoint, gguf"),
    (minimal("x-limits: &l {max_batch_size: 8}\nlimits: {<<: *l, max_input_len: 64}"), ("x-limits",),
     "unknown key 'x-limits' (did you mean 'limits'? allowed: schema, name, source, dtype, variants, calibration, parallelism, limits, serving, "
     "gpus, backends, toolchain, engine, exclude, validate, publish, bench)"),
    (minimal("limits: &l {max_batch_size: 8, <<: *l}"), ("limits", "max_batch_size"),
     "duplicate key 'max_batch_size' (first at line 7)"),
    ("schema: 1\n---\nschema: 1\n", None,
     "YAML syntax error: expected a single document in the stream, but found another document"),
], ids=["alias in the wrong place", "merge key", "merge of itself", "two documents"])
def test_anchors_aliases_and_documents(sandbox, text, path, problem):
    line = run_bad(sandbox, text.replace("{config}", "config.json"), ("plan",))
    assert line.endswith(f": {problem}\n") and line.startswith(f"{sandbox.recipe}:"), line
    if path:
        assert names_path(line, sandbox, path), line


@pytest.mark.parametrize("content", [laughs(9).encode(), b"schema: 1\nname: \xff\n", b"- 1\n", b"a: " + b"[" * 5000])
def test_the_console_script_refuses_in_one_line(sandbox, content):
    """The real process: no traceback on stderr, exit 2, nothing written."""
    sandbox.recipe.write_bytes(content)
    before = sandbox.listing()
    for command in COMMANDS:
        result = subprocess.run([sys.executable, "-m", "trtbuild", command[0], str(sandbox.recipe), *command[1:]],
                                capture_output=True, text=True, env={**os.environ, **sandbox.env()}, timeout=60)
        assert (result.returncode, result.stdout, result.stderr.count("\n")) == (2, "", 1), result.stderr
        assert result.stderr.startswith(f"{sandbox.recipe}:") and "Traceback" not in result.stderr
    assert sandbox.listing() == before and not sandbox.store.exists()


def test_a_key_with_a_line_break_is_named_on_one_line(sandbox):
    line = run_bad(sandbox, minimal('"a\\nb": 1').replace("{config}", "config.json"), ("plan",))
    assert line.startswith(f"{sandbox.recipe}:7:1: 'a\\nb': unknown key 'a\\nb' (allowed: schema, "), line


@pytest.mark.parametrize("value, shown", [("true", "True"), ("1.0", "1.0")])
def test_schema_is_the_integer_one_not_something_equal_to_it(sandbox, value, shown):
    text = minimal().replace("schema: 1", f"schema: {value}").replace("{config}", "config.json")
    assert run_bad(sandbox, text, ("plan",)) == f"{sandbox.recipe}:1:9: schema: expected the integer 1, got {shown}\n"
