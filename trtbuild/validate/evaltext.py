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


def _stdlib_files():
    """(path relative to the standard library, stat) of every source file the text may come from."""
    import os
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in NOT_THE_TEXTS_SOURCES)
        rel = os.path.relpath(folder, root)  # once per folder: relpath per file was half the time
        for name in sorted(names):
            if name.endswith(".py"):
                yield name if rel == os.curdir else os.path.join(rel, name), os.stat(os.path.join(folder, name))


def builtin_fingerprint() -> str:
    """What the builtin text is made of, without importing it: the Python build and every standard
    library source file's path, inode, size, mtime and ctime (a rewrite whose mtime was put back
    still moves the ctime, as in the stat cache). Stat-ing them takes milliseconds; importing ~70
    modules and reading their docstrings takes 0.1 s of every build."""
    import sys
    import sysconfig

    files = [f"{rel} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}" for rel, st in _stdlib_files()]
    root = str(Path(sysconfig.get_paths()["stdlib"]))
    identity = "\n".join([sys.version, sys.implementation.cache_tag, root, " ".join(MODULES), *files])
    return hashlib.sha256(identity.encode()).hexdigest()


def _process_started_ns() -> "int | None":
    """When this process started (time.time_ns's clock; no later, it may be earlier), from Linux's
    /proc, or None where that cannot be read."""
    import os

    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))  # whole seconds
        # btime is truncated to the second, and the wall clock may have been stepped since boot: one
        # second less covers both.
        return (boot - 1) * 1_000_000_000 + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _stdlib_settled() -> bool:
    """Whether the text this process reads can be kept under the fingerprint: every standard library
    file last changed a timestamp tick before this process started (trtbuild.store.state.settled).
    The text comes from modules this process imported, some before the fingerprint was taken; a
    file changed since the start may differ from the module in memory, and one changed within a
    tick of it may change again without its stat moving."""
    from trtbuild.store.state import settled

    started = _process_started_ns()
    return started is not None and all(settled(st, started) for _, st in _stdlib_files())


BUILTIN_CACHE_NAME = "trtbuild:validate.text=builtin"  # its row in the store's stat cache


def eval_text_digest(spec: str, base_dir: Path, state=None) -> str:
    """The sha256 of the evaluation text. For `builtin`, the store's stat cache (`state`) keeps it
    under the standard library's fingerprint, like a file's digest under its stat, once every file
    of it is settled (_stdlib_settled); the fingerprint is taken again on every call."""
    from trtbuild.checkpoint.calibration import BUILTIN

    if spec == BUILTIN and state is not None:
        fingerprint = builtin_fingerprint()
        known = state.remote_sha256(BUILTIN_CACHE_NAME, fingerprint, 0)
        if known is not None:
            return known
        digest = hashlib.sha256(builtin_text().encode("utf-8")).hexdigest()
        if _stdlib_settled():
            state.put_remote(BUILTIN_CACHE_NAME, fingerprint, 0, digest)
        return digest
    return hashlib.sha256(read_eval_text(spec, base_dir).encode("utf-8")).hexdigest()
