"""`path:` sources: a local Hugging Face folder, keyed by the tree digest of the files a model needs
(through the stat cache, so an unchanged multi-GB folder is read once)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from trtbuild.errors import InvalidInput
from trtbuild.builder.stages.base import StageContext
from trtbuild.model.files import select_model_files
from trtbuild.builder.stages.source.common import Resolved, SourceContext
from trtbuild.store.tree import build_manifest


def model_file_filter(folder: Path) -> Callable[[str], bool]:
    """Config, tokenizer and weights of a model folder (see common.select_model_files)."""
    chosen = select_model_files(p.name for p in folder.iterdir() if p.is_file())
    return chosen.__contains__


def resolve(ctx: SourceContext) -> Resolved:
    folder = Path(ctx.runtime.folder)
    if not folder.is_dir():
        raise InvalidInput(f"source.path: {folder}: no such folder")
    if not (folder / "config.json").is_file():
        raise InvalidInput(f"source.path: {folder} has no config.json (is it a Hugging Face model folder?)")
    manifest, _ = build_manifest(folder, ctx.state, include=model_file_filter(folder), progress=ctx.progress)
    files = {e.path: e.sha256 for e in manifest.entries}
    return Resolved("tree", manifest.digest, {"files": files}, origin=f"hashed {folder}")


# ---- stage entry points --------------------------------------------------------------------------

def adopt_folder(ctx: StageContext) -> None:
    """`path:` sources: the selected files of the folder are the artifact, ingested in place."""
    folder = Path(ctx.runtime.folder)
    ctx.adopt(folder, model_file_filter(folder))


