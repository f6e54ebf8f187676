"""The builtin evaluation text's digest, kept in the store's stat cache under the standard library's
fingerprint (computing it imports ~70 modules: 0.1 s of every build)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from trtbuild.store.state import StatCache
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
