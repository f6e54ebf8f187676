"""Where a store's bytes live: the small interface the cache layer (store/base.py) writes its policy
against, with a folder backend (store/folder.py) and an S3 backend (store/s3.py).

Objects are named by their path relative to the store (store/layout.py). Small objects (records,
refs, claims, leases, lock files) are read with a tag and written conditionally: `put_if_absent`
(the first writer wins) and `put_if_match` (compare-and-swap on the tag read), which is all the
coordination two writers of one store need (S3's If-None-Match and If-Match). Blobs, large and
content-addressed, have their own calls: an upload, and reads that are verified against the digest.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import BinaryIO, Iterator, NamedTuple, Optional

from trtbuild.store.hash import Progress
from trtbuild.store.state import StatCache

CONFLICT_RETRIES = 64  # conditional writes lost in a row before a write gives up


class Found(NamedTuple):
    data: bytes
    tag: str  # what put_if_match compares: the S3 ETag, a folder object's sha256


class Transport(abc.ABC):
    #: the stat cache blob reads go through (and stages hash their inputs with)
    state: StatCache
    #: small requests a caller may have in flight at once (a remote round trip each)
    requests_at_once: int = 1

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """How messages name the store: its folder, or its s3:// URL."""

    @abc.abstractmethod
    def describe(self, rel: str) -> str:
        """How messages name the object at `rel` (its path, its URL)."""

    def verify_hint(self) -> str:
        """What a message about a damaged object tells the user to run."""
        return "run `trtbuild cache verify`"

    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether anything was ever stored here (opening a store never creates it)."""

    @abc.abstractmethod
    def missing(self) -> str:
        """Why a store that does not exist is refused: one line."""

    @abc.abstractmethod
    def create(self) -> None:
        """Make what the store needs to take writes; idempotent."""

    # ---- small objects -------------------------------------------------------------------------
    @abc.abstractmethod
    def get(self, rel: str) -> Optional[Found]: ...

    @abc.abstractmethod
    def put(self, rel: str, data: bytes) -> None:
        """Replace the object whole (a reader sees the old bytes or the new, never a mix)."""

    @abc.abstractmethod
    def put_if_absent(self, rel: str, data: bytes) -> bool:
        """Write unless the object exists; False when it did (nothing written)."""

    @abc.abstractmethod
    def put_if_match(self, rel: str, data: bytes, tag: str) -> bool:
        """Replace the object if it still has `tag`; False when it changed or went meanwhile."""

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(name relative to the store, size) of every object under `prefix`, sorted."""

    @abc.abstractmethod
    def delete(self, rel: str) -> None:
        """Remove the object; nothing when it is not there."""

    # ---- blobs ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def has_blob(self, digest: str) -> bool: ...

    @abc.abstractmethod
    def put_blob(self, source: Path, digest: str, owned: bool = False, link: bool = False) -> None:
        """Store `source`, whose sha256 is `digest`, read-only; `owned`: the file is the store's own
        and may be taken; `link`: it may be linked rather than copied, and stays."""

    def put_blobs(self, sources: list[tuple[Path, str]], progress=None) -> None:
        """Store several verified (file, sha256); `progress.advance` hears the bytes as they go."""
        for source, digest in sources:
            size = Path(source).stat().st_size
            self.put_blob(source, digest)
            if progress is not None:
                progress.advance(size)

    def blob_file(self, digest: str) -> Optional[Path]:
        """A local file holding the blob's bytes, never to be changed, or None (no local files)."""
        return None

    @abc.abstractmethod
    def open_blob(self, digest: str) -> BinaryIO:
        """A reader of the blob (verified while it streams where the bytes are remote)."""

    @abc.abstractmethod
    def verify_blob(self, digest: str, use_state: bool = True) -> None:
        """Raise CorruptStore unless the blob exists and hashes to its name."""

    @abc.abstractmethod
    def blob_problem(self, digest: str, size: int, label: str) -> Optional[str]:
        """Why the blob cannot be served as the `size`-byte file `label` (missing, another size,
        known corrupt), or None; remote bytes are not downloaded for this."""

    @abc.abstractmethod
    def has(self, rel: str) -> bool: ...

    @abc.abstractmethod
    def place_blob(self, digest: str, dest: Path, executable: bool) -> None:
        """Put the blob's bytes at `dest`, read-only, verified."""

    @abc.abstractmethod
    def iter_blobs(self) -> Iterator[tuple[str, int]]:
        """(name, size) of every stored blob (layout.blob_name)."""

    @abc.abstractmethod
    def rehash_blob(self, name: str, progress: Progress = None) -> str:
        """The blob's sha256 read from its bytes (no stat cache)."""

    @abc.abstractmethod
    def remove_blob(self, name: str) -> None: ...

    @abc.abstractmethod
    def ingest_files(self, folder: Path, progress: Progress = None, include=None,
                     links_within: Optional[Path] = None, link: bool = False):
        """The blobs of `folder`'s files, stored; returns their manifest (not stored)."""
