"""`cache verify`: re-hash every blob and manifest (no stat cache) and check every record and ref;
`--repair` then drops what is bad and everything that leans on it, so the next build rebuilds it.

A bad blob (corrupt, misnamed) is removed; a manifest that is tampered or names a blob that is
missing or bad is removed, and so are its checkout, the records whose artifact it was and the
refs pointing at it. Nothing good is touched: what is left is a smaller, sound store.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

from trtbuild.store.base import CorruptStore, Store
from trtbuild.store.hash import bytes_sha256, is_digest
from trtbuild.store.tree import BadTree, Manifest


@dataclass
class Scan:
    """What verify found, kept apart per kind of object so that repair can follow the chain."""

    problems: list[str] = field(default_factory=list)  # one line per bad object, for people
    bad_blobs: dict[str, str] = field(default_factory=dict)  # name -> why
    good_manifests: dict[str, Manifest] = field(default_factory=dict)  # whose every blob is present and sound
    bad_manifests: dict[str, str] = field(default_factory=dict)  # digest -> why
    bad_records: dict[str, str] = field(default_factory=dict)  # key -> why
    bad_refs: dict[tuple[str, str], str] = field(default_factory=dict)  # (recipe, target) -> why
    bad_measured: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (area, artifact, id) -> why


def scan(store: Store, progress=None) -> Scan:
    found = Scan()
    blobs = [name for name, _ in store.iter_blobs()]

    def check_blob(name: str) -> Optional[str]:
        if not is_digest(name):
            return f"{store.describe_blob(name)}: not a blob name"
        actual = store.rehash_blob(name, progress)
        if actual != name:
            return f"{store.describe_blob(name)}: corrupt blob (content hashes to {actual})"
        return None

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 2)) as pool:
        for name, problem in zip(blobs, pool.map(check_blob, blobs)):
            if problem:
                found.problems.append(problem)
                found.bad_blobs[name] = problem
    present = set(blobs)

    for digest in store.manifest_digests():
        where = store.describe_manifest(digest)
        data = store.read_manifest_bytes(digest)
        if bytes_sha256(data) != digest:
            found.problems.append(f"{where}: corrupt or tampered manifest (content does not hash to its name)")
            found.bad_manifests[digest] = "corrupt or tampered"
            continue
        try:
            manifest = Manifest.from_bytes(data, where)
        except BadTree as exc:
            found.problems.append(str(exc))
            found.bad_manifests[digest] = "malformed"
            continue
        missing = [e for e in manifest.entries if e.sha256 not in present]
        for entry in missing:
            found.problems.append(f"{where}: names blob {entry.sha256} ({entry.path}), which is missing")
        corrupt = [e for e in manifest.entries if e.sha256 in found.bad_blobs]  # reported with the blob
        if missing or corrupt:
            entry = (missing or corrupt)[0]
            found.bad_manifests[digest] = f"names blob {entry.sha256} ({entry.path}), which is {'missing' if missing else 'corrupt'}"
        else:
            found.good_manifests[digest] = manifest

    for key in store.record_keys():
        where = store.describe_record(key)
        try:
            record = store.get_record(key)
        except CorruptStore as exc:
            found.problems.append(str(exc))
            found.bad_records[key] = "malformed"
            continue
        if record is None:  # of the layout before records were versioned: rebuilt, then replaced
            found.problems.append(f"{where}: action record of an older layout")
            found.bad_records[key] = "of an older layout"
            continue
        digest = record.digest
        if digest in found.good_manifests:
            continue
        if digest in found.bad_manifests:
            found.bad_records[key] = f"its artifact {digest} is bad"  # reported with the manifest
        else:
            found.problems.append(f"{where}: names artifact {digest}, whose manifest is missing")
            found.bad_records[key] = f"its artifact {digest} is missing"

    malformed: list[tuple[str, str, str]] = []
    for recipe, target, ref in store.refs(malformed):
        digest = ref.digest
        if digest not in found.good_manifests:
            if digest not in found.bad_manifests:
                found.problems.append(f"{store.describe_ref(recipe, target)}: points at artifact {digest}, "
                                      "whose manifest is missing or bad")
            found.bad_refs[(recipe, target)] = f"points at artifact {digest}, which is " + (
                "bad" if digest in found.bad_manifests else "missing")
    for recipe, target, why in malformed:
        found.problems.append(f"{store.describe_ref(recipe, target)}: malformed ({why})")
        found.bad_refs[(recipe, target)] = f"malformed ({why})"
    _scan_measured(store, found, present)
    return found


def _scan_measured(store: Store, found: Scan, present: set[str]) -> None:
    """Every bench and warm-start record: it parses, sits where its content files it, and what it names
    is there and sound (the artifact measured; a bench record's raw results blob; a warm-start
    record's cache artifact)."""
    from trtbuild.store.measurements import BenchRecord, WarmStartRecord, parse_model
    from trtbuild.store import layout

    for area, model, what in ((layout.BENCH, BenchRecord, "bench record"),
                              (layout.WARMSTART, WarmStartRecord, "warm-start record")):
        for artifact, record_id, where in store.measured_files(area):
            named = (area, artifact, record_id)
            try:
                record = parse_model(model, store.read_measured(area, artifact, record_id), where, what)
            except CorruptStore as exc:
                found.problems.append(str(exc))
                found.bad_measured[named] = "malformed"
                continue
            filed = (record.artifact.hash, record.id) if area == layout.BENCH else (record.key.artifact,
                                                                                     record.key.digest())
            why = None
            if filed != (artifact, record_id):
                why = f"its content files it as {area}{filed[0]}/{filed[1]}.json"
            elif artifact not in found.good_manifests:
                why = f"names artifact {artifact}, whose manifest is " + (
                    "bad" if artifact in found.bad_manifests else "missing")
            elif area == layout.BENCH and (record.raw.hash not in present or record.raw.hash in found.bad_blobs):
                why = f"names raw results blob {record.raw.hash}, which is " + (
                    "corrupt" if record.raw.hash in found.bad_blobs else "missing")
            elif area == layout.WARMSTART and record.cache.hash not in found.good_manifests:
                why = f"names cache artifact {record.cache.hash}, whose manifest is " + (
                    "bad" if record.cache.hash in found.bad_manifests else "missing")
            if why:
                found.problems.append(f"{where}: {why}")
                found.bad_measured[named] = why


def verify(store: Store, progress=None) -> list[str]:
    """One line per bad object, naming it; an empty list means the store is sound."""
    return scan(store, progress).problems


def repair(store: Store, progress=None) -> tuple[Scan, list[str]]:
    """Scan, then drop every bad object and what leans on it; one line per removal. Holds the store
    exclusively from the scan on: no build may write while its inputs are judged and taken away."""
    with store.using(exclusive=True, wait=False):
        found = scan(store, progress)
        return found, (_drop(store, found) if found.problems else [])


def _drop(store: Store, found: Scan) -> list[str]:
    done: list[str] = []
    for name, why in sorted(found.bad_blobs.items()):
        store.remove_blob(name)
        done.append(f"removed blob {store.describe_blob(name)} ({why.rpartition(': ')[2]})")
    for digest, why in sorted(found.bad_manifests.items()):
        store.remove_manifest(digest)
        done.append(f"removed manifest {store.describe_manifest(digest)} ({why})")
    for name in store.workspace().checkouts() if store.has_workspace else ():
        if name in found.bad_manifests or (is_digest(name) and name not in found.good_manifests):
            store.workspace().remove_checkout(name)
            done.append(f"removed checkout {store.workspace().checkout_path(name)} (its artifact is gone)")
    for key, why in sorted(found.bad_records.items()):
        store.delete_record(key)
        done.append(f"dropped action record {store.describe_record(key)} ({why}): the next build rebuilds it")
    for (recipe, target), why in sorted(found.bad_refs.items()):
        store.delete_ref(recipe, target)
        done.append(f"dropped ref {store.describe_ref(recipe, target)} ({why}): the next build points it again")
    from trtbuild.store import layout

    for (area, artifact, record_id), why in sorted(found.bad_measured.items()):
        if area == layout.BENCH:
            where = store.describe_bench(artifact, record_id)
            store.delete_bench(artifact, record_id)
            done.append(f"dropped bench record {where} ({why}): `trtbuild bench` measures it again")
        else:
            where = store.describe_warmstart(artifact, record_id)
            store.delete_warmstart(artifact, record_id)
            done.append(f"dropped warm-start record {where} ({why}): `trtbuild bench --capture-warm-start` "
                        "captures it again")
    return done
