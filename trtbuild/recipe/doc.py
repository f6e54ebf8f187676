"""docs/recipe.md, generated from the recipe schema (trtbuild/recipe/schema.py's pydantic models, as
`trtbuild schema` prints them): `python -m trtbuild.recipe.doc > docs/recipe.md`.

One table per object of the recipe, in the order a recipe nests them: each key's type, its default
and its description, all read from the schema. tests/test_docs_generated.py keeps the committed
page equal to this output, so the page never says what the schema does not.
"""

from __future__ import annotations

import json
import re
import sys

import yaml

INTRO = """\
A recipe is a YAML file read with `yaml.safe_load` semantics and validated strictly against this
schema: unknown keys, duplicate keys and wrong types are errors, each one line naming the file,
line, column and YAML path. Relative paths are relative to the recipe file. `trtbuild schema`
prints the JSON Schema itself, for editors (`# yaml-language-server: $schema=...`) and linters.

A recipe expands into targets. Backend `engine`: per variant and parallelism a TensorRT-LLM
checkpoint `{variant}-tp{tp}[-pp{pp}]` and, per SM of `gpus`, the engine built from it,
`{variant}-tp{tp}[-pp{pp}]-{sm}` (e.g. `fp8-tp2-sm90`). Backend `hf-checkpoint`: per variant a
Hugging Face checkpoint `{variant}-hf`. `trtbuild plan RECIPE` lists them; `recipes/` holds real
recipes to start from.
"""


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation other than - and _ dropped, spaces -> -."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[1]


class _Doc:
    def __init__(self, schema: dict):
        self.defs = schema["$defs"]
        self.paths: dict[str, str] = {}  # $defs name -> the YAML path of its first use
        self.order: list[str] = []
        self._find(schema, "")

    def _find(self, node: dict, path: str) -> None:
        """Give each $defs object the YAML path where a recipe first holds it (depth first)."""
        for key, prop in node.get("properties", {}).items():
            self._visit(prop, f"{path}.{key}" if path else key)

    def _visit(self, prop: dict, path: str) -> None:
        if "$ref" in prop:
            name = _ref_name(prop["$ref"])
            if name not in self.paths:
                self.paths[name] = path
                self.order.append(name)
                self._find(self.defs[name], path)
        for alternative in prop.get("anyOf", []):
            self._visit(alternative, path)
        if "items" in prop:
            self._visit(prop["items"], f"{path}[]")
        for value in prop.get("patternProperties", {}).values():
            self._visit(value, f"{path}.<name>")

    def link(self, name: str) -> str:
        heading = f"`{self.paths[name]}`"
        return f"[{heading}](#{_anchor(heading)})"

    def type_of(self, prop: dict) -> str:
        if "$ref" in prop:
            return self.link(_ref_name(prop["$ref"]))
        if "anyOf" in prop:
            kinds = [self.type_of(p) for p in prop["anyOf"] if p.get("type") != "null"]
            return " or ".join(kinds)
        if "const" in prop:
            return f"`{json.dumps(prop['const'])}`"
        if "enum" in prop:
            return " \\| ".join(f"`{v}`" for v in prop["enum"])
        kind = prop.get("type")
        if kind == "array":
            text = f"list of {self.type_of(prop['items'])}"
            return text + (f" (at least {prop['minItems']})" if "minItems" in prop else "")
        if kind == "object":
            if "patternProperties" in prop:
                [(pattern, value)] = prop["patternProperties"].items()
                text = f"name (`{pattern}`) -> {self.type_of(value)}"
                return text + (f" (at least {prop['minProperties']})" if "minProperties" in prop else "")
            return "mapping"
        bounds = []
        if "exclusiveMinimum" in prop:
            bounds.append(f"> {prop['exclusiveMinimum']}")
        if "minimum" in prop:
            bounds.append(f">= {prop['minimum']}")
        if "maximum" in prop and prop["maximum"] < 2**31 - 1:  # the int32 / int64 caps are not worth a word
            bounds.append(f"<= {prop['maximum']}")
        text = {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean"}[kind]
        if "pattern" in prop:
            text += f" matching `{prop['pattern']}`"
        return text + (f" ({', '.join(bounds)})" if bounds else "")

    @staticmethod
    def default_of(model, key: str) -> str:
        """The default as the pydantic model has it (a default_factory's value too), in YAML flow style."""
        from pydantic import BaseModel
        from pydantic_core import to_jsonable_python

        field = next(f for name, f in model.model_fields.items() if (f.alias or name) == key)
        if field.is_required():
            return "required"
        value = field.get_default(call_default_factory=True)
        if isinstance(value, BaseModel):
            return "its fields' defaults"
        if value is None:
            return "unset"
        value = to_jsonable_python(value, exclude_none=True)
        if isinstance(value, (dict, list)):
            return f"`{yaml.safe_dump(value, default_flow_style=True, sort_keys=False).strip()}`"
        return f"`{json.dumps(value).strip(chr(34))}`"  # a scalar as YAML writes it: false, 0.9, builtin

    def table(self, node: dict, model) -> list[str]:
        rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
        for key, prop in node["properties"].items():
            description = prop.get("description", "").replace("|", "\\|").replace("\n", " ")
            rows.append(f"| `{key}` | {self.type_of(prop)} | {self.default_of(model, key)} | {description} |")
        return rows


def render() -> str:
    from trtbuild.recipe import schema as recipe

    schema = recipe.json_schema()
    doc = _Doc(schema)
    lines = ["# Recipe reference", "",
             "Generated from the recipe schema (`trtbuild/recipe/schema.py`) by `python -m trtbuild.recipe.doc`; do not",
             "edit by hand.", "", INTRO, "## Top level", "", schema["description"], "", *doc.table(schema, recipe.Recipe), ""]
    for name in doc.order:
        definition = doc.defs[name]
        lines += [f"## `{doc.paths[name]}`", ""]
        if definition.get("description"):
            lines += [definition["description"], ""]
        lines += [*doc.table(definition, getattr(recipe, name)), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
