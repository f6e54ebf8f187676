"""The artifact store: content-addressed blobs, manifests, action records and refs (design.md s.1).

One small module per concern, after dvc-data's hashfile/: hash (file digests), state (stat cache),
tree (manifests and tree digests), local (the store on a folder), checkout (materialize), gc.
"""

from trtbuild.store.local import LocalStore, open_store

__all__ = ["LocalStore", "open_store"]
