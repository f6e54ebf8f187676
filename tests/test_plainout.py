"""On a file or pipe the build's table and lines are written without rich (trtbuild.cli.plainout): the
same bytes rich writes, or rich writes them."""

from __future__ import annotations

import io
import random
import string

import pytest
from rich.console import Console
from rich.table import Table

from trtbuild.cli import plainout
from trtbuild.builder.pipeline import BuildOutcome
from trtbuild.cli.progress import ConsoleReporter
from trtbuild.cli.render import print_build, print_build_plain
from trtbuild.builder.runner import NodeResult
from trtbuild.store.summaries import parse_summary

from summarykit import validation_summary


@pytest.fixture(autouse=True)
def no_forced_terminal(monkeypatch):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)


def rich_table(headers, right, rows, width: int) -> str:
    table = Table()
    for header, justify_right in zip(headers, right):
        table.add_column(header, overflow="fold", justify="right" if justify_right else "left")
    for row in rows:
        table.add_row(*row)
    out = io.StringIO()
    Console(file=out, width=width).print(table)
    return out.getvalue()


def rich_line(text: str, width: int, soft_wrap: bool) -> str:
    out = io.StringIO()
    Console(file=out, width=width).print(text, highlight=False, soft_wrap=soft_wrap)
    return out.getvalue()


def random_text(rng: random.Random) -> str:
    """Words of 1 to 200 characters (longer than a column: folded) with runs of spaces, or nothing."""
    if rng.random() < 0.15:
        return ""
    alphabet = string.ascii_letters + string.digits + "-_.,;()/'`!?=+*%#@$&<>|~\"{}"
    words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, rng.choice([2, 5, 12, 40, 200]))))
             for _ in range(rng.choice([1, 2, 3, 6, 15, 30]))]
    text = "".join(word + rng.choice([" ", " ", "  ", "   "]) for word in words)
    return text.strip() if rng.random() < 0.6 else "  " + text


@pytest.mark.parametrize("seed", range(4))
def test_tables_are_richs_tables(seed):
    rng = random.Random(seed)
    compared = 0
    for _ in range(60):
        columns = rng.randint(1, 10)
        headers = [rng.choice(["artifact", "why / notes", "top-1", "x", random_text(rng)]) for _ in range(columns)]
        right = [rng.random() < 0.4 for _ in range(columns)]
        rows = [[random_text(rng) for _ in range(columns)] for _ in range(rng.randint(0, 12))]
        width = rng.choice([20, 40, 80, 120, 160, 160, 240])
        lines = plainout.table(headers, right, rows, width)
        if lines is None:  # a column narrower than its padding: rich's
            continue
        assert "".join(f"{line}\n" for line in lines) == rich_table(headers, right, rows, width), (headers, rows, width)
        compared += 1
    assert compared > 40


def test_text_rich_would_change_is_left_to_rich():
    for text in ("[bold]x[/]", "a\\[b]", "x :thumbs_up: y", "tab\there", "bell\x07", "cr\r"):
        assert rich_line(text, 80, True) != f"{text}\n"  # each rule stands for a change rich makes
        assert not plainout.as_is(text)
    assert not plainout.line_as_is("abc " * 40)  # rich < 15 drops the space after 80 columns
    assert not plainout.line_as_is("x" * 161, wrap_width=160)  # wrapped
    assert not plainout.as_is("line\nbreak")  # a cell of two lines
    assert plainout.table(["a"], [False], [["caf\u00e9"]], 80) is None  # not ASCII: widths are rich's business
    assert plainout.table(["a"], [False], [["[red]x[/]"]], 80) is None


@pytest.mark.parametrize("text", ["   cached base-tp1:validate (validate, 0.0s) 355dfa7b9d1e",
                                  "needs sm89 GPU (this machine: no GPU); and needs base-tp1-sm89:twin, which was skipped",
                                  "s3://bucket/prefix a: b", "caf\u00e9 \u65e5\u672c " * 40 + "end", "  indented", ""])
def test_lines_are_richs_lines(text):
    assert plainout.line_as_is(text)
    assert rich_line(text, 80, soft_wrap=True) == f"{text}\n"
    if plainout.line_as_is(text, wrap_width=160):
        assert rich_line(text, 160, soft_wrap=False) == f"{text}\n"


def outcome(reason: str, tail_of: str = "fp8-tp1") -> BuildOutcome:
    failed_kl = {"kld_mean": {"value": 0.312, "limit": 0.15, "passed": False}}
    summary = parse_summary("validate", validation_summary(0.312, 0.902, 12.0, gates=failed_kl))
    return BuildOutcome("demo", [
        NodeResult("source", "source", "source", "cached", key="a" * 64, digest="b" * 64, seconds=0.01),
        NodeResult("fp8-tp1:validate", "validate", "validate", "failed", key="c" * 64, digest="d" * 64, seconds=12.5,
                   reason="failed its gates: kld_mean; report: /store/checkouts/dd/report.md",
                   summary=summary),
        NodeResult(tail_of, "checkpoint", "checkpoint", "failed", seconds=3.0, reason="stage process exited with status 1",
                   log_tail=["Traceback (most recent call last):", "ValueError: a value"]),
        NodeResult("fp8-tp1-sm90", "engine", "engine", "skipped", reason=reason),
        NodeResult("base-hf", "hf-checkpoint", "hf-checkpoint", "cached", key="1" * 64, digest="2" * 64, standin=["vllm"],
                   pulled={"store": "s3://bucket/cache"}),
        NodeResult("bf16-tp1", "checkpoint", "checkpoint", "cached", key="3" * 64, digest="4" * 64),
    ], lock_path=None)


@pytest.mark.parametrize("reason, tail_of, plain", [
    ("needs sm90 GPU with tensorrt_llm 1.2.x (this machine: no GPU, no tensorrt_llm); " * 3 + "and more", "fp8-tp1", True),
    ("needs torch: install it with `pip install 'trtbuild[quantize]'`", "fp8-tp1", False),  # markup: rich's
    ("after --until source", "fp8-tp1:twin", False),  # "fp8-tp1:twin: last lines" could hold an emoji code
])
def test_the_build_report_is_richs_or_written_by_rich(reason, tail_of, plain):
    report = outcome(reason, tail_of)
    expected = io.StringIO()
    print_build(report, Console(file=expected, width=plainout.WIDTH))
    written = io.StringIO()
    assert print_build_plain(report, written) == plain
    assert written.getvalue() == (expected.getvalue() if plain else "")


def test_a_terminal_gets_rich():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert not plainout.plain_stream(Terminal())
    assert not print_build_plain(outcome("after --until source"), Terminal())


def test_forced_colour_gets_rich(monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert not plainout.plain_stream(io.StringIO())


@pytest.mark.parametrize("reason", [None, "after --until source", "needs torch: `pip install 'trtbuild[quantize]'`",
                                    "a :warning: here"])
def test_progress_lines_are_richs(reason, capsys):
    result = NodeResult("fp8-tp1:validate", "validate", "validate", "skipped", digest="d" * 64, seconds=1.25,
                        reason=reason)
    with ConsoleReporter() as reporter:  # stderr is pytest's capture: no terminal
        reporter.finished(result)
    plain = capsys.readouterr().err
    out = io.StringIO()
    ConsoleReporter(Console(file=out)).finished(result)
    assert plain == out.getvalue()
