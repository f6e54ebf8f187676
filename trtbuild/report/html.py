"""The accuracy report: `report.html` (one self-contained page, the build matrix as a table) and
`report.png` (accuracy against size, one marker per variant) side by side in one folder.

The page has inline CSS only: no scripts, no fonts, no external URLs; its one reference is the PNG
next to it, and the plot is also described in text so the page reads without the image."""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

from trtbuild.report.collect import ReportRow
from trtbuild.report.format import (DASH, format_count, format_number, format_pct_delta, format_share, format_size,
                                    gate_value, limit_relation)
from trtbuild.report.plot import PANELS, plot_points, render_png
from trtbuild.store.hash import atomic_write
from trtbuild.validate import gates as gate_rules

# Gate name -> the label people read.
GATE_LABELS = {"kld_mean": "KL mean", "kld_p99": "KL p99", "top1_agreement": "top-1 agreement", "ppl_delta_pct": "ppl \u0394%"}
STATUSES = ("built", "cached", "failed", "skipped", "impossible", "planned")

COLUMNS = ("target", "kind", "gpu", "tp/pp", "status", "size on disk", "est. weights/GPU", "KV tokens",
           "KL mean", "KL p99", "top-1 agreement", "ppl \u0394%", "gates", "measured by", "serves", "reason")
NUMERIC = {"tp/pp", "size on disk", "est. weights/GPU", "KV tokens", "KL mean", "KL p99",
           "top-1 agreement", "ppl \u0394%"}

CSS = """
:root { color-scheme: light; }
body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       margin: 24px; color: #1d2430; background: #fff; }
header { border-bottom: 2px solid #d5dbe5; margin-bottom: 16px; padding-bottom: 8px; }
h1 { font-size: 22px; margin: 0 0 4px 0; }
h2 { font-size: 17px; margin: 24px 0 8px 0; }
.summary { font-size: 15px; margin: 2px 0; }
.statuses { color: #4a5568; margin: 2px 0; }
.count-fail { font-weight: 700; color: #b00020; }
.count-pass { font-weight: 600; color: #1b6e2e; }
.count-none { color: #6b7280; }
.table-wrap { overflow-x: auto; }
table#matrix { border-collapse: collapse; font-variant-numeric: tabular-nums; }
#matrix th, #matrix td { border: 1px solid #d5dbe5; padding: 4px 7px; vertical-align: top; text-align: left; }
#matrix thead th { background: #eef1f6; vertical-align: bottom; }
#matrix td.num { text-align: right; white-space: nowrap; }
#matrix td.target code { font-weight: 600; white-space: nowrap; }
#matrix .sub { color: #6b7280; font-size: 12px; }
#matrix td.missing { color: #9aa3af; }
#matrix td.reason { min-width: 12em; max-width: 28em; color: #374151; }
#matrix tr.row-failed { background: #fff1f2; }
#matrix tr.row-failed td:first-child { border-left: 4px solid #b00020; }
#matrix tr.row-inactive { color: #6b7280; }
.status { display: inline-block; padding: 0 6px; border-radius: 3px; border: 1px solid transparent; white-space: nowrap; }
.status-built, .status-cached { background: #e7f6ec; border-color: #a7d8b5; }
.status-failed { background: #b00020; color: #fff; font-weight: 700; }
.status-skipped, .status-planned { background: #f3f4f6; border-color: #d1d5db; }
.status-impossible { background: #fff7e6; border-color: #f0c36d; font-style: italic; }
.gate-failed { display: inline-block; min-width: 10em; }
.gate-passed { color: #1b6e2e; font-weight: 600; }
.gate-failed { color: #b00020; font-weight: 700; }
.gate-failed .why { display: block; font-weight: 600; }
.gate-none { color: #6b7280; font-style: italic; }
figure { margin: 16px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #d5dbe5; }
figcaption, .plot-notes { color: #374151; max-width: 60em; }
.plot-notes li { margin: 2px 0; }
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


# ---------------------------------------------------------------- gates


def _failed_gates(row: ReportRow) -> list[str]:
    """One line per failing gate: 'KL mean 0.312 > limit 0.2'."""
    return [f"{GATE_LABELS.get(name, name)} {gate_value(name, g.value)} {limit_relation(name, failed=True)} "
            f"limit {gate_value(name, g.limit)}" for name, g in (row.gates or {}).items() if not g.passed]


def _gates_cell(row: ReportRow) -> str:
    """The stored verdict (ReportRow.gate_state): shown, never decided here."""
    state = row.gate_state
    if state == gate_rules.NOT_VALIDATED:
        return '<span class="gate gate-none">not validated</span>'
    if state == gate_rules.PASSED:
        n = len(row.gates or {})
        checked = ", ".join(GATE_LABELS.get(k, k) for k in row.gates or {})
        return (f'<span class="gate gate-passed" title="{_esc(checked)}">passed</span> '
                f'<span class="sub">({n} gate{"s" if n != 1 else ""})</span>')
    whys = "".join(f'<span class="why">{_esc(w)}</span>' for w in _failed_gates(row))
    return f'<span class="gate gate-failed">FAILED{whys}</span>'


# ---------------------------------------------------------------- the table


def _td(text: str, column: str, *, raw: bool = False, extra: str = "") -> str:
    classes = [extra] if extra else []
    if column in NUMERIC:
        classes.append("num")
    if not raw and text == DASH:
        classes.append("missing")
    cls = f' class="{" ".join(classes)}"' if classes else ""
    return f"<td{cls}>{text if raw else _esc(text)}</td>"


def _tp_pp(row: ReportRow) -> str:
    if row.tp is None and row.pp is None:
        return DASH
    return f"{DASH if row.tp is None else row.tp}/{DASH if row.pp is None else row.pp}"


def _target_cell(row: ReportRow) -> str:
    details = []
    if row.variant:
        details.append(f"variant {row.variant}")
    if row.quant:
        details.append(f"quant {row.quant}")
    if row.kv_cache:
        details.append(f"KV {row.kv_cache}")
    sub = '<div class="sub">' + _esc(" \u00b7 ".join(details)) + "</div>" if details else ""
    return f'<td class="target"><code>{_esc(row.target)}</code>{sub}</td>'


def _status_cell(row: ReportRow) -> str:
    text = "FAILED" if row.status == "failed" else row.status
    cls = f"status-{row.status}" if row.status in STATUSES else "status-other"
    return f'<td><span class="status {cls}">{_esc(text)}</span></td>'


def _row_html(row: ReportRow) -> str:
    gate = row.gate_state
    classes = [f"kind-{row.kind}", f"gates-{gate}"]
    if row.status == "failed" or gate == gate_rules.FAILED:
        classes.append("row-failed")
    if row.status in ("skipped", "impossible", "planned"):
        classes.append("row-inactive")
    cells = [
        _target_cell(row),
        _td(row.kind or DASH, "kind"),
        _td(row.gpu or DASH, "gpu"),
        _td(_tp_pp(row), "tp/pp"),
        _status_cell(row),
        _td(format_size(row.size_bytes), "size on disk"),
        _td(format_size(row.weights_bytes_per_gpu), "est. weights/GPU"),
        _td(format_count(row.kv_tokens), "KV tokens"),
        _td(format_number(row.kld_mean), "KL mean"),
        _td(format_number(row.kld_p99), "KL p99"),
        _td(format_share(row.top1_agreement), "top-1 agreement"),
        _td(format_pct_delta(row.ppl_delta_pct), "ppl \u0394%"),
        f"<td>{_gates_cell(row)}</td>",
        _td(row.measured_by or DASH, "measured by"),
        _td(row.serves or DASH, "serves"),
        _td(row.reason or DASH, "reason", extra="reason"),
    ]
    return f'<tr class="{_esc(" ".join(classes))}">' + "".join(cells) + "</tr>"


# ---------------------------------------------------------------- the page


def _summary(rows: list[ReportRow]) -> tuple[str, str]:
    gates = Counter(r.gate_state for r in rows)
    n = len(rows)
    summary = (f'<p class="summary"><strong>{n} target{"s" if n != 1 else ""}</strong>: '
               f'<span class="count-pass">{gates["passed"]} passed gates</span>, '
               f'<span class="count-fail">{gates["failed"]} FAILED gates</span>, '
               f'<span class="count-none">{gates["none"]} not validated</span></p>')
    statuses = Counter(r.status for r in rows)
    order = [s for s in STATUSES if s in statuses] + sorted(s for s in statuses if s not in STATUSES)
    parts = ", ".join(f"{statuses[s]} {'FAILED' if s == 'failed' else s}" for s in order)
    return summary, f'<p class="statuses">Status: {_esc(parts) if parts else "no targets"}</p>'


def _plot_text(points: list, left_out: list[tuple[str, str]], info: dict) -> tuple[str, str, str]:
    """(alt text, caption html, notes html) describing the plot in words."""
    names = ", ".join(p.variant for p in points)
    alt = (f"Plot of mean KL divergence (left), top-1 agreement (middle) and perplexity change (right) "
           f"against size on disk for "
           f"{len(points)} variant{'s' if len(points) != 1 else ''}" + (f": {names}" if names else ": none has metrics"))
    caption = ("Accuracy against size, one marker per variant (engines share their variant's checkpoint "
               "numbers). Left: mean KL divergence to the reference"
               + (" on a log scale" if info["log_kl"] else "") + "; middle: top-1 agreement; right: perplexity "
               "change. "
               "X marks a variant that failed a gate.")
    if info["any_estimated"]:
        caption += " Hollow markers sit at the estimated weights of targets not built yet."
    limits = []
    for _, gate, _, _, reads in PANELS:
        shared = len(info["limits"][gate]) == 1
        for limit, variants in info["limits"][gate]:
            limits.append(reads(limit).replace("top-1", "top-1 agreement") + ("" if shared else f" for {', '.join(variants)}"))
    if limits:
        caption += " Dashed lines: gate limits (" + "; ".join(limits) + ")."
    items = []
    for p in points:
        size = format_size(p.size) + (" (estimated weights)" if p.estimated else " on disk")
        gate = {gate_rules.PASSED: "gates passed", gate_rules.FAILED: "gates FAILED",
                gate_rules.NOT_VALIDATED: "not validated"}[p.row.gate_state]
        items.append(f"<li><code>{_esc(p.variant)}</code>: {_esc(size)}, KL mean {_esc(format_number(p.kld_mean))}, "
                     f"top-1 agreement {_esc(format_share(p.top1))}, "
                     f"perplexity change {_esc(format_pct_delta(p.ppl_delta_pct))}, {_esc(gate)} "
                     f"(from <code>{_esc(p.row.target)}</code>)</li>")
    if not points:
        items.append("<li>No target has accuracy metrics yet: the plot is empty.</li>")
    if left_out:
        missing = ", ".join(f"{t} ({why})" for t, why in left_out)
        items.append(f'<li class="left-out">Left out of the plot: {_esc(missing)}.</li>')
    return alt, _esc(caption), '<ul class="plot-notes">' + "".join(items) + "</ul>"


def render_report(title: str, rows: Sequence[Union[ReportRow, Mapping[str, Any]]], out_dir: Path,
                  serving: Sequence = ()) -> tuple[Path, Path]:
    """Write `report.html` and `report.png` (accuracy against size) into out_dir; return their paths.

    `rows` has one ReportRow (or its fields as a mapping) per target of a recipe's build matrix
    (report.collect.rows); missing values are None and show as a dash."""
    rows = [r if isinstance(r, ReportRow) else ReportRow.model_validate(r) for r in rows]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    html_path, png_path = out_dir / "report.html", out_dir / "report.png"

    points, left_out = plot_points(rows)
    info = render_png(title, points, png_path)
    alt, caption, notes = _plot_text(points, left_out, info)
    summary, statuses = _summary(rows)
    from trtbuild.report.serving import section

    measured = section(serving, out_dir, _esc)  # "Serving measurements" (report/serving.py); "" without records

    head = "".join(f'<th scope="col">{_esc(c)}</th>' for c in COLUMNS)
    body = "\n".join(_row_html(r) for r in rows)
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_esc(title)}</title>
<style>{CSS}</style>
</head>
<body>
<header>
<h1>{_esc(title)}</h1>
{summary}
{statuses}
</header>
<main>
<h2>Build matrix</h2>
<div class="table-wrap">
<table id="matrix">
<thead><tr>{head}</tr></thead>
<tbody>
{body}
</tbody>
</table>
</div>
<h2>Accuracy against size</h2>
<figure>
<img src="{_esc(png_path.name)}" alt="{_esc(alt)}">
<figcaption>{caption}</figcaption>
</figure>
{notes}
{measured}
</main>
</body>
</html>
"""
    atomic_write(html_path, page.encode("utf-8"))
    return html_path, png_path
