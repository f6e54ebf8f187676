"""Hugging Face Hub access shared by planning and the hf source: offline mode, one-line errors, and
fetching a repository's config.json (the only file `plan` ever needs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from trtbuild.errors import InvalidInput, TrtbuildError


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_url(repo: str) -> str:
    from huggingface_hub import constants

    return f"{constants.ENDPOINT.rstrip('/')}/{repo}"


def hub_error(repo: str, revision: str, exc: Exception) -> TrtbuildError:
    """One line that names the repository and says what to do."""
    from huggingface_hub import errors

    if isinstance(exc, errors.HFValidationError):
        return InvalidInput(f"source.hf: {repo!r} is not a valid repository id ({' '.join(str(exc).split())[:200]})")
    if isinstance(exc, errors.GatedRepoError):
        return InvalidInput(f"source.hf: {repo} is gated: request access at {hub_url(repo)} and set HF_TOKEN "
                            "to a token of an account that has it")
    if isinstance(exc, errors.RevisionNotFoundError):
        return InvalidInput(f"source.hf: {repo} has no revision {revision!r} (a branch, tag or commit)")
    if isinstance(exc, errors.RepositoryNotFoundError):
        token = "HF_TOKEN is set but has no access to it" if os.environ.get("HF_TOKEN") else "set HF_TOKEN if it is private"
        return InvalidInput(f"source.hf: {repo}: repository not found at {hub_url(repo)} ({token})")
    if isinstance(exc, errors.EntryNotFoundError):
        return InvalidInput(f"source.hf: {repo}@{revision}: {exc.__class__.__name__}: a listed file is missing on the hub")
    if isinstance(exc, errors.HfHubHTTPError) and exc.response is not None and exc.response.status_code in (401, 403):
        return InvalidInput(f"source.hf: {repo}: access denied ({exc.response.status_code}); set HF_TOKEN to a token with read access")
    message = " ".join(str(exc).split())[:300]
    return TrtbuildError(f"source.hf: cannot reach {hub_url(repo)} ({type(exc).__name__}: {message}); "
                         "set HF_HUB_OFFLINE=1 to build from the Hugging Face cache and the lock file")


def config_json(repo: str, revision: str) -> Optional[Path]:
    """config.json from the user's Hugging Face cache, else (online) downloaded into it."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo, "config.json", revision=revision)
        if isinstance(found, str):
            return Path(found)
        if offline():
            return None
        return Path(hf_hub_download(repo, "config.json", revision=revision))
    except Exception as exc:
        raise hub_error(repo, revision, exc) from None
