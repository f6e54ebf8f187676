"""The builtin evaluation text's digest, kept in the store's stat cache under the standard library's
fingerprint (computing it imports ~70 modules: 0.1 s of every build)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from trtbuild.store.state import RACY_NS, StatCache
from trtbuild.validate import evaltext


def test_the_kept_digest_is_the_texts_and_is_used_until_the_fingerprint_changes(tmp_path, monkeypatch):
    state = StatCache(tmp_path / "index.db")
    real = hashlib.sha256(evaltext.builtin_text().encode("utf-8")).hexdigest()
    assert evaltext.eval_text_digest("builtin", tmp_path, state) == real
    assert evaltext.eval_text_digest("builtin", tmp_path) == real  # no cache: computed

    def not_again() -> str:
        raise AssertionError("the builtin text was read again")

    monkeypatch.setattr(evaltext, "builtin_text", not_again)
    assert evaltext.eval_text_digest("builtin", tmp_path, StatCache(tmp_path / "index.db")) == real

    monkeypatch.setattr(evaltext, "builtin_fingerprint", lambda: "another standard library")
    monkeypatch.setattr(evaltext, "builtin_text", lambda: "other docstrings")
    assert evaltext.eval_text_digest("builtin", tmp_path, state) == hashlib.sha256(b"other docstrings").hexdigest()


def test_a_text_file_is_never_taken_from_the_cache(tmp_path):
    state = StatCache(tmp_path / "index.db")
    text = tmp_path / "eval.txt"
    text.write_text("first version of the text")
    assert evaltext.eval_text_digest("eval.txt", tmp_path, state) == hashlib.sha256(b"first version of the text").hexdigest()
    text.write_text("second version")
    assert evaltext.eval_text_digest("eval.txt", tmp_path, state) == hashlib.sha256(b"second version").hexdigest()


def test_the_fingerprint_follows_the_standard_librarys_files(tmp_path, monkeypatch):
    import sysconfig

    lib = tmp_path / "lib"
    (lib / "pkg").mkdir(parents=True)
    (lib / "a.py").write_text("x = 1\n")
    (lib / "pkg" / "__init__.py").write_text("")
    (lib / "site-packages").mkdir()
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(lib)})
    first = evaltext.builtin_fingerprint()
    (lib / "site-packages" / "other.py").write_text("installed packages are not the standard library\n")
    assert evaltext.builtin_fingerprint() == first
    (lib / "pkg" / "__init__.py").write_text('"""a docstring"""\n')
    assert evaltext.builtin_fingerprint() != first


def fake_stdlib(tmp_path, monkeypatch) -> Path:
    """A standard library of one module, where builtin_fingerprint looks."""
    import sysconfig

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "a.py").write_text('"""first"""\n')
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(lib)})
    return lib


def test_a_rewrite_with_its_mtime_put_back_changes_the_fingerprint(tmp_path, monkeypatch):
    module = fake_stdlib(tmp_path, monkeypatch) / "a.py"
    first = evaltext.builtin_fingerprint()
    st = module.stat()
    probe = tmp_path / "tick"  # the rewrite lands on a later tick of the file system's clock
    probe.touch()
    while probe.stat().st_ctime_ns <= st.st_ctime_ns:
        os.utime(probe)
    module.write_text('"""other"""\n')  # the same size, in place
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (module.stat().st_size, module.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert evaltext.builtin_fingerprint() != first


def test_the_digest_is_kept_only_when_the_standard_library_settled_before_the_process_started(tmp_path, monkeypatch):
    # A module this process imported before a file changed has the old docstrings; a file changed
    # within a tick of the start may change again without its stat moving: neither may be kept.
    module = fake_stdlib(tmp_path, monkeypatch) / "a.py"
    changed = max(module.stat().st_mtime_ns, module.stat().st_ctime_ns)
    reads = []
    monkeypatch.setattr(evaltext, "builtin_text", lambda: reads.append(1) or "docstrings")
    state = StatCache(tmp_path / "index.db")
    expected = hashlib.sha256(b"docstrings").hexdigest()
    for started in (changed - 10**9, changed, changed + RACY_NS):  # changed after the start, or in its tick
        monkeypatch.setattr(evaltext, "_process_started_ns", lambda: started)
        assert evaltext.eval_text_digest("builtin", tmp_path, state) == expected
    assert len(reads) == 3  # none of them kept
    monkeypatch.setattr(evaltext, "_process_started_ns", lambda: None)  # no /proc: not known, not kept
    assert evaltext.eval_text_digest("builtin", tmp_path, state) == expected and len(reads) == 4
    monkeypatch.setattr(evaltext, "_process_started_ns", lambda: changed + RACY_NS + 1)
    assert evaltext.eval_text_digest("builtin", tmp_path, state) == expected and len(reads) == 5  # kept now
    assert evaltext.eval_text_digest("builtin", tmp_path, state) == expected and len(reads) == 5


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="no /proc: the digest is never kept here")
def test_the_process_start_is_no_later_than_now():
    started = evaltext._process_started_ns()
    assert started is not None and started <= time.time_ns()
