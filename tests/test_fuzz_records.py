"""Bad store objects, generated (hypothesis): manifests, action records, refs and lock files with
traversal, absolute paths, backslashes, NUL, duplicates, wrong sizes, oversized fields and wrong
types, written into a real LocalStore and read through the public reads. Each is refused with one
line naming the object; a checkout writes only inside its folder (listed before and after).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtbuild.errors import TrtbuildError
from trtbuild.keys import canonical_json
from trtbuild.store.checkout import checkout, materialize
from trtbuild.store.local import LocalStore

FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CONTENTS = [b"", b"a", b"bb" * 100, b"\x00\xff" * 7]  # the blobs every store in these tests holds


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def listing(root: Path) -> set[tuple[str, int]]:
    return {(str(p.relative_to(root)), p.lstat().st_size) for p in root.rglob("*")}


@pytest.fixture
def world(tmp_path):
    """A store holding CONTENTS as blobs, beside a destination folder and a folder of bystanders."""
    store = LocalStore(tmp_path / "store")
    seed = tmp_path / "seed"
    seed.mkdir()
    for i, data in enumerate(CONTENTS):
        (seed / f"f{i}").write_bytes(data)
    store.ingest(seed)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep").write_text("a bystander")
    return tmp_path, store


def safe(path) -> bool:
    """The oracle, written apart from trtbuild's: a relative POSIX path of plain, printable parts."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or "\x00" in path:
        return False
    parts = path.split("/")
    return all(p not in ("", ".", "..") and len(p.encode()) <= 255 for p in parts)


PATHS = st.one_of(
    st.sampled_from(["a", "d/b", "../x", "../../outside/keep", "/abs", "d/../../x", "a\\..\\x", "a\x00b", "./a",
                     "d//b", "", "d/", "x" * 300, "d/" + "y" * 256, "\u00e9t\u00e9/\u2603"]),
    st.lists(st.sampled_from(["a", "..", ".", "", "d", "\\", "\x00", "\u00e9"]), min_size=1, max_size=4).map("/".join),
)
FAULTS = {  # one field made wrong, beside the path (itself drawn from safe and unsafe ones)
    "size": st.sampled_from([-1, 10**30, 1, 3, True, 1.5, "3", None]),
    "sha256": st.sampled_from(["upper", "short", 7]),
    "executable": st.sampled_from([0, 1, "yes", None]),
    "extra": st.just("x" * 10_000),
}


@st.composite
def manifests(draw):
    """(entries as JSON, whether the manifest is sound): paths, sizes, digests and types fuzzed."""
    entries, sound = [], True
    for _ in range(draw(st.integers(1, 4))):
        data = draw(st.sampled_from(CONTENTS))
        path = draw(PATHS)
        entry = {"path": path, "size": len(data), "sha256": sha(data), "executable": draw(st.booleans())}
        sound &= safe(path)
        fault = draw(st.sampled_from([None, None, None, *FAULTS]))
        if fault is not None:
            value = draw(FAULTS[fault])
            if fault == "sha256":
                value = {"upper": sha(data).upper(), "short": sha(data)[:63]}.get(value, value)
            entry[fault] = value
            sound &= fault == "size" and type(value) is int and value == len(data)
        entries.append(entry)
    paths = [e["path"] for e in entries]
    if len(set(map(str, paths))) != len(paths):
        sound = False  # duplicates
    names = {str(p) for p in paths}
    if any(str(folder) in names for p in paths for folder in PurePosixPath(str(p)).parents):
        sound = False  # a file that is also another entry's folder
    return entries, sound


@FUZZ
@given(case=manifests(), how=st.sampled_from(["checkout", "materialize"]))
def test_a_manifest_is_checked_out_whole_inside_its_folder_or_refused(world, case, how):
    root, store = world
    entries, sound = case
    data = canonical_json(entries)
    digest = sha(data)
    store.manifest_path(digest).write_bytes(data)
    dest = root / "dest" / digest[:8]
    dest.mkdir(parents=True, exist_ok=True)
    outside_before = {p: listing(root / p) for p in ("outside", "seed")}
    try:
        if how == "checkout":
            made = checkout(store, digest, dest)
        else:
            made = materialize(store, digest)
    except TrtbuildError as exc:
        assert not sound, str(exc)
        assert len(exc.messages) == 1 and "\n" not in exc.messages[0], exc.messages
        assert digest in exc.messages[0] or str(store.manifest_path(digest)) in exc.messages[0], exc.messages
        assert listing(dest) == set()
    else:
        assert sound, entries
        assert listing(made) >= {(e["path"], e["size"]) for e in entries}
        for e in entries:
            assert (made / e["path"]).read_bytes() == next(c for c in CONTENTS if sha(c) == e["sha256"])
    assert {p: listing(root / p) for p in ("outside", "seed")} == outside_before


def stored_manifest(store: LocalStore, entries: list[dict]) -> str:
    data = canonical_json(entries)
    store.manifest_path(sha(data)).write_bytes(data)
    return sha(data)


def entry(path: str, data: bytes = b"a", **fields) -> dict:
    return {"path": path, "size": len(data), "sha256": sha(data), "executable": False, **fields}


@pytest.mark.parametrize("entries, problem", [
    ([entry("a\x00b")], ": unsafe path 'a\\x00b' (a NUL byte)"),
    ([entry("x" * 300)], f": unsafe path {'x' * 80!r}... (a name of 300 bytes; file systems hold 255)"),
    ([entry("a"), entry("a")], " lists 'a' twice"),
    ([entry("d"), entry("d/e/f")], " lists 'd' as a file and as the folder of 'd/e/f'"),
], ids=["NUL", "long name", "twice", "file and folder"])
def test_a_manifest_no_file_system_can_hold_is_refused_naming_it(world, entries, problem):
    root, store = world
    digest = stored_manifest(store, entries)
    for read in (lambda: checkout(store, digest, root / "dest"), lambda: materialize(store, digest)):
        with pytest.raises(TrtbuildError) as caught:
            read()
        assert str(caught.value) == f"{store.manifest_path(digest)}{problem}"
    assert not (root / "dest").exists()


def test_a_manifest_listing_another_size_than_its_blob_is_refused_before_placing(world):
    root, store = world
    digest = stored_manifest(store, [entry("a", b"a"), entry("b", b"", size=5)])
    for read in (lambda: checkout(store, digest, root / "dest"), lambda: materialize(store, digest)):
        with pytest.raises(TrtbuildError) as caught:
            read()
        assert str(caught.value) == f"manifest {digest}: 'b' is listed with 5 bytes, its blob {sha(b'')} has 0"
    assert not (root / "dest").exists() and not store.checkout_path(digest).exists()


def test_a_link_in_the_destination_is_not_followed_out_of_it(world):
    """`pull --dest` into a folder that holds a link to elsewhere: the artifact lands inside."""
    root, store = world
    digest = stored_manifest(store, [entry("d/a", b"bb" * 100)])
    dest = root / "dest"
    dest.mkdir()
    (dest / "d").symlink_to(root / "outside")
    before = listing(root / "outside")
    with pytest.raises(TrtbuildError) as caught:
        checkout(store, digest, dest)
    assert str(caught.value) == f"{dest / 'd'}: a link in the destination (to {root / 'outside'}); remove it first"
    assert listing(root / "outside") == before
