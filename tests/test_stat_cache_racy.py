"""The stat cache's racy entries (git's "racy git" problem, Documentation/technical/racy-git.txt):
a file changed within one timestamp tick of the moment it was read can change again in that same
tick without its stat moving, so its digest may be kept only once its last change (mtime or ctime,
whichever is later) lies a whole tick before the read began.

No test here waits for time to pass or compares wall-clock times: the clock the cache reads
(`time.time_ns` as trtbuild.store.state calls it) is set to chosen instants, and the file's mtime
is set with os.utime; its ctime is whatever the kernel gave the last change, read back with stat."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from trtbuild.store import state as state_module
from trtbuild.store.state import COARSE_RACY_NS, RACY_NS, StatCache, settled

SECOND = 10**9


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Clock:
    """What time.time_ns answers while a test runs: `now`, which a test moves."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock(0)
    monkeypatch.setattr(state_module.time, "time_ns", clock)
    return clock


def changed_at(path: Path) -> int:
    st = path.stat()
    return max(st.st_mtime_ns, st.st_ctime_ns)


def test_a_file_read_in_the_tick_of_its_last_change_is_not_kept(tmp_path, clock):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"A" * 4096)
    state = StatCache(tmp_path / "index.db")
    clock.now = changed_at(path)  # the read begins in the tick of the write
    assert state.sha256(path) == sha(b"A" * 4096)
    assert state.known_sha256(path) is None
    clock.now = changed_at(path) + RACY_NS + 1  # a later run: the tick is over, the digest is kept
    assert state.sha256(path) == sha(b"A" * 4096)
    assert state.known_sha256(path) == sha(b"A" * 4096)


def test_a_file_whose_mtime_was_put_back_is_racy_by_its_ctime(tmp_path, clock):
    # cp -p, tar or rsync -t write the bytes, then set an old mtime: the ctime is the write's. A
    # second such write in the same tick (same size, the same old mtime) would leave every field
    # of the stat as it was, so the mtime alone must not settle the entry.
    path = tmp_path / "weights.bin"
    path.write_bytes(b"A" * 4096)
    os.utime(path, ns=(SECOND, SECOND))  # 1970: settled by the mtime alone
    st = path.stat()
    assert st.st_mtime_ns == SECOND and st.st_ctime_ns > SECOND
    state = StatCache(tmp_path / "index.db")
    clock.now = st.st_ctime_ns  # read in the tick of the utime
    assert state.sha256(path) == sha(b"A" * 4096)
    assert state.known_sha256(path) is None


def test_the_clock_is_read_before_the_file_is(tmp_path, clock, monkeypatch):
    # A hash that takes long ends after the tick of the file's last change even when it began
    # inside it: a write landing in that tick after the read began leaves the stat as it was, so
    # the instant that counts is the read's start, not its end.
    path = tmp_path / "weights.bin"
    path.write_bytes(b"A" * 4096)
    clock.now = changed_at(path)
    real = state_module.file_sha256

    def slow_hash(p, progress=None):
        digest = real(p, progress)
        clock.now += 10 * SECOND  # the read took ten seconds
        return digest

    monkeypatch.setattr(state_module, "file_sha256", slow_hash)
    state = StatCache(tmp_path / "index.db")
    assert state.sha256(path) == sha(b"A" * 4096)
    assert state.known_sha256(path) is None


@pytest.mark.parametrize("mtime, ctime, since_change, expected", [
    (5 * SECOND + 1, 5 * SECOND + 7, RACY_NS, False),         # nanosecond stamps: one tick is well under 0.1 s
    (5 * SECOND + 1, 5 * SECOND + 7, RACY_NS + 1, True),
    (5 * SECOND, 5 * SECOND, RACY_NS + 1, False),             # whole seconds (FAT keeps 2 s, HFS+ and ext3 1 s):
    (5 * SECOND, 5 * SECOND, 2 * SECOND - 1, False),          # a write 1.99 s later can still carry the same stamps
    (5 * SECOND, 5 * SECOND, COARSE_RACY_NS + 1, True),
    (5 * SECOND, 9 * SECOND + 3, RACY_NS + 1, True),          # whole-second mtime (set by utime), fine ctime
    (9 * SECOND + 3, 5 * SECOND, RACY_NS, False),             # an mtime later than the ctime (set into the future)
], ids=["ns-in-tick", "ns-settled", "coarse-0.1s", "coarse-1.99s", "coarse-settled", "utime-whole-second",
        "future-mtime"])
def test_settled_counts_from_the_later_stamp_and_the_coarser_tick(mtime, ctime, since_change, expected):
    st = os.stat_result((0o100644, 1, 1, 1, 0, 0, 4096, 0, 0, 0, 0, 0, 0, 0, mtime, ctime))
    assert (st.st_mtime_ns, st.st_ctime_ns) == (mtime, ctime)
    assert settled(st, max(mtime, ctime) + since_change) is expected


def test_a_blob_rehashed_by_verify_is_kept_only_when_settled(tmp_path, clock):
    from trtbuild.store.local import LocalStore

    store = LocalStore(tmp_path / "store")
    source = tmp_path / "w.bin"
    source.write_bytes(b"W" * 1000)
    digest = sha(b"W" * 1000)
    with store.using():
        clock.now = 2**62
        store.put_blob(source, digest)
        blob = store.blob_path(digest)
        store.state.forget(blob)
        clock.now = changed_at(blob)  # `cache verify` reads it in the tick of its last change
        assert store.rehash_blob(digest) == digest
        assert store.state.known_sha256(blob) is None
        clock.now = changed_at(blob) + RACY_NS + 1
        assert store.rehash_blob(digest) == digest
        assert store.state.known_sha256(blob) == digest
