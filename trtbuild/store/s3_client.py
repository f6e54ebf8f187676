"""The one S3 module of trtbuild: URLs, the client, the one error mapping (typed errors, one exit
code each), and what S3 sources use (listing, checksums, parallel downloads); the S3 store
(store/s3.py) builds on it. Credentials and endpoints come from the standard AWS variables
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_ENDPOINT_URL, AWS_DEFAULT_REGION)."""

from __future__ import annotations

import base64
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trtbuild.errors import InvalidInput, TrtbuildError, Unreachable


@dataclass(frozen=True)
class S3Object:
    key: str
    size: int
    etag: str


def parse_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix")."""
    if not url.startswith("s3://") or len(url) <= 5:
        raise InvalidInput(f"{url}: not an s3://BUCKET/PREFIX URL")
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix


class S3Error(TrtbuildError):
    """One S3 failure, one line: `url` the object or bucket asked for, `endpoint` the service,
    `bucket`, and `why` (the line's reason, no secret in it)."""

    def __init__(self, message: str, *, url: str, bucket: Optional[str] = None, endpoint: Optional[str] = None,
                 why: str = "") -> None:
        super().__init__(message)
        self.url, self.bucket, self.endpoint, self.why = url, bucket, endpoint, why


class S3Unreachable(S3Error, Unreachable):
    """The endpoint does not answer: an environment failure, exit 1 (as an unreachable hub is)."""


class S3ConfigError(S3Error, InvalidInput):
    """The request cannot succeed as configured: exit 2."""


class S3CredentialsError(S3ConfigError):
    """No credentials, a profile that is not configured, or credentials the service refuses."""


class S3BucketMissing(S3ConfigError):
    """The bucket does not exist."""


class Absent(Exception):
    """The object is not there (404 on a key of a bucket that exists)."""


def code_of(exc: Exception) -> tuple[str, Optional[int]]:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", "")), response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def is_conflict(exc: Exception) -> bool:
    """A conditional write that lost (412), or a concurrent one in flight (409)."""
    code, status = code_of(exc)
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (412, 409)


def is_absent(exc: Exception) -> bool:
    code, status = code_of(exc)
    return code in ("NoSuchKey", "404", "NotFound") or (status == 404 and code != "NoSuchBucket")


def full_sha256(head: dict) -> Optional[str]:
    """The whole object's sha256 (hex) from a HEAD, when the server keeps one; composite
    (multipart) checksums are not a hash of the content and do not count."""
    checksum = head.get("ChecksumSHA256")
    if not checksum or "-" in checksum or head.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT":
        return None
    return base64.b64decode(checksum).hex()


def client(endpoint_url: Optional[str] = None, retry_mode: str = "standard", max_attempts: int = 5,
           pool: int = 10, checksums: str = "when_supported", sign_payload: bool = True):
    """An S3 client: `endpoint_url`, else AWS_ENDPOINT_URL; the standard credential chain.

    botocore's session, not boto3's: the same credential chain and configuration at half the start-up
    (boto3's Session loads resource models trtbuild never uses). The store passes
    checksums="when_required" (it hashes every blob against its name as it streams; botocore checking
    its own checksum too would hash each byte twice) and sign_payload=False (every upload carries a
    checksum header the signature covers and the server checks; over http:// botocore would otherwise
    also sign the payload, hashing every byte sent a second time)."""
    import botocore.session
    from botocore.config import Config

    config = Config(retries={"mode": retry_mode, "total_max_attempts": max_attempts}, max_pool_connections=pool,
                    response_checksum_validation=checksums, s3={"payload_signing_enabled": sign_payload})
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
    return botocore.session.get_session().create_client("s3", endpoint_url=endpoint, config=config)


def error(url: str, exc: Exception, endpoint: Optional[str] = None, region: Optional[str] = None) -> TrtbuildError:
    """The one mapping of an S3 failure to one line naming the object, never a secret: an
    unreachable endpoint is S3Unreachable (exit 1); missing or refused credentials, a missing
    bucket, a wrong region or endpoint URL are S3ConfigError (exit 2)."""
    from botocore import exceptions as bex

    if isinstance(exc, TrtbuildError):
        return exc
    bucket = parse_url(url)[0] if url.startswith("s3://") and len(url) > 5 else None
    endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL") or None

    def config(kind, why: str, line: str) -> TrtbuildError:
        return kind(f"{url}: {line}", url=url, bucket=bucket, endpoint=endpoint, why=why)

    if isinstance(exc, (bex.EndpointConnectionError, bex.ConnectTimeoutError, bex.ReadTimeoutError)):
        where = endpoint or getattr(exc, "kwargs", {}).get("endpoint_url") or "the S3 endpoint"
        return S3Unreachable(f"{url}: cannot reach {where} ({type(exc).__name__}): check AWS_ENDPOINT_URL",
                             url=url, bucket=bucket, endpoint=where, why="unreachable")
    if isinstance(exc, bex.ProfileNotFound):
        return config(S3CredentialsError, "profile", f"AWS profile {exc.kwargs.get('profile')!r} is not configured "
                      "(AWS_PROFILE)")
    if isinstance(exc, ValueError) and "endpoint" in str(exc).lower():
        return config(S3ConfigError, "endpoint", f"{' '.join(str(exc).split())[:200]} (AWS_ENDPOINT_URL)")
    if isinstance(exc, (bex.NoCredentialsError, bex.PartialCredentialsError)):
        return config(S3CredentialsError, "no credentials", "no AWS credentials: set AWS_ACCESS_KEY_ID and "
                      "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)")
    if isinstance(exc, bex.ClientError):
        code, status = code_of(exc)
        if code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException") \
                or status == 301:
            found = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("x-amz-bucket-region")
            return config(S3ConfigError, "region", f"the bucket is in {f'region {found}' if found else 'another region'}"
                          f", not {region}: set AWS_DEFAULT_REGION (or AWS_REGION)")
        if code == "NoSuchBucket":
            return config(S3BucketMissing, "no bucket", "bucket does not exist")
        if code in ("NoSuchKey", "404", "NotFound"):
            return config(S3ConfigError, "no object", "no such object")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "AllAccessDisabled") \
                or status == 403:
            return config(S3CredentialsError, "access denied", f"access denied ({code}): check "
                          "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and the bucket policy")
        return S3Error(f"{url}: S3 error {code or status}: {exc.response.get('Error', {}).get('Message', '')}",
                       url=url, bucket=bucket, endpoint=endpoint, why=code or str(status))
    return S3Error(f"{url}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", url=url, bucket=bucket,
                   endpoint=endpoint, why=type(exc).__name__)


def missing_bucket(url: str, bucket: str) -> S3BucketMissing:
    return S3BucketMissing(f"{url}: bucket {bucket} does not exist", url=url, bucket=bucket, why="no bucket")


def list_objects(s3, bucket: str, prefix: str, page_size: Optional[int] = None) -> list[S3Object]:
    """Every object under prefix (all pages)."""
    found = []
    pages = {"PageSize": page_size} if page_size else {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, PaginationConfig=pages):
        for item in page.get("Contents", []):
            found.append(S3Object(item["Key"], item["Size"], item["ETag"].strip('"')))
    return found


def head(s3, bucket: str, key: str) -> tuple[S3Object, Optional[str]]:
    """The object and its full-object sha256 (hex) when the bucket keeps one; composite (multipart)
    checksums are not a hash of the content and do not count."""
    response = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    return S3Object(key, response["ContentLength"], response["ETag"].strip('"')), full_sha256(response)


def get_small_object(url: str, limit: int = 16 << 20) -> bytes:
    """One GET of a small object (a model folder's config.json), with the source's credentials and
    one-line errors; `limit` guards against a URL that names a weights file by mistake."""
    bucket, key = parse_url(url)
    try:
        response = client().get_object(Bucket=bucket, Key=key)
        if response["ContentLength"] > limit:
            response["Body"].close()
            raise InvalidInput(f"{url}: {response['ContentLength']} bytes, more than a config file ({limit} at most)")
        return response["Body"].read()
    except TrtbuildError:
        raise
    except Exception as exc:
        raise error(url, exc) from None


class _RangedObject(io.RawIOBase):
    """A seekable read-only view of an object, one ranged GET per read: tarfile walks a .nemo
    archive's headers through it and fetches only the members it extracts."""

    def __init__(self, s3, bucket: str, key: str, size: int):
        self.s3, self.bucket, self.key, self.size, self.position = s3, bucket, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer) -> int:
        if self.position >= self.size or not len(buffer):
            return 0
        end = min(self.position + len(buffer), self.size) - 1
        url = f"s3://{self.bucket}/{self.key}"
        try:
            data = self.s3.get_object(Bucket=self.bucket, Key=self.key, Range=f"bytes={self.position}-{end}")["Body"].read()
        except Exception as exc:
            raise error(url, exc) from None
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)


def open_ranged(url: str, block: int = 1 << 20) -> io.BufferedReader:
    """A buffered, seekable reader of an object that fetches `block` bytes per GET."""
    bucket, key = parse_url(url)
    try:
        s3 = client()
        size = s3.head_object(Bucket=bucket, Key=key)["ContentLength"]
    except Exception as exc:
        raise error(url, exc) from None
    return io.BufferedReader(_RangedObject(s3, bucket, key, size), buffer_size=block)


def download(s3, bucket: str, key: str, dest: Path) -> None:
    """Parallel ranged download with boto3's transfer manager (it writes a temp file, then renames)."""
    from boto3.s3.transfer import S3Transfer, TransferConfig

    dest.parent.mkdir(parents=True, exist_ok=True)
    S3Transfer(s3, TransferConfig(max_concurrency=8, multipart_chunksize=64 * 1024 * 1024)).download_file(
        bucket, key, str(dest))
