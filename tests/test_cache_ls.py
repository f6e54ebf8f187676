"""`trtbuild cache ls`: on a file or pipe one record per line, written without rich (issue #23: on a
pipe rich folded the toolchain and stage cells across lines, so `| grep` saw half a record); on a
terminal rich's table as before."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from conftest import key_fields
from trtbuild.store.records import ActionRecord, Digest, Execution
from trtbuild.cli import render
from trtbuild.store.local import LocalStore

CHECKPOINT = dict(key="1" * 64, artifact=Digest(hash="a" * 64, size_bytes=3 * 1024 * 1024), stage="checkpoint:export",
                  stage_version=1, target="base-tp1", recipe="tiny", created="2026-12-01T12:00:00Z",
                  toolchain={"modelopt": "0.47.0", "torch": "2.13.0", "transformers": "4.57.6"}, fields=key_fields(),
                  execution=Execution(seconds=12.5, host="builder"))
ENGINE = dict(key="2" * 64, artifact=Digest(hash="b" * 64, size_bytes=5 * 1024 * 1024), stage="engine", stage_version=1,
              target="fp8-tp1-sm90", recipe="tiny", created="2026-12-03T09:15:00Z",
              toolchain={"tensorrt": "10.13.2+standin", "tensorrt_llm": "1.2.1+standin", "cuda": None}, fields=key_fields(),
              execution=Execution(seconds=301.0, host="builder"))

# Each column as wide as its widest cell, so nothing folds: 160 columns could not hold the engine's row.
PIPED = [
    "┏━━━━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━┳"
    "━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━┓",
    "┃ key          ┃ recipe ┃ target       ┃ stage             ┃ created              ┃ size    ┃ seconds ┃"
    " toolchain                                                                               ┃ digest       ┃",
    "┡━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━╇"
    "━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━┩",
    "│ 111111111111 │ tiny   │ base-tp1     │ checkpoint:export │ 2026-12-01T12:00:00Z │ 3.0 MiB │ 12.5    │"
    " modelopt 0.47.0, torch 2.13.0, transformers 4.57.6                                      │ aaaaaaaaaaaa │",
    "│ 222222222222 │ tiny   │ fp8-tp1-sm90 │ engine            │ 2026-12-03T09:15:00Z │ 5.0 MiB │ 301.0   │"
    " STAND-IN (tensorrt, tensorrt_llm): tensorrt 10.13.2+standin, tensorrt_llm 1.2.1+standin │ bbbbbbbbbbbb │",
    "└──────────────┴────────┴──────────────┴───────────────────┴──────────────────────┴─────────┴─────────┴"
    "─────────────────────────────────────────────────────────────────────────────────────────┴──────────────┘",
    "2 records",
]


@pytest.fixture(autouse=True)
def no_forced_terminal(monkeypatch):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def store(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.create()
    for fields in (CHECKPOINT, ENGINE):
        store.put_record(ActionRecord(**fields))
    return store


def test_cache_ls_on_a_pipe_prints_one_record_per_line(store, run):
    result = run("cache", "ls", "--store", store.root)
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout.splitlines() == PIPED


def test_piped_cache_ls_is_what_rich_prints_on_a_console_wide_enough():
    records = [ActionRecord(**CHECKPOINT), ActionRecord(**ENGINE)]
    written = io.StringIO()
    assert render.print_records_plain(records, written)
    expected = io.StringIO()
    render.print_records(records, Console(file=expected, width=len(PIPED[0])))
    assert written.getvalue() == expected.getvalue()


def test_a_record_rich_must_lay_out_is_still_one_line_on_a_pipe():
    odd = ActionRecord(**{**CHECKPOINT, "toolchain": {"torch": "2.13.0 (caf\u00e9 build) " + "x" * 150}})
    written = io.StringIO()
    assert render.print_records_plain([odd], written)
    lines = written.getvalue().splitlines()
    assert len(lines) == 6 and lines[3].startswith("│ 111111111111 │ tiny   │ base-tp1 ") and "x" * 150 in lines[3]


def test_a_terminal_gets_richs_table():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert not render.print_records_plain([ActionRecord(**CHECKPOINT)], Terminal())
