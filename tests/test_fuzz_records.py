"""Bad store objects, generated (hypothesis): manifests, action records, refs and lock files with
traversal, absolute paths, backslashes, NUL, duplicates, wrong sizes, oversized fields and wrong
types, written into a real LocalStore and read through the public reads. Each is refused with one
line naming the object; a checkout writes only inside its folder (listed before and after).
"""

from __future__ import annotations

import hashlib
import os
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
    assert not (root / "dest").exists() and not store.workspace().checkout_path(digest).exists()


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


# ---- action records, refs and lock files --------------------------------------------------------

def good_record(store: LocalStore) -> tuple[str, dict]:
    from trtbuild.store.records import ActionRecord, Digest, Execution

    digest = store.manifest_digests()[0]
    manifest = store.get_manifest(digest)
    key = "e" * 64
    record = ActionRecord(key=key, artifact=Digest(hash=digest, size_bytes=manifest.size), stage="test",
                          stage_version=1, target="t", recipe="r", created="2026-01-01T00:00:00Z", fields=key_fields(),
                          execution=Execution(seconds=0, host="test"))
    return key, json.loads(record.model_dump_json(by_alias=True))


def leaves(data, path=()):
    yield path
    if isinstance(data, dict):
        for k, v in data.items():
            yield from leaves(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from leaves(v, path + (i,))


def replaced(data, path, value):
    data = json.loads(json.dumps(data))
    if not path:
        return value
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return data


WRONG = st.sampled_from([None, 7, -1, 10**30, 1.5, True, "text", "\u2603\n", [], [1], {}, {"x": 1}, "x" * 100_000])
GARBAGE = st.one_of(st.binary(max_size=40), st.sampled_from([b"[" * 100_000, b"{\"a\":" * 50_000, b"\xff\xfe{}",
                                                             b"null", b"[]", b"1e999999", b"9" * 5000]))


@st.composite
def json_objects(draw, good: dict):
    """Bytes of a good object with one field wrong, or an unknown key, or not JSON at all."""
    how = draw(st.sampled_from(["field", "field", "unknown", "garbage"]))
    if how == "garbage":
        return draw(GARBAGE)
    if how == "unknown":
        return json.dumps({**good, draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in good)): 1}).encode()
    path = draw(st.sampled_from([p for p in leaves(good) if p]))
    return json.dumps(replaced(good, path, draw(WRONG))).encode()


def same(read, raw) -> bool:
    """What a reader returned is what the file says (a float field holds a JSON integer as a float)."""
    if isinstance(read, float) and type(raw) is int:
        return read == float(raw)
    if isinstance(read, dict) and isinstance(raw, dict):
        return read.keys() == raw.keys() and all(same(read[k], raw[k]) for k in read)
    if isinstance(read, list) and isinstance(raw, list):
        return len(read) == len(raw) and all(same(a, b) for a, b in zip(read, raw))
    return type(read) is type(raw) and read == raw


def one_line(exc: TrtbuildError, names: str) -> None:
    assert len(exc.messages) == 1 and "\n" not in exc.messages[0] and names in exc.messages[0], exc.messages


@FUZZ
@given(data=st.data())
def test_a_bad_action_record_is_refused_naming_it(world, data):
    root, store = world
    key, good = good_record(store)
    content = data.draw(json_objects(good))
    store.record_path(key).parent.mkdir(parents=True, exist_ok=True)
    store.record_path(key).write_bytes(content)
    try:
        record = store.get_record(key)
    except TrtbuildError as exc:
        one_line(exc, str(store.record_path(key)))
    else:  # what the reader let through is a record of this key, or an older layout's (None: rebuilt)
        raw = json.loads(content)
        assert (record is None and isinstance(raw, dict) and raw.get("schema") is None) or (
            record.key == key and same(record.model_dump(by_alias=True, mode="json"), raw)), content[:200]


@FUZZ
@given(data=st.data())
def test_a_bad_ref_is_refused_naming_it(world, data):
    root, store = world
    digest = store.manifest_digests()[0]
    entry = {"digest": digest, "key": "e" * 64, "time": "2026-01-01T00:00:00Z"}
    good = {"schema": 1, "digest": digest, "key": "e" * 64, "history": [entry]}
    store.ref_path("r", "t").parent.mkdir(parents=True, exist_ok=True)
    content = data.draw(json_objects(good))
    store.ref_path("r", "t").write_bytes(content)
    try:
        ref = store.read_ref("r", "t")
    except TrtbuildError as exc:
        one_line(exc, str(store.ref_path("r", "t")))
    else:
        assert same(ref.model_dump(mode="json", by_alias=True), json.loads(content)), content[:200]


def test_a_record_nested_past_the_stack_or_with_coercible_types_is_refused(world):
    root, store = world
    key, good = good_record(store)
    path = store.record_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"[" * 100_000)
    with pytest.raises(TrtbuildError) as caught:
        store.get_record(key)
    assert str(caught.value) == f"action record {path} is not valid JSON; run `trtbuild cache verify --repair`"
    path.write_text(json.dumps({**good, "stage_version": "1"}))
    with pytest.raises(TrtbuildError) as caught:
        store.get_record(key)
    assert str(caught.value) == (f"action record {path} is malformed (stage_version: Input should be a valid integer); "
                                 "run `trtbuild cache verify --repair`")


def test_a_ref_with_a_line_break_in_a_key_is_one_line(world):
    root, store = world
    digest = store.manifest_digests()[0]
    path = store.ref_path("r", "t")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": 1, "digest": digest, "key": "e" * 64, "a\nb": 1}))
    with pytest.raises(TrtbuildError) as caught:
        store.read_ref("r", "t")
    assert str(caught.value) == (f"ref {path} is malformed ('a\\nb': Extra inputs are not permitted); "
                                 "run `trtbuild cache verify --repair`")


def good_lock(digest: str) -> dict:
    target = {"stage": "checkpoint", "key": "e" * 64, "digest": digest, "size": 215}
    return {"schema": 4, "recipe": {"name": "tiny", "digest": "a" * 64}, "validation": "run",
            "source": {"kind": "path", "location": "model", "digest": "5" * 64},
            "toolchain": {"checkpoint:convert": {"safetensors": "0.8.0"}}, "targets": {"base-tp1": target}}


YAML_GARBAGE = st.sampled_from([b"\xff\xfe", b"a: " + b"[" * 5000, b"a: " + b"9" * 5000, b"- 1\n", b"", b"a: !!binary x\n",
                                b"{a: 1, a: 2}\n", b"a: 2001-13-45\n",
                                ("l0: &l0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
                                    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10))).encode()])


@FUZZ
@given(data=st.data())
def test_a_bad_lock_file_is_one_line_naming_it(world, data):
    from trtbuild.lock import lockfile

    root, store = world
    good = good_lock(store.manifest_digests()[0])
    if data.draw(st.booleans()):
        content = data.draw(YAML_GARBAGE)
    else:
        path = data.draw(st.sampled_from([p for p in leaves(good) if p]))
        content = yaml.safe_dump(replaced(good, path, data.draw(WRONG))).encode()
    lock = root / "recipe.lock"
    lock.write_bytes(content)
    try:
        read = lockfile.read(lock)
    except TrtbuildError as exc:
        one_line(exc, str(lock))
        assert exc.exit_code == 2
    else:
        assert same(read.model_dump(mode="json", by_alias=True, exclude_unset=True), yaml.safe_load(content)), content[:300]


@pytest.mark.parametrize("content, problem", [
    (b"\xff\xfe", "not a trtbuild lock file (not UTF-8: invalid start byte at byte 0)"),
    (b"a: 2001-13-45\n", "not a trtbuild lock file (month must be in 1..12)"),
    (b"a: " + b"[" * 100_000 + b"]" * 100_000, "not a trtbuild lock file (nested deeper than 64 levels)"),
    (None, "targets.'a\\nb'.stage: Field required (edited by hand? rebuild without --locked to rewrite it)"),
], ids=["not UTF-8", "month 13", "nested", "line break in a name"])
def test_a_lock_file_python_cannot_read_is_one_line(world, content, problem):
    from trtbuild.lock import lockfile

    root, store = world
    if content is None:
        good = good_lock(store.manifest_digests()[0])
        good["targets"]["a\nb"] = {k: v for k, v in good["targets"]["base-tp1"].items() if k != "stage"}
        content = yaml.safe_dump(good).encode()
    lock = root / "recipe.lock"
    lock.write_bytes(content)
    with pytest.raises(TrtbuildError) as caught:
        lockfile.read(lock)
    assert (str(caught.value), caught.value.exit_code) == (f"{lock}: {problem}", 2)


# ---- .nemo tar archives: traversal, links out, devices; a config that lies about shapes ---------

import io  # noqa: E402
import tarfile  # noqa: E402

from conftest import NEMO_DATA, key_fields  # noqa: E402

MEMBER_NAMES = st.one_of(st.sampled_from(["model_config.yaml", "w/a.pt", "./x", "../x", "/abs", "a/../../x", "..",
                                           "a\\..\\..\\x", "C:x", "d/", "x" * 300, "a\nb", "\u00e9"]),
                         st.lists(st.sampled_from(["a", "..", ".", "d", "\u2603"]), min_size=1, max_size=3).map("/".join))
MEMBER_KINDS = st.sampled_from(["file", "file", "dir", "symlink", "hardlink", "chardev", "blockdev", "fifo"])
LINK_TARGETS = st.sampled_from(["model_config.yaml", "../outside/keep", "/etc/passwd", "a/../../x", "d", "x"])


def tar_of(members: list[tuple[str, str, str]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:") as tar:
        for name, kind, link in members:
            info = tarfile.TarInfo(name)
            data = b""
            if kind == "file":
                data = b"weights"
            info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                         "hardlink": tarfile.LNKTYPE, "chardev": tarfile.CHRTYPE, "blockdev": tarfile.BLKTYPE,
                         "fifo": tarfile.FIFOTYPE}[kind]
            info.linkname = link if kind in ("symlink", "hardlink") else ""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


@FUZZ
@given(members=st.lists(st.tuples(MEMBER_NAMES, MEMBER_KINDS, LINK_TARGETS), min_size=1, max_size=4))
def test_a_nemo_archive_extracts_inside_its_folder_or_is_refused_in_one_line(tmp_path_factory, members):
    from trtbuild.nemo.archive import extract

    root = tmp_path_factory.mktemp("nemo")
    (root / "outside").mkdir()
    (root / "outside" / "keep").write_text("a bystander")
    archive = root / "m.nemo"
    archive.write_bytes(tar_of(members))
    dest = root / "work" / "nemo"
    dest.mkdir(parents=True)
    before = listing(root / "outside")
    try:
        extract(archive, dest)
    except TrtbuildError as exc:
        one_line(exc, str(archive))
        assert exc.exit_code == 2
    else:  # only files, folders and links that stay inside were in it
        assert all(kind in ("file", "dir", "symlink", "hardlink") for _, kind, _ in members), members
        for p in dest.rglob("*"):
            assert Path(os.path.realpath(p)).is_relative_to(os.path.realpath(dest)), p
    assert listing(root / "outside") == before
    assert {p.name for p in root.iterdir()} == {"outside", "m.nemo", "work"}
    assert {p.name for p in (root / "work").iterdir()} == {"nemo"}


@pytest.mark.parametrize("member, problem", [
    (("a\nb", "symlink", "../x"), "member 'a\\nb' links outside the archive ('../x')"),
    (("x" * 300, "file", ""), f"member {'x' * 300!r}: cannot write it (File name too long)"),
    (("a", "hardlink", "b"), "member 'a' hard-links 'b', which the archive does not hold"),
    (("d", "file", ""), "member 'd/a': cannot write it (Not a directory)"),
], ids=["line break", "long name", "dangling hard link", "file, then a folder"])
def test_a_nemo_member_that_cannot_be_written_is_one_line(tmp_path, member, problem):
    from trtbuild.nemo.archive import extract

    archive = tmp_path / "m.nemo"
    members = [member] + ([("d/a", "file", "")] if member[0] == "d" else [])
    archive.write_bytes(tar_of(members))
    (tmp_path / "nemo").mkdir()
    with pytest.raises(TrtbuildError) as caught:
        extract(archive, tmp_path / "nemo")
    assert (str(caught.value), caught.value.exit_code) == (f"{archive}: {problem}", 2)


@pytest.mark.parametrize("field, value, problem", [
    ("hidden_size", 128, "'model.embedding.word_embeddings.weight' has shape [1000, 64], expected [1000, 128] from {config}"),
    ("ffn_hidden_size", 168, "'model.decoder.layers.0.mlp.linear_fc1.weight' has shape [320, 64], expected [336, 64] from {config}"),
    ("num_query_groups", 1, "'model.decoder.layers.0.self_attention.linear_qkv.weight' has shape [128, 64], expected [96, 64] "
                            "from {config}"),
    ("num_layers", 3, "found 2 layers, {config} says num_layers 3"),
])
def test_a_nemo_config_that_lies_about_shapes_fails_in_one_line(tmp_path, field, value, problem):
    """The real tiny NeMo 1 checkpoint with one number of its model_config.yaml changed: the
    conversion checks every tensor's shape against the config (trtbuild/nemo/mapping.py)."""
    pytest.importorskip("torch")
    from trtbuild.nemo.convert import convert

    folder = tmp_path / "lie"
    folder.mkdir()
    with tarfile.open(NEMO_DATA / "nemo1_tiny_llama_gqa_fp32_torch_dist.nemo") as tar:
        tar.extractall(folder, filter="data")
    config = folder / "model_config.yaml"
    config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), field: value}))
    with pytest.raises(TrtbuildError) as caught:
        convert(folder, tmp_path / "out", tmp_path / "work")
    named = "lie/model_config.yaml"  # the config as the conversion names it: beside its checkpoint
    assert (str(caught.value), caught.value.exit_code) == (
        f"{folder / 'model_weights'}: {problem.format(config=named)}", 2)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("obj", ["record", "ref", "manifest"])
def test_cache_verify_names_each_bad_object_in_one_line(world, obj):
    from click.testing import CliRunner

    from trtbuild.cli import cli

    root, store = world
    key = "e" * 64
    if obj == "record":
        path = store.record_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"[" * 100_000)
        line = f"action record {path} is not valid JSON; run `trtbuild cache verify --repair`"
    elif obj == "ref":
        path = store.ref_path("r", "t")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"schema": 1, "digest": store.manifest_digests()[0], "key": key, "a\nb": 1}))
        line = f"{path}: malformed ('a\\nb': Extra inputs are not permitted)"
    else:
        digest = stored_manifest(store, [entry("a\x00b")])
        line = f"{store.manifest_path(digest)}: unsafe path 'a\\x00b' (a NUL byte)"
    def written() -> set:  # the stat cache (index.db) is the store's own, refreshed by every re-hash
        return {item for item in listing(root) if not item[0].startswith("store/index.db")}

    before = written()
    result = CliRunner().invoke(cli, ["cache", "verify", "--store", str(store.root)], catch_exceptions=False)
    assert (result.exit_code, result.stdout) == (1, ""), result.output
    assert result.stderr == (f"{line}\nstore {store.root}: 1 problem(s) found; `trtbuild cache verify --repair` "
                             "drops them\n")
    assert written() == before
