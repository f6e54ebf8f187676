"""The store on S3: `s3://bucket/prefix`, the layout of the local store (cas/sha256/<ab>/<digest>,
manifests/<digest>.json, ac/<key>.json and ac/<key>.divergent.json, refs/<recipe>/<target>,
refs/<recipe>/.recipe.json) on any S3-compatible endpoint.

Coordination between hosts is by conditional writes only: an action record is written with
If-None-Match: * (the first writer wins), a ref with If-Match on the ETag it was read with (a 412
re-reads and retries), so two CI jobs publishing at once lose nothing and overwrite nothing.
Blobs are verified while they stream down (each byte read once) and never materialized unverified.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import fcntl
import hashlib
import io
import json
import os
import random
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Optional

from filelock import FileLock
from pydantic import ValidationError

from trtbuild.store import s3_client as s3lib
from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.keys import canonical_json
from trtbuild.store.records import ActionRecord, Digest, RecipeClaim, Ref, RefEntry, dump
from trtbuild.store.base import CorruptStore, Store, first_error, parse_record
from trtbuild.store.hash import CHUNK, Progress, bytes_sha256, file_sha256, is_digest
from trtbuild.store.local import _now
from trtbuild.store.state import StatCache
from trtbuild.store.tree import BadTree, Manifest, build_manifest

MiB = 1 << 20
LAYOUT_ROOTS = ("cas/", "manifests/", "ac/", "refs/")
CONFLICT_RETRIES = 64  # conditional writes lost in a row before a ref update gives up
RESUME_ATTEMPTS = 5  # a download interrupted this many times in a row fails


class _Absent(Exception):
    """The object is not there (404 on a key of a bucket that exists)."""


def _code(exc: Exception) -> tuple[str, Optional[int]]:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", "")), response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def _is_conflict(exc: Exception) -> bool:
    """A conditional write that lost (412), or a concurrent one in flight (409)."""
    code, status = _code(exc)
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (412, 409)


def _is_absent(exc: Exception) -> bool:
    code, status = _code(exc)
    return code in ("NoSuchKey", "404", "NotFound") or (status == 404 and code != "NoSuchBucket")


def _full_sha256(head: dict) -> Optional[str]:
    """The whole object's sha256 (hex) from a HEAD, when the server keeps one (not for multipart)."""
    checksum = head.get("ChecksumSHA256")
    if not checksum or "-" in checksum or head.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT":
        return None
    return base64.b64decode(checksum).hex()


def _b64(digest: str) -> str:
    return base64.b64encode(bytes.fromhex(digest)).decode()


def _interrupted_errors() -> tuple[type[BaseException], ...]:
    """What a body stream raises when the connection breaks midway (a download resumes after these)."""
    from botocore import exceptions as bex
    from urllib3 import exceptions as uex

    return (bex.ResponseStreamingError, bex.ReadTimeoutError, bex.IncompleteReadError, bex.ConnectionClosedError,
            uex.ProtocolError, uex.ReadTimeoutError, ConnectionError, TimeoutError)


def _fsync_and_close(out: BinaryIO) -> None:
    try:
        os.fsync(out.fileno())
    finally:
        out.close()


class _VerifiedBlobReader(io.RawIOBase):
    """The bytes of one blob as they stream down, hashed as they pass: at the end, bytes that do not
    hash to the blob's name raise CorruptStore. A broken connection resumes with a ranged GET from
    where it stopped, conditional on the same ETag (the object may not change underneath)."""

    def __init__(self, store: "S3Store", digest: str, start: int = 0, hashed=None) -> None:
        """`start`, `hashed`: continue after the first `start` bytes, already hashed into `hashed`
        (a partial file left by a download that was killed)."""
        self.store, self.digest = store, digest
        self.key = store.blob_key(digest)
        self.url = store.url_of(self.key)
        self.hash = hashed if hashed is not None else hashlib.sha256()
        self.position = start
        self.size: Optional[int] = None
        self.etag: Optional[str] = None
        self.body = None
        self.done = False
        self.early_ends = 0

    def readable(self) -> bool:
        return True

    def _open(self) -> None:
        if self.size is None and self.position:  # resuming another process's download: this object's ETag first
            head = self.store._head(self.key)
            if head is None:
                raise CorruptStore(f"blob {self.digest} is missing from {self.store.url_of(self.store.key('cas'))}")
            self.size, self.etag = head["ContentLength"], head["ETag"]
        if self.size is not None and self.position >= self.size:
            return  # nothing left to fetch
        extra = {"IfMatch": self.etag} if self.etag else {}
        if self.position:
            extra["Range"] = f"bytes={self.position}-"
        try:
            response = self.store._call(self.key, self.store.client.get_object, Bucket=self.store.bucket,
                                        Key=self.key, **extra)
        except _Absent:
            raise CorruptStore(f"blob {self.digest} is missing from {self.store.url_of(self.store.key('cas'))}") from None
        except TrtbuildError:
            raise
        except Exception as exc:  # If-Match failed: the object was replaced between two ranges
            if _is_conflict(exc):
                raise CorruptStore(f"blob {self.url} changed on the server during its download") from None
            raise self.store._error(self.url, exc) from None
        if self.size is None:
            self.size, self.etag = response["ContentLength"], response["ETag"]
        self.body = response["Body"]

    def readinto(self, buffer) -> int:
        if self.done or not len(buffer):
            return 0
        failures = 0
        while True:
            if self.body is None:
                self._open()
            if self.body is None:  # the partial file already held every byte (or more)
                self._finish()
                return 0
            try:
                data = self.body.read(len(buffer))
                break
            except _interrupted_errors():
                failures += 1
                self._close_body()
                if failures >= RESUME_ATTEMPTS:
                    raise TrtbuildError(f"{self.url}: the download broke off {failures} times at byte {self.position}")
        if not data:
            if self.position < (self.size or 0):  # the stream ended early without an error: resume
                self._close_body()
                self.early_ends += 1
                if self.early_ends >= RESUME_ATTEMPTS:
                    raise TrtbuildError(f"{self.url}: the download ended early {self.early_ends} times at byte {self.position}")
                return self.readinto(buffer)
            self._finish()
            return 0
        self.hash.update(data)
        self.position += len(data)
        if self.size is not None and self.position >= self.size:
            self._finish()  # verified before its last bytes are handed out: a reader that stops at the size is covered
        buffer[:len(data)] = data
        return len(data)

    def _finish(self) -> None:
        self.done = True
        self._close_body()
        actual = self.hash.hexdigest()
        if actual != self.digest:
            raise CorruptStore(f"blob {self.url} is corrupt: its sha256 is {actual}; {self.store.verify_hint()}")

    def _close_body(self) -> None:
        if self.body is not None:
            with contextlib.suppress(Exception):
                self.body.close()
            self.body = None

    def close(self) -> None:
        self._close_body()
        super().close()


class S3Store(Store):
    """A store under `s3://bucket/prefix`.

    Endpoint: `endpoint_url`, else AWS_ENDPOINT_URL; credentials: the standard chain (AWS_* variables,
    AWS_PROFILE, config files, instance roles); throttling and 5xx are retried with backoff by
    botocore's `retry_mode` ("standard" or "adaptive"). Blobs go up through boto3's transfer manager
    (multipart above `part_size`, `concurrency` parts at once) with SHA-256 checksums; a blob larger
    than `download_chunk` comes down as `concurrency` ranged GETs at once, hashed in order as the
    ranges arrive (each byte read once, at most `concurrency` chunks in memory).

    Local concepts, for a store on another machine:
    - tmpdir, clean_tmp, downloads_dir and key_lock use a folder on this host (`local_root`, by
      default $TMPDIR/trtbuild-s3/<hash of the URL>); key_lock only orders processes of this host
      (across hosts the first record written wins).
    - state is an in-memory stat cache; state_db_path is None.
    - register_lockfile does nothing (a lock file on one host cannot pin a shared store; push
      publishes each lock file under locks/<recipe>/<sha256>.lock instead, and the newest at
      locks/<recipe>.lock, through write_object, beside leases/);
      registered_lockfiles, failures and checkouts are empty.
    - keep_failure, checkout_path, checkout_lock, remove_checkout, report_dir, embedded_lock_path
      and exclusive using() (gc, repair) raise TrtbuildError "s3://...: <operation> needs a local store".
    """

    def __init__(self, url: str, endpoint_url: Optional[str] = None, part_size: int = 64 * MiB,
                 concurrency: int = 8, retry_mode: str = "standard", max_attempts: int = 8,
                 local_root: Optional[Path] = None, download_chunk: int = 8 * MiB) -> None:
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
        self.local_root = Path(local_root) if local_root is not None else \
            Path(tempfile.gettempdir()) / "trtbuild-s3" / bytes_sha256(self.url.encode())[:16]
        self._client = None
        self._bucket_checked = False
        self.state = StatCache(None)

    def __repr__(self) -> str:
        return f"S3Store({self.url})"

    @property
    def requests_at_once(self) -> int:  # boto3 clients are thread-safe; the pool holds 2x concurrency
        return self.concurrency

    # ---- the connection --------------------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            import botocore.session
            from botocore.config import Config

            # response_checksum_validation: every blob is hashed against its name as it streams and
            # every manifest against its digest; botocore checking its own checksum too ("when_supported")
            # would hash each downloaded byte a second time.
            # payload_signing_enabled=False: every upload carries a checksum header (SHA-256 for blobs)
            # that the signature covers and the server checks, as botocore itself does over https://;
            # over http:// (a local endpoint) it would otherwise also sign the payload, hashing every
            # byte sent a second time.
            config = Config(retries={"mode": self.retry_mode, "total_max_attempts": self.max_attempts},
                            max_pool_connections=max(10, 2 * self.concurrency),
                            response_checksum_validation="when_required",
                            s3={"payload_signing_enabled": False})
            # botocore's session, not boto3's: the same credential chain and configuration at half the
            # start-up (boto3's Session loads its resource models and injects methods trtbuild never
            # calls); boto3's transfer manager (put_blobs) is imported only when bytes move.
            try:
                self._client = botocore.session.get_session().create_client("s3", endpoint_url=self.endpoint_url,
                                                                            config=config)
            except Exception as exc:
                raise self._error(self.url, exc) from None
        return self._client

    def _error(self, url: str, exc: Exception) -> TrtbuildError:
        """One line naming the object; never a secret (s3lib.error, plus region and endpoint)."""
        from botocore import exceptions as bex

        code, status = _code(exc)
        if code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException") \
                or status == 301:
            region = (getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPHeaders", {})
                      .get("x-amz-bucket-region"))
            where = f"region {region}" if region else "another region"
            return InvalidInput(f"{url}: the bucket is in {where}, not {self.client.meta.region_name}: "
                                "set AWS_DEFAULT_REGION (or AWS_REGION)")
        if isinstance(exc, (bex.EndpointConnectionError, bex.ConnectTimeoutError)):
            return InvalidInput(f"{url}: cannot reach {self.endpoint_url or 'the S3 endpoint'} "
                                f"({type(exc).__name__}): check AWS_ENDPOINT_URL")
        return s3lib.error(url, exc)

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
                raise InvalidInput(f"{url}: bucket {self.bucket} does not exist") from None
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
        return self.key(f"cas/sha256/{digest[:2]}/{digest}" if "/" not in digest else f"cas/sha256/{digest}")

    def manifest_key(self, digest: str) -> str:
        return self.key(f"manifests/{digest}.json")

    def record_key(self, key: str) -> str:
        return self.key(f"ac/{key}.json")

    def divergence_key(self, key: str) -> str:
        return self.key(f"ac/{key}.divergent.json")

    def ref_key(self, recipe: str, target: str) -> str:
        return self.key(f"refs/{recipe}/{target}")

    def describe_blob(self, name: str) -> str:
        return self.url_of(self.blob_key(name))

    def describe_manifest(self, digest: str) -> str:
        return self.url_of(self.manifest_key(digest))

    def describe_record(self, key: str) -> str:
        return self.url_of(self.record_key(key))

    def describe_ref(self, recipe: str, target: str) -> str:
        return self.url_of(self.ref_key(recipe, target))

    # ---- small objects -----------------------------------------------------------------------------
    def _get(self, key: str) -> Optional[tuple[bytes, str]]:
        """(bytes, ETag) of an object, or None when it is not there."""
        for attempt in range(RESUME_ATTEMPTS):
            try:
                response = self._call(key, self.client.get_object, Bucket=self.bucket, Key=key)
            except _Absent:
                return None
            try:
                return response["Body"].read(), response["ETag"]
            except _interrupted_errors() as exc:  # small objects are fetched again whole
                if attempt == RESUME_ATTEMPTS - 1:
                    raise self._error(self.url_of(key), exc) from None
        raise AssertionError("unreachable")

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

    def _delete(self, key: str) -> None:
        with contextlib.suppress(_Absent):
            self._call(key, self.client.delete_object, Bucket=self.bucket, Key=key)

    def _list(self, rel: str) -> Iterator[tuple[str, int]]:
        """(key relative to the store, size) of every object under `rel`."""
        base = self.key("")
        pages = self._call(self.key(rel), self.client.get_paginator("list_objects_v2").paginate,
                           Bucket=self.bucket, Prefix=self.key(rel))
        try:
            for page in pages:
                for item in page.get("Contents", []):
                    yield item["Key"][len(base):], item["Size"]
        except Exception as exc:
            raise self._error(self.url_of(self.key(rel)), exc) from None

    @staticmethod
    def _backoff(attempt: int) -> None:
        time.sleep(random.uniform(0, min(0.5, 0.01 * 2 ** min(attempt, 6))))

    # ---- life --------------------------------------------------------------------------------------
    def verify_hint(self) -> str:
        """What a message about a damaged object tells the user to run (the store is not the default)."""
        return f"run `trtbuild cache verify --store {self.url}`"

    @property
    def location(self) -> str:
        return self.url

    def exists(self) -> bool:
        """Whether anything was ever pushed here: one listing of the prefix's top level."""
        base = self.key("")
        response = self._call(base, self.client.list_objects_v2, Bucket=self.bucket, Prefix=base, Delimiter="/")
        tops = {p["Prefix"][len(base):] for p in response.get("CommonPrefixes", [])}
        return bool(tops & set(LAYOUT_ROOTS))

    def require(self) -> None:
        if not self.exists():
            raise InvalidInput(f"store {self.url}: not a trtbuild store (nothing has been pushed there)")

    def create(self) -> None:
        """Nothing to make on S3 (keys need no folders); checks the bucket answers."""
        self._call(self.key(""), lambda: None)

    @contextlib.contextmanager
    def using(self, exclusive: bool = False, wait: bool = True) -> Iterator[None]:
        if exclusive:
            raise self._local_only("exclusive use (cache gc, repair)")
        self.create()
        yield

    def _local_only(self, operation: str) -> TrtbuildError:
        return TrtbuildError(f"{self.url}: {operation} needs a local store")

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

    _add_blob = put_blob

    def open_blob(self, digest: str) -> BinaryIO:
        """A reader of the blob that verifies it while it streams: reading to the end raises
        CorruptStore if the bytes do not hash to `digest`."""
        return io.BufferedReader(_VerifiedBlobReader(self, digest), buffer_size=CHUNK)

    def read_blob_into(self, digest: str, sink: Callable[[bytes], None], progress: Progress = None) -> int:
        """Stream the blob through `sink`, verified at the end (CorruptStore); returns its size."""
        return self._stream(_VerifiedBlobReader(self, digest), sink, progress)

    @staticmethod
    def _stream(reader: "_VerifiedBlobReader", sink: Callable[[bytes], None], progress: Progress = None) -> int:
        buffer = bytearray(CHUNK)
        total = 0
        try:
            while True:
                n = reader.readinto(buffer)
                if not n:
                    return total
                sink(bytes(memoryview(buffer)[:n]))
                total += n
                if progress:
                    progress(n)
        finally:
            reader.close()

    def verify_blob(self, digest: str, use_state: bool = True) -> None:
        """`use_state`: a full-object SHA-256 the server checked on upload and equal to the name is
        trusted (one HEAD); otherwise (or for multipart blobs) the bytes are streamed and hashed."""
        head = self._head(self.blob_key(digest))
        if head is None:
            raise CorruptStore(f"blob {digest} is missing from {self.url_of(self.key('cas'))}")
        if use_state and _full_sha256(head) == digest:
            return
        self.read_blob_into(digest, lambda data: None)

    def partial_path(self, digest: str, dest: Path) -> Path:
        """Where place_blob keeps the bytes of a download in progress (a killed one resumes from it)."""
        return Path(dest).with_name(f".{Path(dest).name}.{digest[:16]}.part")

    def place_blob(self, digest: str, dest: Path, executable: bool) -> None:
        """Download into a partial file beside `dest`, verifying while streaming; `dest` appears
        (read-only) only when the bytes hash to `digest`, and nothing is left there when they do not.
        A partial file left by a killed download is hashed and continued with a ranged GET; if the
        result does not verify, the blob is fetched once more from its first byte."""
        dest = Path(dest)
        partial = self.partial_path(digest, dest)
        with open(partial, "a+b") as out:
            fcntl.flock(out, fcntl.LOCK_EX)  # one process fetches to one place at a time
            try:
                current = os.stat(partial).st_ino
            except FileNotFoundError:
                current = None
            if current != os.fstat(out.fileno()).st_ino:  # the process we waited for finished (or gave up)
                fcntl.flock(out, fcntl.LOCK_UN)
                if not dest.exists():
                    self.place_blob(digest, dest, executable)
                return
            try:
                out.seek(0)
                hashed, start = hashlib.sha256(), 0
                for chunk in iter(lambda: out.read(CHUNK), b""):
                    hashed.update(chunk)
                    start += len(chunk)
                try:
                    self._fetch(digest, out, start, hashed)
                except CorruptStore:
                    if not start:
                        raise
                    out.truncate(0)  # the leftover was not this blob's beginning: start over
                    self._fetch(digest, out, 0, hashlib.sha256())
                out.flush()
                os.fsync(out.fileno())
                os.chmod(partial, 0o555 if executable else 0o444)
                os.replace(partial, dest)
            except CorruptStore:
                partial.unlink(missing_ok=True)  # bad bytes are not kept (an interrupted download's are)
                raise
            finally:
                fcntl.flock(out, fcntl.LOCK_UN)

    def download_blob(self, digest: str, dest: Path, progress: Progress = None) -> int:
        """Write the blob into `dest` (a new file), verified while it arrives (download_blobs)."""
        return self.download_blobs([(digest, dest)], progress)[0]

    def download_blobs(self, blobs: list[tuple[str, Path]], progress: Progress = None) -> list[int]:
        """Write each (digest, new file) verified while it arrives, and durable (fsynced) when this
        returns; their sizes. Every blob's ranges (`download_chunk` bytes, one per small blob) go
        through one window of `concurrency` ranged GETs of the ETag the HEAD saw, hashed and written
        in order as they arrive (each byte read once): the next blob's bytes are already coming
        while one's last ranges are hashed, and each file is fsynced by a thread of its own while
        the next one is written. CorruptStore, naming the blob, for one missing or one whose bytes
        do not hash to its name."""
        if not blobs:
            return []
        keys = [self.blob_key(digest) for digest, _ in blobs]
        heads = self._heads(keys)
        for (digest, _), head in zip(blobs, heads):
            if head is None:
                raise CorruptStore(f"blob {digest} is missing from {self.url_of(self.key('cas'))}")
        ranges = [(i, offset, min(offset + self.download_chunk, head["ContentLength"]) - 1)
                  for i, head in enumerate(heads) for offset in range(0, head["ContentLength"], self.download_chunk)]
        pending = iter(ranges)
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency), thread_name_prefix="trtbuild-get") as pool, \
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="trtbuild-fsync") as syncer:
            window: collections.deque = collections.deque()

            def refill() -> None:
                while len(window) < max(1, self.concurrency):
                    item = next(pending, None)
                    if item is None:
                        return
                    i, first, last = item
                    window.append(pool.submit(self._get_range, keys[i], heads[i]["ETag"], first, last))

            synced = []
            try:
                refill()
                for i, (digest, dest) in enumerate(blobs):
                    out, hashed, left = open(dest, "wb"), hashlib.sha256(), heads[i]["ContentLength"]
                    try:
                        while left > 0:
                            pieces = window.popleft().result()
                            refill()
                            for piece in pieces:
                                hashed.update(piece)
                                out.write(piece)
                                left -= len(piece)
                                if progress:
                                    progress(len(piece))
                        actual = hashed.hexdigest()
                        if actual != digest:
                            raise CorruptStore(f"blob {self.url_of(keys[i])} is corrupt: its sha256 is {actual}; "
                                               f"{self.verify_hint()}")
                        out.flush()
                    except BaseException:
                        out.close()
                        raise
                    synced.append(syncer.submit(_fsync_and_close, out))
            finally:
                for future in window:
                    future.cancel()
            for future in synced:
                future.result()
        return [head["ContentLength"] for head in heads]

    def _heads(self, keys: list[str]) -> list[Optional[dict]]:
        """HEAD of each key (None: not there), `concurrency` requests at once."""
        if len(keys) <= 1 or self.concurrency < 2:
            return [self._head(key) for key in keys]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(keys)), thread_name_prefix="trtbuild-head") as pool:
            return list(pool.map(self._head, keys))

    def _fetch(self, digest: str, out: BinaryIO, start: int, hashed, progress: Progress = None) -> None:
        """Append the blob's bytes after `start` to `out`, verified: small ones in one stream, large
        ones in parallel ranged GETs of one ETag, hashed and written in order as they arrive."""
        key = self.blob_key(digest)
        head = self._head(key)
        if head is None:
            raise CorruptStore(f"blob {digest} is missing from {self.url_of(self.key('cas'))}")
        size, etag = head["ContentLength"], head["ETag"]
        if size - start <= self.download_chunk or self.concurrency < 2:
            reader = _VerifiedBlobReader(self, digest, start, hashed)
            reader.size, reader.etag = size, etag
            self._stream(reader, out.write, progress)
            return
        offsets = iter(range(start, size, self.download_chunk))
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            window: list = []

            def refill() -> None:
                for offset in offsets:
                    window.append(pool.submit(self._get_range, key, etag, offset,
                                              min(offset + self.download_chunk, size) - 1))
                    if len(window) >= self.concurrency:
                        return

            refill()
            try:
                while window:
                    pieces = window.pop(0).result()
                    refill()
                    for piece in pieces:
                        hashed.update(piece)
                        out.write(piece)
                        if progress:
                            progress(len(piece))
            finally:
                for future in window:
                    future.cancel()
        actual = hashed.hexdigest()
        if actual != digest:
            raise CorruptStore(f"blob {self.url_of(key)} is corrupt: its sha256 is {actual}; {self.verify_hint()}")

    def _get_range(self, key: str, etag: str, first: int, last: int) -> list[bytes]:
        """Bytes first..last of the object as it was (If-Match), as the pieces read (joining them
        would copy every byte pulled once more), resuming within the range when the connection breaks."""
        pieces: list[bytes] = []
        got = 0
        failures = 0
        while first + got <= last:
            try:
                body = self._call(key, self.client.get_object, Bucket=self.bucket, Key=key,
                                  Range=f"bytes={first + got}-{last}", IfMatch=etag)["Body"]
            except _Absent:
                raise CorruptStore(f"blob {self.url_of(key)} disappeared during its download") from None
            except TrtbuildError:
                raise
            except Exception as exc:
                if _is_conflict(exc):
                    raise CorruptStore(f"blob {self.url_of(key)} changed on the server during its download") from None
                raise
            try:
                while first + got <= last:
                    piece = body.read(min(CHUNK, last + 1 - first - got))
                    if not piece:
                        break
                    pieces.append(piece)
                    got += len(piece)
            except _interrupted_errors():
                pass  # resumed below from the first byte not received
            finally:
                with contextlib.suppress(Exception):
                    body.close()
            if first + got <= last:
                failures += 1
                if failures >= RESUME_ATTEMPTS:
                    raise TrtbuildError(f"{self.url_of(key)}: the download broke off {failures} times at byte "
                                        f"{first + got}")
        return pieces

    def iter_blobs(self) -> Iterator[tuple[str, int]]:
        for rel, size in self._list("cas/sha256/"):
            path = rel[len("cas/sha256/"):]
            folder, _, name = path.rpartition("/")
            yield (name if is_digest(name) and folder == name[:2] else path), size

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
        self._delete(self.blob_key(name))

    # ---- manifests ---------------------------------------------------------------------------------
    def ingest(self, folder: Path, progress: Progress = None, include=None, links_within: Optional[Path] = None,
               link: bool = False) -> Manifest:
        manifest, sources = build_manifest(Path(folder), self.state, include=include, progress=progress,
                                           links_within=links_within)
        for entry in manifest.entries:
            self.put_blob(sources[entry.path], entry.sha256)
        self.put_manifest(manifest)
        return manifest

    def put_manifest(self, manifest: Manifest) -> str:
        """Written after its blobs (checked: a manifest never names missing bytes), with its digest
        as the SHA-256 checksum; a manifest already there is left alone (If-None-Match: *)."""
        digest = manifest.digest
        key = self.manifest_key(digest)
        if self._head(key) is not None:
            return digest
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            present = list(pool.map(self.has_blob, [e.sha256 for e in manifest.entries]))
        missing = [e.path for e, there in zip(manifest.entries, present) if not there]
        if missing:
            raise CorruptStore(f"manifest {digest} names blobs {self.url} lacks: {', '.join(missing[:3])}")
        self._put(key, manifest.to_bytes(), if_none_match=True)
        return digest

    def has_manifest(self, digest: str) -> bool:
        return self._head(self.manifest_key(digest)) is not None

    def get_manifest(self, digest: str) -> Manifest:
        key = self.manifest_key(digest)
        found = self._get(key)
        if found is None:
            raise CorruptStore(f"manifest {digest} is missing from {self.url_of(self.key('manifests'))}")
        data = found[0]
        if bytes_sha256(data) != digest:
            raise CorruptStore(f"manifest {self.url_of(key)} is corrupt or tampered: its content does not hash to its name")
        try:
            return Manifest.from_bytes(data, self.url_of(key))
        except BadTree as exc:
            raise CorruptStore(str(exc)) from None

    def manifest_digests(self) -> list[str]:
        names = (rel[len("manifests/"):] for rel, _ in self._list("manifests/"))
        return sorted(n[:-5] for n in names if n.endswith(".json") and is_digest(n[:-5]))

    def artifact_problem(self, digest: str) -> Optional[str]:
        """Missing or tampered manifest, a missing blob or one of the wrong size, or a blob whose
        full-object SHA-256 (when the server keeps one) is not its name. Blob bytes are not
        downloaded here: they are verified as they are read."""
        try:
            manifest = self.get_manifest(digest)
        except CorruptStore as exc:
            return str(exc)
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            heads = list(pool.map(lambda e: self._head(self.blob_key(e.sha256)), manifest.entries))
        for entry, head in zip(manifest.entries, heads):
            url = self.describe_blob(entry.sha256)
            if head is None:
                return f"blob {entry.sha256} ({entry.path}) is missing from {self.url_of(self.key('cas'))}"
            if head["ContentLength"] != entry.size:
                return f"blob {url} ({entry.path}) has {head['ContentLength']} bytes, its manifest says {entry.size}"
            if _full_sha256(head) not in (None, entry.sha256):
                return f"blob {url} ({entry.path}) is corrupt: its sha256 is {_full_sha256(head)}"
        return None

    def put_file_blob(self, path: Path) -> Digest:
        digest = file_sha256(path)
        self.put_blob(Path(path), digest)
        return Digest(hash=digest, size_bytes=Path(path).stat().st_size)

    def read_manifest_bytes(self, digest: str) -> bytes:
        found = self._get(self.manifest_key(digest))
        if found is None:
            raise FileNotFoundError(self.describe_manifest(digest))
        return found[0]

    def remove_manifest(self, digest: str) -> None:
        self._delete(self.manifest_key(digest))

    # ---- action records ----------------------------------------------------------------------------
    def _parse_record(self, key: str, data: bytes) -> Optional[ActionRecord]:
        return parse_record(key, data, self.describe_record(key))

    def get_record(self, key: str) -> Optional[ActionRecord]:
        found = self._get(self.record_key(key))
        return None if found is None else self._parse_record(key, found[0])

    def put_record(self, record: ActionRecord, replace: bool = False) -> ActionRecord:
        """First writer wins (If-None-Match: *): a different artifact under a key already recorded
        is noted in ac/<key>.divergent.json and the stored record is returned, never written over.
        `replace` makes the new one the record (If-Match on the ETag read), keeping the old digest
        among the divergences; a damaged record is replaced."""
        key, object_key = record.key, self.record_key(record.key)
        body = canonical_json(dump(record)) + b"\n"
        for attempt in range(CONFLICT_RETRIES):
            found = self._get(object_key)
            if found is None:
                if self._put(object_key, body, if_none_match=True):
                    return record
                self._backoff(attempt)
                continue
            data, etag = found
            try:
                existing = self._parse_record(key, data)
            except CorruptStore:
                if not replace:
                    raise
                existing = None
            if existing is not None and (existing.digest == record.digest or not replace):
                if existing.digest != record.digest:
                    self._note_divergence(key, record.digest, record.created)
                return existing
            if existing is not None:
                self._note_divergence(key, existing.digest, existing.created)
            if self._put(object_key, body, if_match=etag):  # replaces a damaged, old-layout or --rebuild record
                return record
            self._backoff(attempt)
        raise TrtbuildError(f"{self.describe_record(key)}: kept changing during {CONFLICT_RETRIES} attempts to write it")

    def _note_divergence(self, key: str, digest: str, created: str) -> None:
        object_key = self.divergence_key(key)
        for attempt in range(CONFLICT_RETRIES):
            found = self._get(object_key)
            seen = json.loads(found[0]) if found else []
            if digest in {d["digest"] for d in seen}:
                return
            seen.append({"digest": digest, "created": created})
            data = canonical_json(seen) + b"\n"
            if self._put(object_key, data, if_match=found[1]) if found else self._put(object_key, data, if_none_match=True):
                return
            self._backoff(attempt)
        raise TrtbuildError(f"{self.url_of(object_key)}: kept changing during {CONFLICT_RETRIES} attempts to write it")

    def divergences(self, key: str) -> list[dict]:
        """The other artifacts recorded for `key` ({digest, created}, in the order they came)."""
        found = self._get(self.divergence_key(key))
        return json.loads(found[0]) if found else []

    def _record_names(self) -> list[str]:
        names = (rel[len("ac/"):] for rel, _ in self._list("ac/"))
        return sorted(n[:-5] for n in names if n.endswith(".json") and not n.endswith(".divergent.json") and "/" not in n)

    def records(self) -> list[ActionRecord]:
        out = []
        for key in self._record_names():
            try:
                record = self.get_record(key)
            except CorruptStore:
                continue
            if record is not None:
                out.append(record)
        return out

    def record_keys(self) -> list[str]:
        return self._record_names()

    def read_record_bytes(self, key: str) -> bytes:
        found = self._get(self.record_key(key))
        if found is None:
            raise FileNotFoundError(self.describe_record(key))
        return found[0]

    def delete_record(self, key: str) -> None:
        self._delete(self.record_key(key))
        self._delete(self.divergence_key(key))

    # ---- refs --------------------------------------------------------------------------------------
    def _parse_ref(self, recipe: str, target: str, data: bytes) -> Ref:
        try:
            return Ref.model_validate_json(data, strict=True)
        except ValidationError as exc:
            raise CorruptStore(f"ref {self.describe_ref(recipe, target)} is malformed ({first_error(exc)}); "
                               "run `trtbuild cache verify --repair`") from None

    def read_ref(self, recipe: str, target: str) -> Optional[Ref]:
        found = self._get(self.ref_key(recipe, target))
        return None if found is None else self._parse_ref(recipe, target, found[0])

    def update_ref(self, recipe: str, target: str, digest: str, key: str) -> None:
        """Point the ref at `digest`, appending to its history: read it with its ETag, write with
        If-Match (If-None-Match: * when new); a 412 means another job moved it: re-read, retry."""
        object_key = self.ref_key(recipe, target)
        for attempt in range(CONFLICT_RETRIES):
            found = self._get(object_key)
            ref = None
            if found is not None:
                try:
                    ref = self._parse_ref(recipe, target, found[0])
                except CorruptStore:
                    ref = None  # a damaged ref is replaced by the artifact that just passed
            if ref is not None and ref.digest == digest and ref.key == key:
                return
            history = [*(ref.history if ref else []), RefEntry(digest=digest, key=key, time=_now())]
            data = canonical_json(dump(Ref(digest=digest, key=key, history=history))) + b"\n"
            written = self._put(object_key, data, if_match=found[1]) if found else \
                self._put(object_key, data, if_none_match=True)
            if written:
                return
            self._backoff(attempt)
        raise TrtbuildError(f"{self.url_of(object_key)}: other jobs moved it {CONFLICT_RETRIES} times in a row; try again")

    def delete_ref(self, recipe: str, target: str) -> None:
        self._delete(self.ref_key(recipe, target))

    def refs(self, malformed: Optional[list] = None) -> Iterator[tuple[str, str, Ref]]:
        for rel, _ in list(self._list("refs/")):
            parts = rel.split("/")
            if len(parts) != 3 or parts[2].startswith("."):
                continue
            found = self._get(self.key(rel))
            if found is None:
                continue
            try:
                ref = Ref.model_validate_json(found[0], strict=True)
            except ValidationError as exc:
                if malformed is not None:  # `cache verify` names it
                    malformed.append((parts[1], parts[2], first_error(exc)))
                continue
            yield parts[1], parts[2], ref

    def check_claim(self, name: str, identity: str) -> None:
        object_key = self.key(f"refs/{name}/.recipe.json")
        found = self._get(object_key)
        if found is not None:
            self._judge_claim(found[0], object_key, name, identity)

    def claim_recipe(self, name: str, identity: str) -> None:
        object_key = self.key(f"refs/{name}/.recipe.json")
        for attempt in range(CONFLICT_RETRIES):
            found = self._get(object_key)
            if found is None:
                if self._put(object_key, canonical_json(dump(RecipeClaim(name=name, identity=identity))) + b"\n",
                             if_none_match=True):
                    return
                self._backoff(attempt)
                continue
            self._judge_claim(found[0], object_key, name, identity)
            return
        raise TrtbuildError(f"{self.url_of(object_key)}: kept changing during {CONFLICT_RETRIES} attempts to write it")

    def _judge_claim(self, data: bytes, object_key: str, name: str, identity: str) -> None:
        try:
            claim = RecipeClaim.model_validate_json(data)
        except ValidationError:
            raise CorruptStore(f"{self.url_of(object_key)} is malformed; remove it to let a recipe claim "
                               f"the name {name!r}") from None
        if claim.identity != identity:
            raise InvalidInput(f"recipe {identity}: name {name!r} already belongs to {claim.identity} in store "
                               f"{self.url}; give this recipe another `name:` (or remove "
                               f"{self.url_of(object_key)} to hand the name over)")

    # ---- small objects of other layers (leases/, locks/): store/lease.py, push's lock files ------
    def read_object(self, rel: str) -> Optional[bytes]:
        """The bytes of the object at `rel` under the store's prefix, or None when it is not there."""
        found = self._get(self.key(rel))
        return None if found is None else found[0]

    def write_object(self, rel: str, data: bytes) -> None:
        self._put(self.key(rel), data)

    def delete_object(self, rel: str) -> None:
        self._delete(self.key(rel))

    def list_objects(self, rel: str) -> list[str]:
        """The keys (relative to the store) of every object under `rel`."""
        return sorted(name for name, _ in self._list(rel))

    def describe_object(self, rel: str) -> str:
        return self.url_of(self.key(rel))

    # ---- lock files --------------------------------------------------------------------------------
    def register_lockfile(self, lock_path: Path) -> None:
        """Nothing: a lock file on one host cannot pin a shared store."""

    def registered_lockfiles(self) -> list[Path]:
        return []

    def embedded_lock_path(self, recipe: str) -> Path:
        raise self._local_only("the embedded recipe's lock file")

    # ---- locks and local areas ---------------------------------------------------------------------
    def _local(self, sub: str) -> Path:
        path = self.local_root / sub
        path.mkdir(parents=True, exist_ok=True)
        return path

    def key_lock(self, key: str) -> FileLock:
        return FileLock(str(self._local("locks") / f"{key}.lock"))

    def checkout_lock(self, digest: str) -> contextlib.AbstractContextManager:
        raise self._local_only("checkout")

    def tmpdir(self, prefix: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=self._local("tmp")))

    def clean_tmp(self, older_than_s: float = 24 * 3600, dry_run: bool = False) -> int:
        folder = self.local_root / "tmp"
        removed, now = 0, time.time()
        for path in folder.iterdir() if folder.is_dir() else ():
            try:
                if now - path.lstat().st_mtime > older_than_s:
                    if not dry_run:
                        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed

    def downloads_dir(self) -> Path:
        return self.local_root / "downloads"

    def state_db_path(self) -> Optional[Path]:
        return None

    def keep_failure(self, key: str, logs: Path) -> Path:
        raise self._local_only("keeping a failed run's logs")

    def failures(self) -> list[str]:
        return []

    def remove_failure(self, key: str) -> None:
        raise self._local_only("removing a failure")

    def checkout_path(self, digest: str) -> Path:
        raise self._local_only("checkout")

    def checkouts(self) -> list[str]:
        return []

    def remove_checkout(self, name: str) -> None:
        raise self._local_only("removing a checkout")

    def report_dir(self, recipe: str) -> Path:
        raise self._local_only("a report folder")
