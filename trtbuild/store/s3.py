"""The S3 backend of the transport (store/transport.py): `s3://bucket/prefix` holds the layout of
store/layout.py on any S3-compatible endpoint. The store's policy is store/base.py's, as for a folder.

Coordination between hosts is by conditional writes only: put_if_absent is If-None-Match: *, and
put_if_match is If-Match on the ETag read (a 412 is a lost race: the cache layer re-reads). Blobs go
up through boto3's transfer manager with SHA-256 checksums the server checks, and are verified while
they stream down (store/s3_blobs.py). An S3 store has no workspace (store/workspace.py).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
from pathlib import Path
from typing import Callable, Iterator, Optional

from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.store import ingest, layout
from trtbuild.store import s3_client as s3lib
from trtbuild.store.base import CorruptStore, Store
from trtbuild.store.hash import CHUNK, Progress, bytes_sha256, file_sha256, is_digest
from trtbuild.store.s3_blobs import RESUME_ATTEMPTS, S3BlobReads, _interrupted_errors
from trtbuild.store.s3_client import Absent as _Absent, code_of as _code, full_sha256 as _full_sha256
from trtbuild.store.s3_client import is_absent as _is_absent, is_conflict as _is_conflict
from trtbuild.store.state import StatCache
from trtbuild.store.transport import Found, Transport

MiB = 1 << 20


def _b64(digest: str) -> str:
    return base64.b64encode(bytes.fromhex(digest)).decode()


class S3Transport(S3BlobReads, Transport):
    """The objects and blobs under `s3://bucket/prefix`.

    Endpoint: `endpoint_url`, else AWS_ENDPOINT_URL; credentials: the standard chain; throttling and
    5xx are retried with backoff by botocore's `retry_mode` ("standard" or "adaptive"). Blobs go up
    through boto3's transfer manager (multipart above `part_size`, `concurrency` parts at once); a
    blob larger than `download_chunk` comes down as `concurrency` ranged GETs at once, hashed in
    order as the ranges arrive. The stat cache is in memory only.
    """

    def __init__(self, url: str, endpoint_url: Optional[str] = None, part_size: int = 64 * MiB,
                 concurrency: int = 8, retry_mode: str = "standard", max_attempts: int = 8,
                 download_chunk: int = 8 * MiB) -> None:
        if retry_mode not in ("standard", "adaptive"):
            raise InvalidInput(f"{url}: retry mode {retry_mode!r} is not one of standard, adaptive")
        bucket, prefix = s3lib.parse_url(url)
        if not bucket:
            raise InvalidInput(f"{url}: not an s3://BUCKET/PREFIX URL")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
        self.part_size, self.concurrency, self.download_chunk = part_size, concurrency, download_chunk
        self.retry_mode, self.max_attempts = retry_mode, max_attempts
        self._client = None
        self._bucket_checked = False
        self.state = StatCache(None)

    @property
    def requests_at_once(self) -> int:  # boto3 clients are thread-safe; the pool holds 2x concurrency
        return self.concurrency

    # ---- the connection --------------------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            try:
                self._client = s3lib.client(self.endpoint_url, self.retry_mode, self.max_attempts,
                                            pool=max(10, 2 * self.concurrency), checksums="when_required",
                                            sign_payload=False)
            except Exception as exc:
                raise s3lib.error(self.url, exc, self.endpoint_url) from None
        return self._client

    def _error(self, url: str, exc: Exception) -> TrtbuildError:
        return s3lib.error(url, exc, self.endpoint_url, self.client.meta.region_name)

    def _call(self, key: str, operation: Callable, **params):
        """One S3 request about `key`: a missing object raises _Absent, anything else one line
        naming s3://bucket/key. The bucket is checked once first: a HEAD on a key of a missing
        bucket would otherwise read as a missing key."""
        url = self.url_of(key)
        try:
            if not self._bucket_checked:
                self.client.head_bucket(Bucket=self.bucket)
                self._bucket_checked = True
            return operation(**params)
        except TrtbuildError:
            raise
        except Exception as exc:
            code, status = _code(exc)
            if not self._bucket_checked and (code in ("NoSuchBucket", "404", "NotFound") or status == 404):
                raise s3lib.missing_bucket(url, self.bucket) from None
            if self._bucket_checked and _is_absent(exc):
                raise _Absent(key) from None
            if _is_conflict(exc) and ("IfMatch" in params or "IfNoneMatch" in params):
                raise  # a conditional request that lost: the caller re-reads
            raise self._error(url, exc) from None

    # ---- keys --------------------------------------------------------------------------------------
    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def url_of(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def blob_key(self, digest: str) -> str:
        return self.key(layout.blob(digest))

    @property
    def location(self) -> str:
        return self.url

    def describe(self, rel: str) -> str:
        return self.url_of(self.key(rel))

    def verify_hint(self) -> str:
        """The store is not the default: the hint names it."""
        return f"run `trtbuild cache verify --store {self.url}`"

    # ---- small objects -----------------------------------------------------------------------------
    def get(self, rel: str) -> Optional[Found]:
        key = self.key(rel)
        for attempt in range(RESUME_ATTEMPTS):
            try:
                response = self._call(key, self.client.get_object, Bucket=self.bucket, Key=key)
            except _Absent:
                return None
            try:
                return Found(response["Body"].read(), response["ETag"])
            except _interrupted_errors() as exc:  # small objects are fetched again whole
                if attempt == RESUME_ATTEMPTS - 1:
                    raise self._error(self.url_of(key), exc) from None
        raise AssertionError("unreachable")

    def put(self, rel: str, data: bytes) -> None:
        self._put(self.key(rel), data)

    def put_if_absent(self, rel: str, data: bytes) -> bool:
        return self._put(self.key(rel), data, if_none_match=True)

    def put_if_match(self, rel: str, data: bytes, tag: str) -> bool:
        return self._put(self.key(rel), data, if_match=tag)

    def has(self, rel: str) -> bool:
        return self._head(self.key(rel)) is not None

    def delete(self, rel: str) -> None:
        with contextlib.suppress(_Absent):
            key = self.key(rel)
            self._call(key, self.client.delete_object, Bucket=self.bucket, Key=key)

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """Sorted here: servers differ in how they order a key's "." and "/" (SeaweedFS lists folders first)."""
        base = self.key("")
        pages = self._call(self.key(prefix), self.client.get_paginator("list_objects_v2").paginate,
                           Bucket=self.bucket, Prefix=self.key(prefix))
        try:
            found = [(item["Key"][len(base):], item["Size"]) for page in pages for item in page.get("Contents", [])]
        except Exception as exc:
            raise self._error(self.url_of(self.key(prefix)), exc) from None
        return iter(sorted(found))

    def _put(self, key: str, data: bytes, if_match: Optional[str] = None, if_none_match: bool = False) -> bool:
        """Write a small object with its SHA-256 checksum; False when the condition failed (412)."""
        params = {"Bucket": self.bucket, "Key": key, "Body": data, "ChecksumSHA256": _b64(bytes_sha256(data))}
        if if_match is not None:
            params["IfMatch"] = if_match
        elif if_none_match:
            params["IfNoneMatch"] = "*"
        try:
            self._call(key, self.client.put_object, **params)
            return True
        except _Absent:  # If-Match on an object deleted meanwhile
            return False
        except Exception as exc:
            if _is_conflict(exc):
                return False
            raise

    def _head(self, key: str) -> Optional[dict]:
        try:
            return self._call(key, self.client.head_object, Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        except _Absent:
            return None

    # ---- life --------------------------------------------------------------------------------------
    def exists(self) -> bool:
        """Whether anything was ever pushed here: one listing of the prefix's top level."""
        base = self.key("")
        response = self._call(base, self.client.list_objects_v2, Bucket=self.bucket, Prefix=base, Delimiter="/")
        tops = {p["Prefix"][len(base):] for p in response.get("CommonPrefixes", [])}
        return bool(tops & set(layout.STORED_ROOTS))

    def missing(self) -> str:
        return f"store {self.url}: not a trtbuild store (nothing has been pushed there)"

    def create(self) -> None:
        """Nothing to make on S3 (keys need no folders); checks the bucket answers."""
        self._call(self.key(""), lambda: None)

    # ---- blobs -------------------------------------------------------------------------------------
    def _transfer_config(self):
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(multipart_threshold=self.part_size, multipart_chunksize=self.part_size,
                              max_concurrency=self.concurrency, use_threads=self.concurrency > 1)

    def has_blob(self, digest: str) -> bool:
        return self._head(self.blob_key(digest)) is not None

    def blob_size(self, digest: str) -> Optional[int]:
        """The stored blob's size, or None when it is not there (one HEAD)."""
        head = self._head(self.blob_key(digest))
        return None if head is None else head["ContentLength"]

    def put_blob(self, source: Path, digest: str, owned: bool = False, link: bool = False) -> None:
        """Upload `source` (whose sha256 is `digest`) unless a blob of its size is there already (a
        re-push moves no bytes; one whose full-object SHA-256 says otherwise is uploaded again). One PUT carries the digest as its SHA-256 checksum, so the server
        refuses bytes that do not hash to the name; a multipart upload sends a SHA-256 per part,
        and the source is hashed first instead (no whole-object SHA-256 exists for multipart)."""
        source = Path(source)
        size = source.stat().st_size
        key = self.blob_key(digest)
        head = self._head(key)
        if head is not None and head["ContentLength"] == size and _full_sha256(head) in (None, digest):
            return  # already there: a re-push moves no bytes
        extra = {"ChecksumAlgorithm": "SHA256"}
        if size < self.part_size:
            extra["ChecksumSHA256"] = _b64(digest)
        else:
            actual = file_sha256(source)
            if actual != digest:
                raise CorruptStore(f"{source}: its sha256 is {actual}, expected {digest}")
        from boto3.s3.transfer import create_transfer_manager

        def upload() -> None:
            with create_transfer_manager(self.client, self._transfer_config()) as manager:
                manager.upload(str(source), self.bucket, key, extra_args=extra).result()

        try:
            self._call(key, upload)
        except _Absent:
            raise self._error(self.url_of(key), RuntimeError("upload failed")) from None
        except Exception as exc:
            raise self._upload_error(source, key, digest, exc) from None

    def _upload_error(self, source: Path, key: str, digest: str, exc: Exception) -> Exception:
        if "BadDigest" in str(exc) or "XAmzContentSHA256Mismatch" in str(exc) or "InvalidDigest" in str(exc):
            return CorruptStore(f"{source}: its bytes do not hash to {digest} (refused by {self.url_of(key)})")
        return exc if isinstance(exc, TrtbuildError) else self._error(self.url_of(key), exc)

    def put_blobs(self, sources: list[tuple[Path, str]], progress=None) -> None:
        """Upload every (file, sha256) through one boto3 transfer manager: all files and all their
        parts share `concurrency` requests in flight (one blob at a time would leave a 4-part file
        with 4). Each small blob carries its digest as its SHA-256 checksum, each part of a large
        one its own SHA-256; the caller has verified the files (push checks its local copy), so
        they are not hashed again here. `progress` hears the bytes as they are sent."""
        if not sources:
            return
        from boto3.s3.transfer import create_transfer_manager
        from s3transfer.subscribers import BaseSubscriber

        class _Bytes(BaseSubscriber):
            def on_progress(self, bytes_transferred, **kwargs):
                progress.advance(bytes_transferred)

        self._call(self.key(""), lambda: None)  # the bucket, once: a missing one is one clear line
        subscribers = [_Bytes()] if progress is not None else None
        with create_transfer_manager(self.client, self._transfer_config()) as manager:
            sent = []
            for source, digest in sources:
                key = self.blob_key(digest)
                extra = {"ChecksumAlgorithm": "SHA256"}
                if Path(source).stat().st_size < self.part_size:
                    extra["ChecksumSHA256"] = _b64(digest)
                sent.append((source, key, digest, manager.upload(str(source), self.bucket, key, extra_args=extra,
                                                                 subscribers=subscribers)))
            for source, key, digest, future in sent:
                try:
                    future.result()
                except Exception as exc:
                    raise self._upload_error(Path(source), key, digest, exc) from None

    def blob_problem(self, digest: str, size: int, label: str) -> Optional[str]:
        """A missing blob, one of another size, or one whose full-object SHA-256 (when the server
        keeps one) is not its name; the bytes are not downloaded here (they are verified as read)."""
        head = self._head(self.blob_key(digest))
        url = self.url_of(self.blob_key(digest))
        if head is None:
            return f"blob {digest} ({label}) is missing from {self.describe('cas')}"
        if head["ContentLength"] != size:
            return f"blob {url} ({label}) has {head['ContentLength']} bytes, its manifest says {size}"
        if _full_sha256(head) not in (None, digest):
            return f"blob {url} ({label}) is corrupt: its sha256 is {_full_sha256(head)}"
        return None

    def iter_blobs(self) -> Iterator[tuple[str, int]]:
        for rel, size in self.list(layout.CAS):
            yield layout.blob_name(rel, is_digest), size

    def rehash_blob(self, name: str, progress: Progress = None) -> str:
        digest = hashlib.sha256()
        key = self.blob_key(name)
        try:
            body = self._call(key, self.client.get_object, Bucket=self.bucket, Key=key)["Body"]
        except _Absent:
            raise CorruptStore(f"blob {self.url_of(key)} is missing") from None
        for chunk in body.iter_chunks(CHUNK):
            digest.update(chunk)
            if progress:
                progress(len(chunk))
        return digest.hexdigest()

    def remove_blob(self, name: str) -> None:
        self.delete(layout.blob(name))


    def ingest_files(self, folder: Path, progress: Progress = None, include=None,
                     links_within: Optional[Path] = None, link: bool = False):
        return ingest.ingest_folder(Path(folder), self.state, self.put_blob, False, progress, include, links_within)


class S3Store(Store):
    """The store under `s3://bucket/prefix` (S3Transport's arguments); it has no workspace."""

    transport: S3Transport

    def __init__(self, url: str, **options) -> None:
        super().__init__(S3Transport(url, **options))
        self.url, self.bucket = self.transport.url, self.transport.bucket

    def download_blobs(self, blobs: list[tuple[str, Path]], progress: Progress = None) -> list[int]:
        """Each (digest, new file) verified while it arrives (S3BlobReads.download_blobs)."""
        return self.transport.download_blobs(blobs, progress)
