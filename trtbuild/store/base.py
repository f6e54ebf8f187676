"""The store interface: everything the runner, checkout, gc, verify and the report ask of a store.

A store holds content-addressed blobs, manifests (an artifact is its manifest's digest), action
records (key -> artifact), refs (recipe/target -> artifact and history), and working areas:
downloads, kept failures, tmp work folders, checkouts and reports. Callers never build paths
inside a store; they ask it. LocalStore (a folder) is the first implementation; an S3 store and a
local store in front of a remote one are the next.
"""

from __future__ import annotations

import abc
import contextlib
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Optional

from trtbuild.errors import TrtbuildError
from trtbuild.store.records import ActionRecord, Digest, Ref
from trtbuild.store.hash import Progress
from trtbuild.store.state import StatCache
from trtbuild.store.tree import Manifest


class CorruptStore(TrtbuildError):
    """Bytes in the store do not match their digest."""


def first_error(exc) -> str:
    """A pydantic ValidationError's first problem, as `loc: msg`."""
    error = exc.errors()[0]
    # A key with a line break (a tampered file) is quoted, so the problem stays one line.
    where = ".".join(str(p) if str(p).isprintable() else repr(p) for p in error["loc"])
    return f"{where or 'record'}: {' '.join(error['msg'].split())}"


def parse_record(key: str, data: bytes, where: str) -> Optional[ActionRecord]:
    """A stored action record's bytes, checked: None for a record of the unversioned layout (it is
    rebuilt and replaced); CorruptStore naming `where` for one that does not parse or names another key.
    One reader for every store, so a local and a remote record are judged alike."""
    import json

    from pydantic import ValidationError

    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested past Python's stack
        raise CorruptStore(f"action record {where} is not valid JSON; run `trtbuild cache verify --repair`") from None
    if isinstance(raw, dict) and raw.get("schema") is None:
        return None  # written before records were versioned
    try:
        record = ActionRecord.model_validate(raw, strict=True)  # a tampered "1" or true is not coerced
    except ValidationError as exc:
        raise CorruptStore(f"action record {where} is malformed ({first_error(exc)}); "
                           "run `trtbuild cache verify --repair`") from None
    if record.key != key:
        raise CorruptStore(f"action record {where} names another key ({record.key})")
    return record


class Store(abc.ABC):
    #: the stat cache the store's own reads go through (and stages hash their inputs with)
    state: StatCache
    #: small requests (is a blob there, a record, a ref) a caller may have in flight at once: on a
    #: remote each one is a round trip, so a re-push of N artifacts waits for one round, not N
    requests_at_once: int = 1

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """How messages name the store: its folder, or its s3:// URL."""

    # ---- life --------------------------------------------------------------------------------------
    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether anything was ever written here (opening a store never creates it)."""

    @abc.abstractmethod
    def create(self) -> None:
        """Make the store's layout; idempotent. Called by the first write (a build), never by a read."""

    # ---- blobs -------------------------------------------------------------------------------------
    @abc.abstractmethod
    def has_blob(self, digest: str) -> bool: ...

    @abc.abstractmethod
    def put_blob(self, source: Path, digest: str, owned: bool = False, link: bool = False) -> None:
        """Store `source`, whose sha256 is `digest`, read-only; `owned`: the file is the store's own
        and the store may take it (it may be gone from `source` afterwards); `link`: it may be
        linked rather than copied, and stays."""

    def blob_file(self, digest: str) -> Optional[Path]:
        """A local file holding the blob's bytes, to read and never change (the local store's own
        cas/ file), or None for a store without local files."""
        return None

    def put_blobs(self, sources: list[tuple[Path, str]], progress=None) -> None:
        """Store several blobs, each (file, sha256) already verified by the caller (push checks its
        local copy first); `progress` (transferbar.ByteProgress) hears the bytes as they go. One at
        a time here; S3Store sends them through one transfer manager, all in flight together."""
        for source, digest in sources:
            size = Path(source).stat().st_size
            self.put_blob(source, digest)
            if progress is not None:
                progress.advance(size)

    @abc.abstractmethod
    def open_blob(self, digest: str) -> BinaryIO: ...

    @abc.abstractmethod
    def verify_blob(self, digest: str, use_state: bool = True) -> None:
        """Raise CorruptStore unless the blob exists and hashes to its name; `use_state`: a blob the
        store wrote and protected, unchanged since (stat cache), is trusted without reading it."""

    @abc.abstractmethod
    def place_blob(self, digest: str, dest: Path, executable: bool) -> None:
        """Put the blob's bytes at `dest`, read-only (a link where possible, else a verified copy)."""

    @abc.abstractmethod
    def iter_blobs(self) -> Iterator[tuple[str, int]]:
        """(name, size) of every stored blob; a name that is not a digest is listed as it is."""

    @abc.abstractmethod
    def rehash_blob(self, name: str, progress: Progress = None) -> str:
        """The blob's sha256 read from its bytes (no stat cache); a verified blob refreshes the cache."""

    @abc.abstractmethod
    def remove_blob(self, name: str) -> None: ...

    @abc.abstractmethod
    def describe_blob(self, name: str) -> str:
        """How messages name a blob (its path, its URL)."""

    # ---- manifests ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def ingest(self, folder: Path, progress: Progress = None, include: Optional[Callable[[str], bool]] = None,
               links_within: Optional[Path] = None, link: bool = False) -> Manifest:
        """Store a folder's files and their manifest; returns the manifest (its digest names the artifact)."""

    @abc.abstractmethod
    def put_manifest(self, manifest: Manifest) -> str: ...

    @abc.abstractmethod
    def has_manifest(self, digest: str) -> bool: ...

    @abc.abstractmethod
    def get_manifest(self, digest: str) -> Manifest:
        """The manifest, checked against its digest (CorruptStore when missing or tampered)."""

    @abc.abstractmethod
    def manifest_digests(self) -> list[str]: ...

    @abc.abstractmethod
    def artifact_problem(self, digest: str) -> Optional[str]:
        """Why the artifact cannot be served as it is (a missing or corrupt manifest or blob), or None."""

    @abc.abstractmethod
    def put_file_blob(self, path: Path) -> Digest:
        """Store one file (a stage's log) as a blob; its digest with its size."""

    @abc.abstractmethod
    def read_manifest_bytes(self, digest: str) -> bytes:
        """The stored bytes as they are, unchecked (for verify)."""

    @abc.abstractmethod
    def remove_manifest(self, digest: str) -> None: ...

    @abc.abstractmethod
    def describe_manifest(self, digest: str) -> str: ...

    # ---- action records ----------------------------------------------------------------------------
    @abc.abstractmethod
    def get_record(self, key: str) -> Optional[ActionRecord]: ...

    @abc.abstractmethod
    def put_record(self, record: ActionRecord, replace: bool = False) -> ActionRecord: ...

    @abc.abstractmethod
    def records(self) -> list[ActionRecord]: ...

    @abc.abstractmethod
    def record_keys(self) -> list[str]:
        """Every key with a record, readable or not (verify names the unreadable ones)."""

    @abc.abstractmethod
    def read_record_bytes(self, key: str) -> bytes:
        """The stored record as it is, unchecked (for verify)."""

    @abc.abstractmethod
    def delete_record(self, key: str) -> None: ...

    @abc.abstractmethod
    def describe_record(self, key: str) -> str: ...

    # ---- refs --------------------------------------------------------------------------------------
    @abc.abstractmethod
    def read_ref(self, recipe: str, target: str) -> Optional[Ref]: ...

    @abc.abstractmethod
    def update_ref(self, recipe: str, target: str, digest: str, key: str) -> None: ...

    @abc.abstractmethod
    def refs(self, malformed: Optional[list] = None) -> Iterator[tuple[str, str, Ref]]:
        """Every ref that parses; one that does not is skipped, or appended to `malformed` as
        (recipe, target, why) for `cache verify` to name."""

    @abc.abstractmethod
    def delete_ref(self, recipe: str, target: str) -> None: ...

    @abc.abstractmethod
    def claim_recipe(self, name: str, identity: str) -> None:
        """Refs under a recipe name belong to one recipe identity; another is refused (InvalidInput)."""

    @abc.abstractmethod
    def check_claim(self, name: str, identity: str) -> None:
        """claim_recipe's refusal, writing nothing: checked before a command writes anything, the
        claim itself made only just before its first ref, so a command stopped earlier leaves none."""

    @abc.abstractmethod
    def describe_ref(self, recipe: str, target: str) -> str: ...

    # ---- lock files that pin artifacts (gc roots) --------------------------------------------------
    @abc.abstractmethod
    def register_lockfile(self, lock_path: Path) -> None: ...

    @abc.abstractmethod
    def registered_lockfiles(self) -> list[Path]: ...

    @abc.abstractmethod
    def embedded_lock_path(self, recipe: str) -> Path:
        """Where the lock file of a recipe without a folder of its own (the embedded demo) lives."""

    # ---- locks -------------------------------------------------------------------------------------
    @abc.abstractmethod
    def using(self, exclusive: bool = False, wait: bool = True) -> contextlib.AbstractContextManager[None]:
        """Builds hold the store shared (and create it); `cache gc` and repair hold it exclusive."""

    @abc.abstractmethod
    def key_lock(self, key: str) -> contextlib.AbstractContextManager:
        """Held while a key is built: a second process wanting the same key waits, then hits."""

    @abc.abstractmethod
    def checkout_lock(self, digest: str) -> contextlib.AbstractContextManager: ...

    # ---- areas -------------------------------------------------------------------------------------
    @abc.abstractmethod
    def tmpdir(self, prefix: str) -> Path:
        """A fresh work folder inside the store (stage outputs there are ingested by link)."""

    @abc.abstractmethod
    def clean_tmp(self, older_than_s: float = 24 * 3600, dry_run: bool = False) -> int:
        """Remove (dry: count) work folders left in tmp for `older_than_s`."""

    @abc.abstractmethod
    def downloads_dir(self) -> Path:
        """Where sources keep what they download (hub files, bucket objects)."""

    @abc.abstractmethod
    def state_db_path(self) -> Optional[Path]:
        """The stat cache's database, for stage processes that hash with it (None: no cache)."""

    @abc.abstractmethod
    def keep_failure(self, key: str, logs: Path) -> Path:
        """Keep a failed run's logs folder under the key (the latest failure only); returns where."""

    @abc.abstractmethod
    def failures(self) -> list[str]:
        """Keys with a kept failure."""

    @abc.abstractmethod
    def remove_failure(self, key: str) -> None: ...

    @abc.abstractmethod
    def checkout_path(self, digest: str) -> Path:
        """Where the artifact's read-only folder is (or will be) materialized."""

    @abc.abstractmethod
    def checkouts(self) -> list[str]:
        """Names of the materialized folders (artifact digests, or leftovers to remove)."""

    @abc.abstractmethod
    def remove_checkout(self, name: str) -> None: ...

    @abc.abstractmethod
    def report_dir(self, recipe: str) -> Path:
        """The default folder of a recipe's report."""
