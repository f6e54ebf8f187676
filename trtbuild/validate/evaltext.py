"""The evaluation text: `builtin` is the documentation of Python's standard library modules (their
docstrings, read with inspect), real English prose that ships with Python and shares no text with
the calibration default (`pydoc_data.topics`, the language reference). For a check across domains
point `validate.text` at text of your own."""

from __future__ import annotations

import hashlib
import importlib
import inspect
from pathlib import Path

from trtbuild.checkpoint.calibration import read_text

# A fixed list, so the text depends only on the Python version's docstrings.
MODULES = (
    "argparse", "asyncio", "base64", "bisect", "calendar", "collections", "concurrent.futures", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email.message", "enum",
    "fileinput", "fractions", "ftplib", "functools", "getopt", "gettext", "glob", "heapq", "hmac", "http.client",
    "imaplib", "ipaddress", "itertools", "json", "locale", "logging", "mailbox", "mimetypes", "numbers",
    "optparse", "pathlib", "pickle", "pprint", "queue", "random", "sched", "secrets", "shelve", "shlex",
    "shutil", "smtplib", "socketserver", "statistics", "string", "subprocess", "tarfile", "tempfile",
    "textwrap", "threading", "timeit", "trace", "typing", "unittest", "urllib.parse", "urllib.request",
    "uuid", "warnings", "weakref", "zipfile",
)


def builtin_text() -> str:
    parts = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # a stripped-down Python: the text is what this one has
            continue
        doc = inspect.getdoc(module)
        if doc:
            parts.append(doc)
        for attr in sorted(vars(module)):
            obj = getattr(module, attr)
            if attr.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isclass(obj) or inspect.isfunction(obj):
                doc = inspect.getdoc(obj)
                if doc and len(doc) > 200:  # prose, not one-line summaries
                    parts.append(doc)
    return "\n\n".join(parts)


def read_eval_text(spec: str, base_dir: Path) -> str:
    return read_text(spec, base_dir, field="validate.text", builtin=builtin_text)


def eval_text_digest(spec: str, base_dir: Path) -> str:
    return hashlib.sha256(read_eval_text(spec, base_dir).encode("utf-8")).hexdigest()
