"""S3 access shared by S3 sources (and the S3 store): URLs, listing, checksums, parallel downloads,
and one-line errors. Credentials and endpoints come from the standard AWS variables
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_ENDPOINT_URL, AWS_DEFAULT_REGION)."""

from __future__ import annotations

import base64
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trtbuild.errors import InvalidInput, TrtbuildError


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


def client():
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(retries={"max_attempts": 5, "mode": "standard"}))


def error(url: str, exc: Exception) -> TrtbuildError:
    """One line naming the object: input problems (exit 2) vs. the service being unreachable (exit 1)."""
    from botocore import exceptions as bex

    if isinstance(exc, bex.ProfileNotFound):
        return InvalidInput(f"{url}: AWS profile {exc.kwargs.get('profile')!r} is not configured (AWS_PROFILE)")
    if isinstance(exc, ValueError) and "endpoint" in str(exc).lower():
        return InvalidInput(f"{url}: {' '.join(str(exc).split())[:200]} (AWS_ENDPOINT_URL)")
    if isinstance(exc, (bex.NoCredentialsError, bex.PartialCredentialsError)):
        return InvalidInput(f"{url}: no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)")
    if isinstance(exc, bex.ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchBucket",):
            return InvalidInput(f"{url}: bucket does not exist")
        if code in ("NoSuchKey", "404", "NotFound"):
            return InvalidInput(f"{url}: no such object")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "AllAccessDisabled") or status == 403:
            return InvalidInput(f"{url}: access denied ({code}): check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and the bucket policy")
        return TrtbuildError(f"{url}: S3 error {code or status}: {exc.response.get('Error', {}).get('Message', '')}")
    if isinstance(exc, (bex.EndpointConnectionError, bex.ConnectTimeoutError, bex.ReadTimeoutError)):
        endpoint = os.environ.get("AWS_ENDPOINT_URL", "the S3 endpoint")
        return TrtbuildError(f"{url}: cannot reach {endpoint} ({type(exc).__name__})")
    return TrtbuildError(f"{url}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")


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
    obj = S3Object(key, response["ContentLength"], response["ETag"].strip('"'))
    checksum = response.get("ChecksumSHA256")
    if not checksum or "-" in checksum or response.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT":
        return obj, None
    return obj, base64.b64decode(checksum).hex()


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
    from boto3.s3.transfer import TransferConfig

    dest.parent.mkdir(parents=True, exist_ok=True)
    s3.download_file(bucket, key, str(dest), Config=TransferConfig(max_concurrency=8, multipart_chunksize=64 * 1024 * 1024))
