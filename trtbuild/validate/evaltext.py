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


# Installed packages, and standard-library packages none of MODULES imports or inherits from (the
# test suite alone is a third of the files).
NOT_THE_TEXTS_SOURCES = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "idlelib", "tkinter",
                                   "turtledemo", "lib2to3", "ensurepip", "venv", "pydoc_data"})


def builtin_fingerprint() -> str:
    """What the builtin text is made of, without importing it: the Python build and every standard
    library source file's (path, size, mtime). Stat-ing them takes milliseconds; importing ~70
    modules and reading their docstrings takes 0.1 s of every build."""
    import os
    import sys
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in NOT_THE_TEXTS_SOURCES)
        rel = os.path.relpath(folder, root)  # once per folder: relpath per file was half the time
        for name in sorted(names):
            if name.endswith(".py"):
                st = os.stat(os.path.join(folder, name))
                files.append(f"{name if rel == os.curdir else os.path.join(rel, name)} {st.st_size} {st.st_mtime_ns}")
    identity = "\n".join([sys.version, sys.implementation.cache_tag, str(root), " ".join(MODULES), *files])
    return hashlib.sha256(identity.encode()).hexdigest()


BUILTIN_CACHE_NAME = "trtbuild:validate.text=builtin"  # its row in the store's stat cache


def eval_text_digest(spec: str, base_dir: Path, state=None) -> str:
    """The sha256 of the evaluation text. For `builtin`, the store's stat cache (`state`) keeps it
    under the standard library's fingerprint, like a file's digest under its stat."""
    from trtbuild.checkpoint.calibration import BUILTIN

    if spec == BUILTIN and state is not None:
        fingerprint = builtin_fingerprint()
        known = state.remote_sha256(BUILTIN_CACHE_NAME, fingerprint, 0)
        if known is not None:
            return known
        digest = hashlib.sha256(builtin_text().encode("utf-8")).hexdigest()
        state.put_remote(BUILTIN_CACHE_NAME, fingerprint, 0, digest)
        return digest
    return hashlib.sha256(read_eval_text(spec, base_dir).encode("utf-8")).hexdigest()
