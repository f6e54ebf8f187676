"""The generated reference pages: docs/cli.md (from the click commands, `python -m trtbuild.cli.docs`)
and docs/recipe.md (from the recipe schema, `python -m trtbuild.recipe.doc`) are exactly what their
generators print, and the generators leave out no command, option or recipe key."""

from __future__ import annotations

import re

import click

from conftest import ROOT

CLI_PAGE = ROOT / "docs" / "cli.md"
RECIPE_PAGE = ROOT / "docs" / "recipe.md"


def _commands(group: click.Group, prefix: str = "trtbuild"):
    yield prefix, group
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix} {name}")
        else:
            yield f"{prefix} {name}", command


def _sections(text: str) -> dict[str, str]:
    """`## HEADING` -> the text up to the next heading."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_cli_page_is_the_generators_output():
    """Regenerate with `python -m trtbuild.cli.docs > docs/cli.md` after changing a command's help."""
    from trtbuild.cli.docs import render

    assert CLI_PAGE.read_text() == render()


def test_cli_page_does_not_depend_on_the_terminal(monkeypatch):
    from trtbuild.cli.docs import render

    monkeypatch.setenv("COLUMNS", "40")  # click's formatter reads the terminal's width when not told one
    assert render() == CLI_PAGE.read_text()


def test_cli_page_has_every_command_with_every_option():
    from trtbuild.cli import cli

    sections = _sections(CLI_PAGE.read_text())
    for path, command in _commands(cli):
        assert path in sections, f"docs/cli.md has no section for {path}"
        assert f"Usage: {path} " in sections[path]
        for param in command.params:
            for flag in param.opts if isinstance(param, click.Option) else ():
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", sections[path]), f"{path}: {flag}"


def test_recipe_page_is_the_generators_output():
    """Regenerate with `python -m trtbuild.recipe.doc > docs/recipe.md` after changing the schema."""
    from trtbuild.recipe.doc import render

    assert RECIPE_PAGE.read_text() == render()


def test_recipe_page_describes_every_key_of_every_object():
    from trtbuild.recipe.schema import json_schema

    schema = json_schema()
    objects = [schema, *schema["$defs"].values()]
    rows = set(re.findall(r"^\| `([\w]+)` \|", RECIPE_PAGE.read_text(), flags=re.M))
    described = {key: prop.get("description") for obj in objects for key, prop in obj["properties"].items()}
    assert set(described) <= rows
    for key, description in described.items():
        assert description, f"{key} has no description in the schema"
    tables = RECIPE_PAGE.read_text().count("| key | type | default | meaning |")
    assert tables == len(objects)  # one table per object of the schema, none left out


def test_recipe_page_defaults_are_what_a_minimal_recipe_validates_to():
    """The defaults the page states for the collection-valued keys are the ones a recipe gets."""
    import yaml

    from trtbuild.recipe.schema import Recipe

    recipe = Recipe.model_validate({"schema": 1, "name": "r", "source": {"path": "."}})
    top = _sections(RECIPE_PAGE.read_text())["Top level"]
    stated = {m[0]: yaml.safe_load(m[1]) for m in re.findall(r"^\| `(\w+)` \| [^\n]*? \| `([^`]*)` \| ", top, flags=re.M)}
    assert stated["variants"] == {name: v.model_dump(exclude_none=True) for name, v in recipe.variants.items()}
    assert stated["parallelism"] == [p.model_dump() for p in recipe.parallelism]
    assert stated["backends"] == list(recipe.backends)
    assert stated["gpus"] == list(recipe.gpus) and stated["exclude"] == list(recipe.exclude)


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lowercase, punctuation but - and _ dropped, spaces -> -."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_link_of_the_readme_and_the_docs_resolves():
    """A page the README or a docs page links to exists, and so does the heading an anchor names."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", page.read_text(), flags=re.S))  # code is no link
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and anchor not in _anchors(linked.read_text()):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []
