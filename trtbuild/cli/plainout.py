"""What rich prints on a file or a pipe, written without rich: the build's progress lines and table.

On a file or pipe rich adds no colour, so what it writes there is text that can be made directly;
importing rich and laying the build's table out with it took a fifth of a no-op build. This
module makes that text only where it is certainly rich's: on a stream that no rich version takes
for a terminal, and for text rich prints as it is (printable, nothing that markup or emoji codes
would change; table cells ASCII, so one character is one column). Anything else is left to rich,
by the callers. The table is rich.table.Table's default (HEAVY_HEAD box, cell padding (0, 1)) with
columns that fold: rich's column widths and word wrap, reproduced. tests/test_plainout.py compares
both on generated tables and lines.
"""

from __future__ import annotations

import builtins
import os
import re
import sys
from typing import Optional, Sequence

# The width the build's output is laid out to on a file or pipe (rich's Console(width=WIDTH)).
WIDTH = 160

# Anything that could be an emoji code (:name:, :name-text:) for rich; none is left as it is.
_EMOJI_CODE = re.compile(r":\S*:")
_WORD = re.compile(r"\s*\S+\s*")  # rich._wrap.re_word: a word with the white space around it
_TRAILING_SPACE = re.compile(r"\s+$")

# rich.box.HEAVY_HEAD: (left, horizontal or cell, divider, right) per line of the table
_TOP = ("┏", "━", "┳", "┓")
_HEAD = ("┃", None, "┃", "┃")
_HEAD_RULE = ("┡", "━", "╇", "┩")
_ROW = ("│", None, "│", "│")
_BOTTOM = ("└", "─", "┴", "┘")


def plain_stream(stream) -> bool:
    """Whether rich writes plain text to `stream`: no terminal, and none forced (FORCE_COLOR,
    TTY_COMPATIBLE, Jupyter, IDLE), a UTF encoding (else rich draws tables in ASCII), not Windows."""
    if sys.platform == "win32" or "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ:
        return False
    if "get_ipython" in vars(builtins) or getattr(sys.stdin, "__module__", "").startswith("idlelib"):
        return False
    try:
        if stream.isatty():
            return False
    except (AttributeError, ValueError):
        return False
    return (getattr(stream, "encoding", None) or "utf-8").lower().startswith("utf")


def as_is(text: str) -> bool:
    """Whether rich prints `text`, given to it as markup, unchanged: no control characters, tabs
    or line breaks, no brackets or backslashes (markup and its escapes), nothing like :emoji:."""
    return text.isprintable() and "[" not in text and "\\" not in text and _EMOJI_CODE.search(text) is None


def line_as_is(text: str, wrap_width: Optional[int] = None) -> bool:
    """Whether console.print(text, soft_wrap=True) writes `text` and a line break; with
    `wrap_width`, console.print(text) on a console that wide. A trailing space is rich's: rich
    before 15 drops it from a line longer than the console."""
    if wrap_width is not None and not (text.isascii() and len(text) <= wrap_width):
        return False
    return as_is(text) and not text.endswith(" ")


def table(headers: Sequence[str], right: Sequence[bool], rows: Sequence[Sequence[str]], width: int) -> Optional[list[str]]:
    """The lines console.print(Table) writes at console width `width`, for a Table() whose columns
    (justified right where `right`) fold; None when a cell is not ASCII printed as it is."""
    cells = [list(headers), *(list(row) for row in rows)]
    if not all(text.isascii() and as_is(text) for row in cells for text in row):
        return None
    return _lay_out(cells, right, width)


def _lay_out(cells: list[list[str]], right: Sequence[bool], width: int) -> Optional[list[str]]:
    """The lines of the table whose first row is its header, at console width `width`; ASCII cells."""
    headers = cells[0]
    columns = [[row[i] for row in cells] for i in range(len(headers))]
    widths = _column_widths(columns, width - (2 + len(headers) - 1))  # the edges and dividers
    if min(widths) < 3:  # narrower than the padding: rare enough to leave to rich
        return None
    lines = [_rule(_TOP, widths)]
    for index, row in enumerate(cells):
        rendered = [_cell(text, w - 2, r) for text, w, r in zip(row, widths, right)]
        height = max(len(c) for c in rendered)
        for c, w in zip(rendered, widths):
            blank = [" " * (w - 2)] * (height - len(c))
            c[:] = blank + c if index == 0 else c + blank  # the header row sits at the bottom
        box = _HEAD if index == 0 else _ROW
        for line in range(height):
            lines.append(box[0] + box[2].join(f" {c[line]} " for c in rendered) + box[3])
        if index == 0:
            lines.append(_rule(_HEAD_RULE, widths))
    lines.append(_rule(_BOTTOM, widths))
    return lines if all(len(line) <= width for line in lines) else None  # rich would crop it


def unfolded_table(headers: Sequence[str], right: Sequence[bool], rows: Sequence[Sequence[str]]) -> Optional[list[str]]:
    """`trtbuild cache ls` on a file or pipe: the table's lines at the width where no cell folds
    (each column as wide as its widest cell), one line per row however wide, so that grep and cut
    see whole records. The cells are text, not markup: printed as they are, so only printable ASCII
    (one character, one column) is asked of them; None otherwise."""
    cells = [list(headers), *(list(row) for row in rows)]
    if not all(text.isascii() and text.isprintable() for row in cells for text in row):
        return None
    columns = [[row[i] for row in cells] for i in range(len(headers))]
    return _lay_out(cells, right, sum(max(map(len, texts)) + 3 for texts in columns) + 1)  # padding and dividers


def _rule(box: tuple, widths: list[int]) -> str:
    return box[0] + box[2].join(box[1] * w for w in widths) + box[3]


# ---- rich's layout (rich.table, rich.measure, rich.padding, rich._ratio, rich._wrap), for ASCII --------------

def _measure(text: str, width: int) -> tuple[int, int]:
    """Measurement.get of the padded cell Padding(text, (0, 1)) at max_width `width`."""
    if width < 1:
        return 0, 0
    if width - 2 < 1:
        inner = (width, width)
    else:
        words = text.split()
        longest_line = len(text)
        low, high = _normalize(max(map(len, words)) if words else longest_line, longest_line, width)
        low, high = min(low + 2, width), min(high + 2, width)
        inner = (low, high)
    return _normalize(*inner, width)


def _normalize(low: int, high: int, width: int) -> tuple[int, int]:
    """normalize().with_maximum(width), (0, 0) when nothing is left, normalize() again."""
    low = max(0, min(max(0, low), high))
    high = max(0, max(low, high))
    low, high = min(low, width), min(high, width)
    if high < 1:
        return 0, 0
    low = max(0, min(max(0, low), high))
    return low, max(0, max(low, high))


def _measure_column(texts: list[str], width: int) -> tuple[int, int]:
    if width < 1:
        return 0, 0
    measured = [_measure(text, width) for text in texts]
    return min(max(m[0] for m in measured), width), min(max(m[1] for m in measured), width)


def _column_widths(columns: list[list[str]], max_width: int) -> list[int]:
    """Table._calculate_column_widths of a table that does not expand, without fixed widths."""
    widths = [_measure_column(texts, max_width)[1] or 1 for texts in columns]
    if sum(widths) > max_width:
        widths = _collapse(widths, max_width)
        if sum(widths) > max_width:  # the last resort: every column shrinks
            widths = _ratio_reduce(sum(widths) - max_width, [1] * len(widths), widths, widths)
        widths = [_measure_column(texts, w)[1] or 0 for texts, w in zip(columns, widths)]
    return widths


def _collapse(widths: list[int], max_width: int) -> list[int]:
    """Table._collapse_widths, every column wrapable: the widest give way first."""
    total = sum(widths)
    excess = total - max_width
    while total and excess > 0:
        widest = max(widths)
        second = max(w if w != widest else 0 for w in widths)
        if not widest - second:
            break
        ratios = [1 if w == widest else 0 for w in widths]
        widths = _ratio_reduce(excess, ratios, [min(excess, widest - second)] * len(widths), widths)
        total = sum(widths)
        excess = total - max_width
    return widths


def _ratio_reduce(total: int, ratios: list[int], maximums: list[int], values: list[int]) -> list[int]:
    ratios = [ratio if maximum else 0 for ratio, maximum in zip(ratios, maximums)]
    total_ratio = sum(ratios)
    if not total_ratio:
        return values[:]
    result = []
    for ratio, maximum, value in zip(ratios, maximums, values):
        if ratio and total_ratio > 0:
            distributed = min(maximum, round(ratio * total / total_ratio))
            result.append(value - distributed)
            total -= distributed
            total_ratio -= ratio
        else:
            result.append(value)
    return result


def _cell(text: str, width: int, right: bool) -> list[str]:
    """Text.wrap with overflow fold at `width`, each line justified (left: padded; right: stripped
    and padded on the left) to exactly `width` columns."""
    breaks = _divide_line(text, width)
    pieces = [text[start:end] for start, end in zip([0, *breaks], [*breaks, len(text)])]
    lines = []
    for piece in pieces:
        if len(piece) > width:  # Text.rstrip_end: trailing white space past the width goes
            space = _TRAILING_SPACE.search(piece)
            if space is not None:
                piece = piece[:len(piece) - min(len(space.group(0)), len(piece) - width)]
        piece = piece.rstrip()[:width].rjust(width) if right else piece[:width].ljust(width)
        lines.append(piece)
    return lines


def _divide_line(text: str, width: int) -> list[int]:
    """rich._wrap.divide_line with fold, one column per character."""
    breaks: list[int] = []
    offset = 0
    word = _WORD.match(text, 0)
    while word is not None:
        start, end = word.span()
        length = len(word.group(0).rstrip())
        if width - offset >= length:
            offset += len(word.group(0))
        elif length > width:  # longer than a line: folded across lines
            chunks = [word.group(0)[i:i + width] for i in range(0, len(word.group(0)), width)]
            for last, chunk in ((i == len(chunks) - 1, c) for i, c in enumerate(chunks)):
                if start:
                    breaks.append(start)
                if last:
                    offset = len(chunk)
                else:
                    start += len(chunk)
        elif offset and start:
            breaks.append(start)
            offset = len(word.group(0))
        word = _WORD.match(text, end)
    return breaks
