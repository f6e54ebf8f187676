"""The artifact store: content-addressed blobs, manifests, action records and refs (design.md s.1).

One small module per concern, after dvc-data's hashfile/: hash (file digests), state (stat cache),
tree (manifests and tree digests), base (the Store interface), local (the store on a folder),
checkout (materialize), gc (roots, then a sweep), verify (check and repair).
"""

from trtbuild.store.base import CorruptStore, Store
from trtbuild.store.local import LocalStore, open_store

__all__ = ["CorruptStore", "LocalStore", "Store", "open_store"]
