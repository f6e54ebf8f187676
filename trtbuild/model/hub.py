"""Hugging Face Hub access shared by planning and the hf source: offline mode, one-line errors, and
fetching a repository's config.json (the only file `plan` ever needs).

huggingface_hub retries a request that cannot connect (http_backoff: 5 retries over some 23 s) and
logs two warnings per retry, each the repr of urllib3's error: a hub that cannot be reached printed
a dozen such lines per file before its one error. Its logger is held at ERROR while trtbuild calls
it (quiet()); what went wrong is said once, by hub_error."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Iterator, Optional

from trtbuild.errors import InvalidInput, TrtbuildError, Unreachable


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_url(repo: str) -> str:
    from huggingface_hub import constants

    return f"{constants.ENDPOINT.rstrip('/')}/{repo}"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """huggingface_hub's own warnings (its retries) held back: the error that ends them is ours to say."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and everything behind it: causes, contexts, and urllib3's `reason`."""
    seen, todo = set(), [exc]
    while todo:
        item = todo.pop(0)
        if item is None or id(item) in seen or not isinstance(item, BaseException):
            continue
        seen.add(id(item))
        yield item
        todo += [item.__cause__, item.__context__, getattr(item, "reason", None),
                 *(a for a in item.args if isinstance(a, BaseException))]


def unreachable_reason(exc: BaseException) -> Optional[str]:
    """Why the hub could not be reached ("connection refused", "timed out", ...), or None when the
    error is not a failure to reach it. Read from the socket's own error behind the client's
    wrappers (requests or httpx, by huggingface_hub version), so no client class is named here."""
    from huggingface_hub import errors

    # hf_hub_download's error when it could not ask the hub and the cache lacks the file
    network = isinstance(exc, getattr(errors, "LocalEntryNotFoundError", ()))
    reason = None
    for item in _causes(exc):
        name = type(item).__name__
        if isinstance(item, (ConnectionError, TimeoutError)) or name in ("gaierror", "SSLError") \
                or "ConnectionError" in name or "ConnectError" in name or "Timeout" in name:
            network = True
        if reason is None and isinstance(item, OSError) and type(item).__module__ in ("builtins", "socket", "ssl") \
                and (item.strerror or isinstance(item, TimeoutError)):
            reason = " ".join((item.strerror or "timed out").split()).lower()
    if not network:
        return None
    return reason or "no connection"


def hub_error(repo: str, revision: str, exc: Exception, where: Optional[str] = None) -> TrtbuildError:
    """One line that names the repository and says what to do. `where`: the recipe's source (file,
    line and column), which a hub that cannot be reached names first: nothing is wrong with the
    recipe, but it is the recipe that asks for the hub."""
    from huggingface_hub import constants, errors

    reason = unreachable_reason(exc)
    if reason is not None:
        return Unreachable(f"{where + ': ' if where else ''}source.hf: {repo}@{revision}: cannot reach "
                           f"{constants.ENDPOINT.rstrip('/')} ({reason}); build where the hub is reachable, set "
                           "HF_ENDPOINT to a mirror, or set HF_HUB_OFFLINE=1 to build from the Hugging Face cache "
                           "and the lock file")
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
    return TrtbuildError(f"{where + ': ' if where else ''}source.hf: {repo}@{revision} ({hub_url(repo)}): "
                         f"{type(exc).__name__}: {message}")


def config_json(repo: str, revision: str, where: Optional[str] = None) -> Optional[Path]:
    """config.json from the user's Hugging Face cache, else (online) downloaded into it."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo, "config.json", revision=revision)
        if isinstance(found, str):
            return Path(found)
        if offline():
            return None
        with quiet():
            return Path(hf_hub_download(repo, "config.json", revision=revision))
    except Exception as exc:
        raise hub_error(repo, revision, exc, where) from None
