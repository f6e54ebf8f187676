"""Numbers as the report shows them to people: sizes, shares, changes, counts (a dash when missing)."""

from __future__ import annotations

import math
from typing import Optional

from trtbuild.validate import gates as gate_rules

DASH = "\u2013"  # shown for every missing value
GIB = 1024**3
MIB = 1024**2
KIB = 1024


def sig3(x: float) -> str:
    """3 significant digits without exponents for the values a report holds (1.23, 0.0123, 456)."""
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    mag = math.floor(math.log10(abs(x)))
    if mag >= 3 or mag < -4:
        return f"{x:.3g}"
    decimals = max(0, 2 - mag)
    text = f"{x:.{decimals}f}"
    # Rounding may add a digit (9.996 -> "10.00"): keep 3 significant digits.
    if len(text.replace("-", "").replace(".", "").lstrip("0")) > 3 and decimals > 0:
        text = f"{x:.{decimals - 1}f}"
    return text


def format_size(n: Optional[float]) -> str:
    if n is None:
        return DASH
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.0f} {unit}" if abs(v) >= 100 else f"{sig3(v)} {unit}"
    return f"{int(n)} B"


def format_number(x: Optional[float]) -> str:
    return DASH if x is None else sig3(float(x))


def format_share(x: Optional[float]) -> str:
    """A 0..1 share as a percentage with 3 significant digits, never rounded up to 100%."""
    if x is None:
        return DASH
    pct = float(x) * 100
    text = sig3(pct)
    if pct < 100 and float(text) >= 100:
        text = f"{pct:.2f}" if pct < 99.995 else f"{pct:.3f}"
    return f"{text}%"


def format_pct_delta(x: Optional[float]) -> str:
    if x is None:
        return DASH
    return f"{'+' if x > 0 else ''}{sig3(float(x))}%"


def format_count(n: Optional[int]) -> str:
    return DASH if n is None else f"{int(n):,}"


def gate_value(name: str, x: Optional[float]) -> str:
    if name == "top1_agreement":
        return format_share(x)
    if name == "ppl_delta_pct":
        return format_pct_delta(x)
    return format_number(x)


def limit_relation(name: str, failed: bool) -> str:
    """How a gate's value stands to its limit, for people: `<`/`>` when it failed, `\u2265`/`\u2264` when
    it must be (gates.is_minimum says which)."""
    minimum = gate_rules.is_minimum(name)
    if failed:
        return "<" if minimum else ">"
    return "\u2265" if minimum else "\u2264"
