"""The store on a local folder (a Store over a FolderTransport, with its Workspace), and open_store:
which store a URL names.

Opening a store creates nothing; its first write (a build) creates the layout. Every write is a
temp file, fsync, rename; blobs go in before the manifest that names them, the manifest before the
action record, the record before the ref, so a crash at any point leaves only unreferenced leftovers
(which `cache gc` removes), never a record pointing at missing bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from trtbuild.errors import InvalidInput
from trtbuild.store import layout
from trtbuild.store.base import CorruptStore, Store
from trtbuild.store.folder import FolderTransport
from trtbuild.store.location import store_url
from trtbuild.store.storelock import lock_holder
from trtbuild.store.workspace import Workspace

__all__ = ["CorruptStore", "LocalStore", "lock_holder", "open_store"]


class LocalStore(Store):
    """The store in the folder `root` (cache/README.md lists its layout)."""

    transport: FolderTransport

    def __init__(self, root: Path) -> None:
        folder = FolderTransport(root)
        super().__init__(folder, Workspace(folder))
        self.root = folder.root

    # where each object is on disk (tests and tools that look at the files themselves)
    def blob_path(self, digest: str) -> Path:
        return self.root / layout.blob(digest)

    def manifest_path(self, digest: str) -> Path:
        return self.root / layout.manifest(digest)

    def record_path(self, key: str) -> Path:
        return self.root / layout.record(key)

    def ref_path(self, recipe: str, target: str) -> Path:
        return self.root / layout.ref(recipe, target)


def open_store(url: Optional[str] = None, create: bool = False, missing_ok: bool = False) -> Store:
    """--store URL, else $TRTBUILD_CACHE, else ./cache: a folder (LocalStore) or `s3://bucket/prefix`
    (S3Store). Opening creates nothing. `create`: the store may not exist yet; its first write (a
    build, through using()) creates it. `missing_ok`: a missing store reads as an empty one
    (explain). Otherwise a missing store is refused."""
    url = store_url(url)
    if url.startswith("s3://"):
        from trtbuild.store.s3 import S3Store

        store: Store = S3Store(url)
    elif "://" in url:
        raise InvalidInput(f"--store {url}: a store is a local folder or an s3://BUCKET/PREFIX URL")
    else:
        store = LocalStore(Path(url))
    if not (create or missing_ok):
        store.require()
    return store
