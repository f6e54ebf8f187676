"""YAML with source positions: yaml.safe_load semantics, duplicate keys rejected, every path located."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from trtbuild.errors import InvalidInput

YamlPath = tuple  # keys (str) and list indices (int) from the document root

# Aliases share nodes, so a small file can stand for an exponential tree (billion laughs): the
# builder counts what it builds and stops far above any real recipe. Nesting is bounded too, so no
# later walk over the data recurses past Python's stack.
MAX_VALUES = 10_000
MAX_DEPTH = 64


@dataclass
class LocatedDocument:
    """A parsed YAML document plus the 1-based (line, column) of every value and key in it."""

    filename: str
    data: Any
    values: dict[YamlPath, tuple[int, int]] = field(default_factory=dict)
    keys: dict[YamlPath, tuple[int, int]] = field(default_factory=dict)

    def position(self, path: YamlPath, *, key: bool = False) -> tuple[int, int]:
        """Position of `path`; for a path that does not exist, the nearest enclosing one."""
        table = self.keys if key else self.values
        path = tuple(path)
        while path:
            if path in table:
                return table[path]
            if path in self.values:
                return self.values[path]
            path = path[:-1]
        return self.values.get((), (1, 1))

    def where(self, path: YamlPath, *, key: bool = False) -> str:
        line, column = self.position(path, key=key)
        return f"{self.filename}:{line}:{column}"


def format_path(path: YamlPath) -> str:
    """`('variants', 'fp8', 'quant')` -> `variants.fp8.quant`; list indices as `gpus[1]`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:  # a key with a line break or other control character is quoted: the path stays one line
            name = part if isinstance(part, str) and part.isprintable() else repr(part) if isinstance(part, str) else str(part)
            text += ("." if text else "") + name
    return text or "(document)"


def _mark(node: Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


class _Builder:
    def __init__(self, loader: yaml.SafeLoader, doc: LocatedDocument) -> None:
        self.loader = loader
        self.doc = doc
        self.built = 0
        self.open: set[int] = set()  # ids of the collections being built (an alias to one is a cycle)

    def _refuse(self, node: Node, path: YamlPath, problem: str) -> InvalidInput:
        line, col = _mark(node)
        return InvalidInput(f"{self.doc.filename}:{line}:{col}: {format_path(path)}: {problem}")

    def build(self, node: Node, path: YamlPath) -> Any:
        self.built += 1
        if self.built > MAX_VALUES:
            raise self._refuse(node, path, f"the document expands to more than {MAX_VALUES} values "
                                           "(aliases that repeat aliases?)")
        if isinstance(node, (MappingNode, SequenceNode)):
            if id(node) in self.open:
                raise self._refuse(node, path, "an alias refers to the node that contains it")
            if len(path) >= MAX_DEPTH:
                raise self._refuse(node, path, f"nested deeper than {MAX_DEPTH} levels")
            self.open.add(id(node))
            try:
                return self._collection(node, path)
            finally:
                self.open.discard(id(node))
        self.doc.values[path] = _mark(node)
        return self._scalar(node, path)

    def _scalar(self, node: Node, path: YamlPath) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except ValueError as exc:  # an integer of over 4300 digits, a date with month 13, ...
            raise self._refuse(node, path, f"cannot read this value: {exc}") from None

    def _collection(self, node: Node, path: YamlPath) -> Any:
        self.doc.values[path] = _mark(node)
        if isinstance(node, MappingNode):
            self.loader.flatten_mapping(node)  # YAML merge keys (<<), as safe_load does
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, ScalarNode):
                    line, col = _mark(key_node)
                    raise InvalidInput(
                        f"{self.doc.filename}:{line}:{col}: {format_path(path)}: "
                        "mapping keys must be plain scalars"
                    )
                key = self._scalar(key_node, path)
                child = path + (key,)
                if key in out:
                    line, col = _mark(key_node)
                    raise InvalidInput(
                        f"{self.doc.filename}:{line}:{col}: {format_path(child)}: duplicate key "
                        f"{key!r} (first at line {self.doc.keys[child][0]})"
                    )
                self.doc.keys[child] = _mark(key_node)
                out[key] = self.build(value_node, child)
            return out
        return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]


def load_located(text: str, filename: str) -> LocatedDocument:
    """Parse one YAML document; syntax errors become `file:line:col: ...` InvalidInput errors."""
    doc = LocatedDocument(filename=filename, data=None)
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is not None:
            doc.data = _Builder(loader, doc).build(root, ())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        problem, context = exc.problem or "", exc.context or ""
        if problem and context:
            problem = f"{context}, {problem}" if problem.startswith("but") else f"{problem} ({context})"
        problem = problem or context or "invalid YAML"
        raise InvalidInput(f"{where}: YAML syntax error: {problem}") from None
    except RecursionError:  # PyYAML's composer recurses once per level, before the builder's limit
        raise InvalidInput(f"{filename}: nested deeper than {MAX_DEPTH} levels") from None
    except yaml.YAMLError as exc:  # e.g. a stream with several documents
        raise InvalidInput(f"{filename}: YAML error: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()
    return doc


def load_located_file(path: str | Path) -> LocatedDocument:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InvalidInput(f"{path}: is a directory, not a YAML file") from None
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read: {exc.strerror}") from None
    return load_located(text, str(path))
