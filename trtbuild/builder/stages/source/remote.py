"""Remote source files, hashed once and downloaded once: S3 objects are identified by their
full-object SHA-256 checksum when the bucket keeps one, else hashed on first download (the
download stays in the store's downloads/ cache, the hash in the stat cache by ETag)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from trtbuild.store import s3_client as s3lib
from trtbuild.errors import InvalidInput
from trtbuild.store.state import StatCache
from trtbuild.store.tree import BadTree, check_relative


def local_path(downloads: Path, bucket: str, key: str) -> Path:
    try:
        check_relative(key, f"s3://{bucket}")
    except BadTree:
        raise InvalidInput(f"s3://{bucket}/{key}: unsafe object key (absolute, '..' or not normalized)") from None
    return downloads / "s3" / bucket / key


def object_sha256(s3, state: StatCache, downloads: Path, bucket: str, obj: s3lib.S3Object) -> str:
    url = f"s3://{bucket}/{obj.key}"
    known = state.remote_sha256(url, obj.etag, obj.size)
    if known:
        return known
    try:
        _, checksum = s3lib.head(s3, bucket, obj.key)
        if checksum is None:  # no checksum kept: hash it while it lands in the downloads cache
            path = local_path(downloads, bucket, obj.key)
            s3lib.download(s3, bucket, obj.key, path)
            checksum = state.sha256(path)
    except InvalidInput:
        raise
    except Exception as exc:
        raise s3lib.error(url, exc) from None
    state.put_remote(url, obj.etag, obj.size, checksum)
    return checksum


def fetch(s3, state: StatCache, downloads: Path, bucket: str, key: str, sha256: str) -> Path:
    """A verified local copy of the object, downloading only when the cache does not hold it."""
    path = local_path(downloads, bucket, key)
    if path.is_file() and state.sha256(path) == sha256:
        return path
    url = f"s3://{bucket}/{key}"
    try:
        s3lib.download(s3, bucket, key, path)
    except Exception as exc:
        raise s3lib.error(url, exc) from None
    actual = state.sha256(path)
    if actual != sha256:
        path.unlink(missing_ok=True)
        raise InvalidInput(f"{url}: downloaded bytes hash to {actual}, not {sha256} (the object changed since it "
                           "was resolved, or the transfer was corrupted)")
    return path


def fetch_all(state: StatCache, downloads: Path, bucket: str, objects: dict, workers: int = 4) -> None:
    """Every object of `objects` (name -> stages.base.ObjectToFetch) into `downloads`, verified."""
    try:
        s3 = s3lib.client()
    except Exception as exc:  # a missing profile, a malformed endpoint: one line, not a traceback
        raise s3lib.error(f"s3://{bucket}", exc) from None
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lambda o: fetch(s3, state, downloads, bucket, o.key, o.sha256), objects.values()))


def listing(url: str, folder: bool) -> tuple[object, str, str, list[s3lib.S3Object]]:
    """(client, bucket, prefix without a trailing slash, objects). A folder lists `prefix/`; an
    object lists its own key."""
    bucket, prefix = s3lib.parse_url(url.rstrip("/"))
    try:
        s3 = s3lib.client()
        objects = s3lib.list_objects(s3, bucket, prefix + "/" if folder else prefix)
    except Exception as exc:
        raise s3lib.error(url, exc) from None
    return s3, bucket, prefix, objects


def state_for(runtime, fallback: Optional[StatCache]) -> StatCache:
    """Stages in a worker process open the store's stat cache by path (runtime: stages.base.StageRuntime)."""
    return fallback if fallback is not None else StatCache(Path(runtime.state_db))
