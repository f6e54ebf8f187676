"""pydantic's validation errors of a YAML document as `file:line:col: yaml.path: message` lines:
the position of each path in the file (yamlsource), a message in the YAML's words, and for an
unknown key the keys allowed there (with the closest one)."""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel, ValidationError

from trtbuild.recipe.yamlsource import LocatedDocument, format_path


def format_errors(exc: ValidationError, doc: LocatedDocument, root: type[BaseModel]) -> list[str]:
    """One line per error of validating `doc` as `root`, in the file's order."""
    lines: list[tuple[tuple[int, int], str]] = []
    for err in exc.errors(include_url=False):
        loc = _yaml_loc(err["loc"])
        kind = err["type"]
        if kind == "extra_forbidden":
            at, message = doc.position(loc, key=True), _unknown_key(loc, root)
        elif kind == "missing":
            at, message = doc.position(loc[:-1]), "required key is missing"
        else:
            at, message = doc.position(loc), _message(err)
        lines.append((at, f"{doc.filename}:{at[0]}:{at[1]}: {format_path(loc)}: {message}"))
    return [line for _, line in sorted(lines, key=lambda item: item[0])]


def _yaml_loc(loc: tuple) -> tuple:
    # pydantic adds "[key]" markers for dict keys and function-validator names; drop them.
    return tuple(p for p in loc if not (isinstance(p, str) and (p.startswith("function-") or p == "[key]")))


def _message(err: dict) -> str:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind == "literal_error":
        expected = ctx.get("expected", "")
        choices = [c.strip().strip("'") for c in re.split(r",| or ", expected) if c.strip()]
        return f"{value!r} is not one of {', '.join(choices)}"
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", err["msg"]))
    if kind == "string_pattern_mismatch":
        return f"{value!r} does not match {ctx.get('pattern')}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"expected a mapping, got {yaml_type(value)}"
    if kind == "list_type":
        return f"expected a list, got {yaml_type(value)}"
    if kind == "string_type" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"expected a string, got the number {value!r} (quote it: '{value}')"
    msg = err["msg"]
    return f"{msg[0].lower()}{msg[1:]} (got {yaml_type(value)})"


def yaml_type(value: Any) -> str:
    """How a YAML value reads in a message: null, a list, a mapping, or its repr."""
    if value is None:
        return "null"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"{value!r}"


def model_at(loc: tuple, root: type[BaseModel]) -> type[BaseModel] | None:
    """The pydantic model under `root` that owns the last key of `loc` (to list its allowed keys)."""
    current: Any = root
    for part in loc[:-1]:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            fields = {(f.alias or n): f for n, f in current.model_fields.items()}
            if part not in fields:
                return None
            current = fields[part].annotation
        elif typing.get_origin(current) in (list, dict):
            current = typing.get_args(current)[-1]
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    """Annotated[X, ...] and Optional[X] -> X."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
            continue
        if origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) == 1:
                tp = args[0]
                continue
        return tp


def _unknown_key(loc: tuple, root: type[BaseModel]) -> str:
    key = loc[-1]
    model = model_at(loc, root)
    if model is None:
        return f"unknown key {key!r}"
    allowed = [f.alias or n for n, f in model.model_fields.items()]
    close = difflib.get_close_matches(str(key), allowed, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key {key!r} ({hint}allowed: {', '.join(allowed)})"
