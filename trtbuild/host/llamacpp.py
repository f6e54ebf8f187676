"""llama.cpp on this host: the llama-cpp-python package (its library: the quantizer, the evaluator,
the OpenAI-compatible server) and the converter of the same llama.cpp.

llama-cpp-python's wheel holds only the library and its Python bindings; llama.cpp's converter
(convert_hf_to_gguf.py with its `conversion` package and the gguf-py it imports) is in the same
package's sdist, under vendor/llama.cpp. So the converter is the one of the llama.cpp this host's
library was built from: the sdist of the installed version, fetched once with pip (from the
index pip is configured for) into trtbuild's tool cache, or a llama.cpp source tree named by
TRTBUILD_LLAMACPP_SOURCE (then keyed by its files' digest)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Optional

from filelock import FileLock

from trtbuild.errors import TrtbuildError

DISTRIBUTION = "llama-cpp-python"
SOURCE_ENV = "TRTBUILD_LLAMACPP_SOURCE"  # a llama.cpp source tree whose converter to run instead
CACHE_ENV = "TRTBUILD_TOOL_CACHE"  # where fetched tools go (default: ~/.cache/trtbuild/tools)
CONVERTER = "convert_hf_to_gguf.py"
# What the converter needs of the tree: its script, the `conversion` package it imports, the gguf-py
# it puts first on sys.path, and the licence that travels with them.
CONVERTER_PARTS = (CONVERTER, "conversion", "gguf-py", "LICENSE")
VENDORED = "vendor/llama.cpp"


class ConverterUnavailable(TrtbuildError):
    """llama.cpp's converter could not be found or fetched."""


def version() -> Optional[str]:
    """The installed llama-cpp-python version (package metadata, no import), None when absent.
    Read here rather than through host.toolchain, which asks this module for the converter's part."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def tool_cache() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "trtbuild" / "tools")


def converter_fingerprint() -> Optional[str]:
    """What the key holds of the converter: the sdist of the installed llama-cpp-python (a release's
    files never change), or the sha256 of a TRTBUILD_LLAMACPP_SOURCE tree's converter files."""
    tree = os.environ.get(SOURCE_ENV)
    if tree:
        return f"{SOURCE_ENV} sha256:{tree_digest(Path(tree))}"
    installed = version()
    return f"{DISTRIBUTION} {installed} sdist" if installed else None


def tree_digest(tree: Path) -> str:
    """sha256 over the converter's files (paths and bytes, in path order)."""
    digest = hashlib.sha256()
    for part in CONVERTER_PARTS:
        root = tree / part
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        if not files or not files[0].exists():
            raise ConverterUnavailable(f"{tree}: not a llama.cpp source tree (no {part})")
        for path in files:
            digest.update(path.relative_to(tree).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def converter() -> Path:
    """The path of convert_hf_to_gguf.py to run (fetching it once if needed)."""
    tree = os.environ.get(SOURCE_ENV)
    if tree:
        script = Path(tree) / CONVERTER
        if not script.is_file():
            raise ConverterUnavailable(f"{SOURCE_ENV}={tree}: no {CONVERTER} there")
        return script
    installed = version()
    if installed is None:
        from trtbuild.facts.llamacpp import INSTALL

        raise ConverterUnavailable(f"needs {DISTRIBUTION}: install it with `{INSTALL}`")
    folder = tool_cache() / f"llama.cpp-{DISTRIBUTION}-{installed}"
    if not (folder / CONVERTER).is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder) + ".lock"):
            if not (folder / CONVERTER).is_file():
                _fetch(installed, folder)
    return folder / CONVERTER


def _fetch(installed: str, folder: Path) -> None:
    """The converter's files out of llama-cpp-python's sdist, into `folder` whole or not at all."""
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".fetch-") as scratch:
        # --no-binary for this one package only: `:all:` reaches the build requirements pip installs
        # to read the sdist's metadata, and without a wheel cache pip then compiled those (4.5 minutes)
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", DISTRIBUTION,
                   f"{DISTRIBUTION}=={installed}", "--dest", scratch]
        done = subprocess.run(command, capture_output=True, text=True)
        sdists = list(Path(scratch).glob("*.tar.gz"))
        if done.returncode or not sdists:
            last = (done.stderr.strip().splitlines() or ["no sdist downloaded"])[-1]
            raise ConverterUnavailable(f"llama.cpp's converter comes from the {DISTRIBUTION} {installed} sdist, which "
                                       f"pip could not download: {last} (or set {SOURCE_ENV} to a llama.cpp source tree)")
        staging = Path(scratch) / "tree"
        with tarfile.open(sdists[0]) as archive:
            root = archive.getnames()[0].split("/", 1)[0]
            prefix = f"{root}/{VENDORED}/"
            wanted = [m for m in archive.getmembers() if m.name.startswith(prefix)
                      and m.name[len(prefix):].split("/", 1)[0] in CONVERTER_PARTS and (m.isfile() or m.isdir())]
            for member in wanted:
                member.name = member.name[len(prefix):]
            archive.extractall(staging, members=wanted, filter="data")
        if not (staging / CONVERTER).is_file():
            raise ConverterUnavailable(f"{sdists[0].name}: no {VENDORED}/{CONVERTER} in it")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
