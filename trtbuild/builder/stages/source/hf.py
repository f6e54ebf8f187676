"""`hf:` sources: a Hugging Face Hub repository at a revision, keyed without downloading anything.

The revision is resolved to a commit and the repository's files are listed with the hashes the
hub already knows (LFS sha256 for weights, git blob ids for small files); the digest is computed
from (repo, commit, selected files and their hashes) alone. Only a stage that must run downloads,
through huggingface_hub into the user's cache (HF_HOME), and every file is verified against those
hashes. Offline (HF_HUB_OFFLINE=1), the lock file or the Hugging Face cache supplies the listing.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Optional

from trtbuild.errors import InvalidInput
from trtbuild.model.hub import hub_error, offline, quiet
from trtbuild.keys import canonical_json
from trtbuild.model.config import read_json_object
from trtbuild.builder.stages.base import StageContext
from trtbuild.model.files import select_model_files
from trtbuild.builder.stages.source.common import Resolved, SourceContext

SHA256, GIT = "sha256:", "git-sha1:"


def _listing_from_hub(repo: str, revision: str, where: Optional[str]) -> tuple[str, dict[str, str], dict[str, int]]:
    from huggingface_hub import HfApi

    try:
        with quiet():
            info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    except Exception as exc:  # every hub error becomes one line naming the repository
        raise hub_error(repo, revision, exc, where) from None
    hashes, sizes = {}, {}
    for sibling in info.siblings or []:
        if sibling.lfs is not None:
            hashes[sibling.rfilename] = SHA256 + sibling.lfs.sha256
        elif sibling.blob_id:
            hashes[sibling.rfilename] = GIT + sibling.blob_id
        if sibling.size is not None:
            sizes[sibling.rfilename] = sibling.size
    return info.sha, hashes, sizes


def _listing_from_cache(repo: str, revision: str) -> Optional[tuple[str, dict[str, str], dict[str, int]]]:
    """The HF cache names each blob by its etag: the sha256 for LFS files, the git blob id otherwise."""
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    ref = folder / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = folder / "snapshots" / commit
    if not snapshot.is_dir():
        return None
    hashes, sizes = {}, {}
    for path in snapshot.iterdir():
        if path.is_symlink():
            blob = os.path.basename(os.readlink(path))
            hashes[path.name] = (SHA256 if len(blob) == 64 else GIT) + blob
            sizes[path.name] = path.stat().st_size
    return commit, hashes, sizes


def resolve(ctx: SourceContext) -> Resolved:
    repo = ctx.runtime.location
    revision = ctx.runtime.revision or "main"
    locked = ctx.locked or {}
    lock_matches = locked.get("kind") == "hf" and locked.get("location") == repo and locked.get("revision") == revision
    pinned = re.fullmatch(r"[0-9a-f]{40}", revision) is not None  # a commit never moves: no need to ask
    if lock_matches and (pinned or offline()):
        commit, hashes, sizes = locked["commit"], dict(locked["files"]), dict(locked.get("sizes") or {})
        origin = "the lock file (a pinned commit)" if pinned else "the lock file (offline)"
    elif not offline():
        commit, hashes, sizes = _listing_from_hub(repo, revision, ctx.runtime.where)
        origin = f"hub metadata of {repo}@{revision}"
    else:
        origin = "the Hugging Face cache (offline)"
        cached = _listing_from_cache(repo, revision)
        if cached is None:
            raise InvalidInput(f"source.hf: {repo}@{revision}: HF_HUB_OFFLINE is set and neither the lock file "
                               "nor the Hugging Face cache knows this revision")
        commit, hashes, sizes = cached
    selected = select_model_files(hashes)
    if "config.json" not in selected:
        raise InvalidInput(f"source.hf: {repo}@{commit[:12]} has no config.json (not a Transformers model repository)")
    files = {name: hashes[name] for name in sorted(selected)}
    digest = hashlib.sha256(canonical_json({"repo": repo, "commit": commit, "files": files})).hexdigest()
    lock = {"revision": revision, "commit": commit, "files": files,
            "sizes": {name: sizes[name] for name in files if name in sizes}}
    return Resolved("hub", digest, lock, runtime={"repo": repo, "commit": commit, "files": files}, origin=origin)


# ---- the stage -----------------------------------------------------------------------------------

def git_blob_id(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def download(ctx: StageContext) -> None:
    """Download exactly the selected files at the resolved commit into the HF cache (reusing what is
    there), verify each against the hub's hash, and adopt them as the artifact."""
    from huggingface_hub import snapshot_download

    repo, commit, files = ctx.runtime.repo, ctx.runtime.commit, ctx.runtime.files
    try:
        with quiet():
            snapshot = Path(snapshot_download(repo, revision=commit, allow_patterns=list(files)))
    except Exception as exc:
        raise hub_error(repo, commit, exc, ctx.runtime.where) from None
    for name, expected in files.items():
        path = snapshot / name
        if not path.is_file():
            raise InvalidInput(f"source.hf: {repo}@{commit[:12]}: {name} is missing from the download")
        # hashed at the blob the snapshot links to: the path the store's ingest hashes again, so its
        # stat cache answers there instead of reading the file a second time
        actual = (SHA256 + ctx.state.sha256(path.resolve()) if expected.startswith(SHA256)
                  else GIT + git_blob_id(path))
        if actual != expected:
            raise InvalidInput(f"source.hf: {repo}@{commit[:12]}: {name} does not match the hub's hash "
                               f"(expected {expected}, got {actual})")
    config = read_json_object(snapshot / "config.json")
    if config.get("auto_map") and not ctx.runtime.trust_remote_code:
        raise InvalidInput(f"source.hf: {repo} runs custom code (config.json has auto_map); set "
                           "source.trust_remote_code: true only if you trust it")
    # snapshot files are links into the repository's blobs/: allow links that stay in that folder
    ctx.adopt(snapshot, files.__contains__, links_within=snapshot.parent.parent, link=True)

