"""The artifact store: content-addressed blobs, manifests, action records and refs (design.md s.1).

Three parts, as the remote execution API keeps the action cache and CAS apart from the client's
disk: the transport, where bytes live (transport; folder, or s3 with s3_blobs and s3_client; layout
names every path); the cache layer over it, which writes the policy once for both (base: first
writer wins, divergences, refs by compare-and-swap with their history, recipe claims); and a folder
store's workspace (workspace, storelock: temporary folders, downloads, checkouts, failures, locks).
Beside them, one small module per concern, after dvc-data's hashfile/: errors, hash, state (the stat
cache), tree (manifests), records and summaries (the typed records), ingest (a folder's bytes into
cas/), checkout, transfer (push and pull), verify, gc (the pins it keeps are passed in), lease.

Importing a submodule (`trtbuild.store.hash` for a lock file) must not import the rest: the names
below load on first use.
"""

__all__ = ["CorruptStore", "LocalStore", "Store", "open_store"]


def __getattr__(name: str):
    if name in ("CorruptStore", "Store"):
        from trtbuild.store import base

        return getattr(base, name)
    if name in ("LocalStore", "open_store"):
        from trtbuild.store import local

        return getattr(local, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
