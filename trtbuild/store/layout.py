"""The store's layout: the one module that knows where each thing lives in a store (cache/README.md).

Every name here is relative to the store (a folder's root, an S3 prefix) and written with "/", so a
folder and a bucket hold the same keys. The shared part (what push and pull move, what any store
holds) comes first; the workspace part (a folder store's own work areas, never in a bucket) after.
"""

from __future__ import annotations

from typing import Callable, Optional

# ---- shared: what every store holds ------------------------------------------------------------------
CAS = "cas/sha256/"
MANIFESTS = "manifests/"
AC = "ac/"
REFS = "refs/"
LEASES = "leases/"  # a shared store's push and gc leases (store/lease.py)
PUSHED_LOCKS = "locks/"  # a bucket's published lock files (in a folder, locks/ holds flock files instead)
BENCH = "bench/"  # serving measurements, by the artifact they measure (trtbuild/store/measurements.py)
WARMSTART = "warmstart/"  # captured runtime caches, by the artifact they were captured on
#: the top-level folders of which one shows that something was ever stored
STORED_ROOTS = ("cas/", "manifests/", "ac/", "refs/")

_RECORD, _DIVERGENCE, _CLAIM = ".json", ".divergent.json", ".recipe.json"


def blob(name: str) -> str:
    """A digest's place in cas/, or a misplaced file named by its path under cas/sha256/."""
    return f"{CAS}{name}" if "/" in name else f"{CAS}{name[:2]}/{name}"


def blob_name(rel: str, is_digest) -> str:
    """What iter_blobs calls the object at `rel` (under cas/sha256/): its digest when it sits where
    blob() puts it, else its path under cas/sha256/."""
    path = rel[len(CAS):]
    folder, _, name = path.rpartition("/")
    return name if is_digest(name) and folder == name[:2] else path


def manifest(digest: str) -> str:
    return f"{MANIFESTS}{digest}.json"


def manifest_digest(rel: str) -> Optional[str]:
    """The digest a manifests/ entry is named by, or None for another file."""
    name = rel[len(MANIFESTS):]
    return name[:-5] if name.endswith(".json") and "/" not in name else None


def record(key: str) -> str:
    return f"{AC}{key}{_RECORD}"


def divergence(key: str) -> str:
    """The other artifacts recorded for a key (first writer wins; these are kept beside it)."""
    return f"{AC}{key}{_DIVERGENCE}"


def record_key(rel: str) -> Optional[str]:
    """The action key an ac/ entry records, or None for a divergence list or another file."""
    name = rel[len(AC):]
    if "/" in name or not name.endswith(_RECORD) or name.endswith(_DIVERGENCE):
        return None
    return name[:-len(_RECORD)]


def ref(recipe: str, target: str) -> str:
    return f"{REFS}{recipe}/{target}"


def ref_of(rel: str) -> Optional[tuple[str, str]]:
    """(recipe, target) of a refs/ entry, or None for a claim or another file."""
    parts = rel[len(REFS):].split("/")
    if len(parts) != 2 or parts[1].startswith("."):
        return None
    return parts[0], parts[1]


def claim(recipe: str) -> str:
    """Which recipe owns the refs under a recipe name."""
    return f"{REFS}{recipe}/{_CLAIM}"


def bench_record(artifact: str, measurement: str) -> str:
    return f"{BENCH}{artifact}/{measurement}.json"


def warmstart_record(artifact: str, key_digest: str) -> str:
    return f"{WARMSTART}{artifact}/{key_digest}.json"


def measured_of(rel: str, area: str) -> Optional[tuple[str, str]]:
    """(artifact digest, record id) of a bench/ or warmstart/ entry (`area`), or None for another file."""
    parts = rel[len(area):].split("/")
    if len(parts) != 2 or not parts[1].endswith(".json"):
        return None
    return parts[0], parts[1][:-len(".json")]


def lease(name: str) -> str:
    return f"{LEASES}{name}"


def pushed_lock(recipe: str) -> str:
    """Where push publishes a recipe's newest lock file in a bucket (overwritten by the next push)."""
    return f"{PUSHED_LOCKS}{recipe}.lock"


def kept_pushed_lock(recipe: str, sha256: str) -> str:
    """Where every lock file push published to a bucket stays, by its sha256 (remote gc keeps its pins)."""
    return f"{PUSHED_LOCKS}{recipe}/{sha256}.lock"


# ---- workspace: a folder store's own areas -------------------------------------------------------------
TMP = "tmp"
LOCKS = "locks"
CHECKOUTS = "checkouts"
FAILED = "failed"
DOWNLOADS = "downloads"
REPORTS = "reports"
ROOTS = "roots"
PUBLISHED = "published"
STATE_DB = "index.db"
STATE_FILES = (STATE_DB, "index.db-wal", "index.db-shm")
STORE_LOCK = f"{LOCKS}/store.lock"
# cas/ comes last: a folder store exists once it has cas/, so a build that sees a store another
# process is creating finds locks/ and the rest already there.
FOLDER_LAYOUT = ("manifests", "ac", "refs", TMP, LOCKS, CHECKOUTS, "cas/sha256")


def _path_of(template: str) -> Callable[[str], str]:
    """The path function of one area: `template` with its one argument put in ("{:.32}": its
    first 32 characters)."""
    def path(name: str) -> str:
        return template.format(name)

    return path


key_lock = _path_of(LOCKS + "/{}.lock")  # a build key's lock
checkout_lock = _path_of(LOCKS + "/checkout-{}.lock")  # by the artifact's digest
object_lock = _path_of(LOCKS + "/object-{:.32}.lock")  # a folder store's conditional write, by its name's sha256
checkout = _path_of(CHECKOUTS + "/{}")
failure = _path_of(FAILED + "/{}")  # a failed build key's log
report = _path_of(REPORTS + "/{}")  # a recipe's reports
root = _path_of(ROOTS + "/{:.32}.json")  # a registered lock file (a gc root), by the sha256 of its absolute path
published_lock = _path_of(PUBLISHED + "/{}.lock")  # where push publishes a recipe's newest lock into a folder store
embedded_lock = _path_of("{}.lock")  # the lock file of a recipe without a folder of its own (the embedded demo)


def is_workspace_leftover(parts: tuple[str, ...]) -> bool:
    """Whether a file at `parts` (relative to the root) is one that opening and locking a store
    writes (lock files, the stat cache, recipe claims): a store holding only these holds nothing."""
    if parts[0] == LOCKS or (len(parts) == 1 and parts[0] in STATE_FILES):
        return True
    return len(parts) == 3 and parts[0] == REFS.rstrip("/") and parts[2] == _CLAIM
