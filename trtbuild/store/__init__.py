"""The artifact store: content-addressed blobs, manifests, action records and refs (design.md s.1).

One small module per concern, after dvc-data's hashfile/: hash (file digests), state (stat cache),
tree (manifests and tree digests), base (the Store interface), local (the store on a folder),
checkout (materialize), gc (roots, then a sweep), verify (check and repair).

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
