"""Reading blobs from S3, verified: every byte is hashed as it streams down and a blob is never
materialized unverified; a broken connection resumes with a ranged GET of the same ETag. Mixed into
S3Transport (store/s3.py)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Callable, Optional

from trtbuild.errors import TrtbuildError
from trtbuild.store.errors import CorruptStore
from trtbuild.store.hash import CHUNK, Progress
from trtbuild.store.s3_client import Absent as _Absent, full_sha256 as _full_sha256
from trtbuild.store.s3_client import is_absent as _is_absent, is_conflict as _is_conflict

RESUME_ATTEMPTS = 5  # a download interrupted this many times in a row fails


def _interrupted_errors() -> tuple[type[BaseException], ...]:
    """What a body stream raises when the connection breaks midway (a download resumes after these)."""
    from botocore import exceptions as bex
    from urllib3 import exceptions as uex

    return (bex.ResponseStreamingError, bex.ReadTimeoutError, bex.IncompleteReadError, bex.ConnectionClosedError,
            uex.ProtocolError, uex.ReadTimeoutError, ConnectionError, TimeoutError)


def _get_failure(store, digest: str, exc: BaseException) -> BaseException:
    """What a failed GET of blob `digest` means, as one error: gone from the store, replaced on the
    server between two requests (an If-Match refused, or boto3's check of the ETag), or the server's own."""
    from s3transfer.exceptions import S3DownloadFailedError, S3ValidationError

    if isinstance(exc, TrtbuildError):
        return exc
    if isinstance(exc, _Absent) or _is_absent(exc):
        return CorruptStore(f"blob {digest} is missing from {store.describe('cas')}")
    url = store.url_of(store.blob_key(digest))
    if _is_conflict(exc) or isinstance(exc, (S3DownloadFailedError, S3ValidationError)):
        return CorruptStore(f"blob {url} changed on the server during its download")
    return store._error(url, exc)


def _fsync_and_close(out: BinaryIO) -> None:
    try:
        os.fsync(out.fileno())
    finally:
        out.close()


class _VerifiedBlobReader(io.RawIOBase):
    """The bytes of one blob as they stream down, hashed as they pass: at the end, bytes that do not
    hash to the blob's name raise CorruptStore. A broken connection resumes with a ranged GET from
    where it stopped, conditional on the same ETag (the object may not change underneath)."""

    def __init__(self, store, digest: str, start: int = 0, hashed=None) -> None:
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
                raise CorruptStore(f"blob {self.digest} is missing from {self.store.describe('cas')}")
            self.size, self.etag = head["ContentLength"], head["ETag"]
        if self.size is not None and self.position >= self.size:
            return  # nothing left to fetch
        extra = {"IfMatch": self.etag} if self.etag else {}
        if self.position:
            extra["Range"] = f"bytes={self.position}-"
        try:
            response = self.store._call(self.key, self.store.client.get_object, Bucket=self.store.bucket,
                                        Key=self.key, **extra)
        except Exception as exc:
            raise _get_failure(self.store, self.digest, exc) from None
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



class _HashingWriter:
    """The new file a blob is written into, hashed in order as its ranges land. boto3's transfer
    manager writes each piece at its offset (seek, then write) from its one IO thread, in the order
    the ranges arrive; the hash takes a piece once every byte before it is there, and holds a piece
    that came early (the ranges in flight, a few MiB each) until then: each byte is hashed once,
    nothing is read back. It says it can seek, so boto3 writes in place and keeps no in-memory
    ordering queue of its own: with a target that cannot seek, s3transfer 0.19's downloads (a first
    ranged GET whose completion schedules the rest) deadlock on an object of more ranges than
    max_in_memory_download_chunks."""

    def __init__(self, out: BinaryIO, progress: Progress = None) -> None:
        self.out, self.progress = out, progress
        self.hash = hashlib.sha256()
        self.size = 0  # bytes hashed: every byte before this offset has arrived
        self._at = 0
        self._early: dict[int, bytes] = {}  # offset -> a piece that came before the bytes ahead of it

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence != os.SEEK_SET:
            raise OSError(f"{self.out.name}: only absolute seeks")
        self._at = offset
        return offset

    def tell(self) -> int:
        return self._at

    def write(self, data: bytes) -> int:
        at, self._at = self._at, self._at + len(data)
        self.out.seek(at)
        self.out.write(data)
        if self.progress:
            self.progress(len(data))
        if at + len(data) <= self.size:
            return len(data)  # a retried range's bytes, hashed already
        if at > self.size:
            self._early[at] = data
            return len(data)
        self._take(data[self.size - at:])
        while self.size in self._early:
            self._take(self._early.pop(self.size))
        return len(data)

    def _take(self, data: bytes) -> None:
        self.hash.update(data)
        self.size += len(data)


class S3BlobReads:
    """The verified reads of S3Transport's blobs."""

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
            raise CorruptStore(f"blob {digest} is missing from {self.describe('cas')}")
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

    def download_blobs(self, blobs: list[tuple[str, Path]], progress: Progress = None) -> list[int]:
        """Write each (digest, new file) verified while it arrives, and
        durable (fsynced) when this returns; their sizes. One boto3 transfer manager takes every
        blob at once: `concurrency` ranged GETs of `download_chunk` bytes in flight across all of
        them (the next blob's bytes come while one's last ranges arrive), all of one ETag (a HEAD's,
        or from s3transfer 0.19 on the first range's, as boto3's download_file does), each range
        written at its offset and each byte hashed once, in order (_HashingWriter: no second read);
        each finished file is fsynced by a thread of its own while the next one is written. CorruptStore, naming the blob, for one missing, changed
        during its download, or whose bytes do not hash to its name; the caller records nothing then."""
        if not blobs:
            return []
        from boto3.s3.transfer import TransferConfig, create_transfer_manager

        self._call(self.key(""), lambda: None)  # the bucket, once: a missing one is one clear line
        config = TransferConfig(multipart_threshold=self.download_chunk, multipart_chunksize=self.download_chunk,
                                max_concurrency=max(1, self.concurrency), use_threads=True,
                                num_download_attempts=RESUME_ATTEMPTS)
        # io_chunksize stays boto3's 256 KiB: reading a response in larger pieces costs urllib3 more
        # CPU per byte (4 MiB reads took twice the CPU of the transfer itself on 2 cores)
        writers: list[_HashingWriter] = []
        synced = []
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="trtbuild-fsync") as syncer:
            try:
                with create_transfer_manager(self.client, config) as manager:
                    started = []
                    for digest, dest in blobs:
                        writers.append(_HashingWriter(open(dest, "wb"), progress))
                        started.append(manager.download(self.bucket, self.blob_key(digest), writers[-1]))
                    for (digest, _), writer, future in zip(blobs, writers, started):
                        self._downloaded(digest, writer, future)
                        synced.append(syncer.submit(_fsync_and_close, writer.out))
            finally:
                for writer in writers[len(synced):]:
                    writer.out.close()
            for future in synced:
                future.result()
        return [writer.size for writer in writers]

    def _downloaded(self, digest: str, writer: "_HashingWriter", future) -> None:
        """Wait for one blob's download and check it: CorruptStore naming the blob when it is
        missing, changed meanwhile, or its bytes do not hash to `digest`."""
        from s3transfer.exceptions import RetriesExceededError

        url = self.url_of(self.blob_key(digest))
        try:
            future.result()
        except RetriesExceededError:
            raise TrtbuildError(f"{url}: the download broke off {RESUME_ATTEMPTS} times at byte {writer.size}") from None
        except Exception as exc:
            raise _get_failure(self, digest, exc) from None
        actual = writer.hash.hexdigest()
        if actual != digest:
            raise CorruptStore(f"blob {url} is corrupt: its sha256 is {actual}; {self.verify_hint()}")

    def _fetch(self, digest: str, out: BinaryIO, start: int, hashed, progress: Progress = None) -> None:
        """Append the blob's bytes after `start` to `out`, verified: small ones in one stream, large
        ones in parallel ranged GETs of one ETag, hashed and written in order as they arrive."""
        key = self.blob_key(digest)
        head = self._head(key)
        if head is None:
            raise CorruptStore(f"blob {digest} is missing from {self.describe('cas')}")
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
                    window.append(pool.submit(self._get_range, digest, key, etag, offset,
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

    def _get_range(self, digest: str, key: str, etag: str, first: int, last: int) -> list[bytes]:
        """Bytes first..last of the object as it was (If-Match), as the pieces read (joining them
        would copy every byte pulled once more), resuming within the range when the connection breaks."""
        pieces: list[bytes] = []
        got = 0
        failures = 0
        while first + got <= last:
            try:
                body = self._call(key, self.client.get_object, Bucket=self.bucket, Key=key,
                                  Range=f"bytes={first + got}-{last}", IfMatch=etag)["Body"]
            except Exception as exc:
                raise _get_failure(self, digest, exc) from None
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

