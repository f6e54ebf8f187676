"""The accuracy report: `report.html` (one self-contained page, the build matrix as a table) and
`report.png` (accuracy against size, one marker per variant) side by side in one folder.

The page has inline CSS only: no scripts, no fonts, no external URLs; its one reference is the PNG
next to it, and the plot is also described in text so the page reads without the image."""

from __future__ import annotations

import html
import io
import math
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from trtbuild.errors import TrtbuildError
from trtbuild.store.hash import atomic_write

DASH = "\u2013"  # shown for every missing value
GIB = 1024**3
MIB = 1024**2
KIB = 1024

CHECKPOINT_KINDS = ("checkpoint", "hf-checkpoint")
# Gate name -> (label people read, True when the limit is a minimum instead of a maximum).
GATES = {
    "kld_mean": ("KL mean", False),
    "kld_p99": ("KL p99", False),
    "top1_agreement": ("top-1 agreement", True),
    "ppl_delta_pct": ("ppl \u0394%", False),
}
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


# ---------------------------------------------------------------- formatting for people


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _sig3(x: float) -> str:
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
            return f"{v:.0f} {unit}" if abs(v) >= 100 else f"{_sig3(v)} {unit}"
    return f"{int(n)} B"


def format_number(x: Optional[float]) -> str:
    return DASH if x is None else _sig3(float(x))


def format_share(x: Optional[float]) -> str:
    """A 0..1 share as a percentage with 3 significant digits, never rounded up to 100%."""
    if x is None:
        return DASH
    pct = float(x) * 100
    text = _sig3(pct)
    if pct < 100 and float(text) >= 100:
        text = f"{pct:.2f}" if pct < 99.995 else f"{pct:.3f}"
    return f"{text}%"


def format_pct_delta(x: Optional[float]) -> str:
    if x is None:
        return DASH
    return f"{'+' if x > 0 else ''}{_sig3(float(x))}%"


def format_count(n: Optional[int]) -> str:
    return DASH if n is None else f"{int(n):,}"


def _gate_value(name: str, x: Optional[float]) -> str:
    if name == "top1_agreement":
        return format_share(x)
    if name == "ppl_delta_pct":
        return format_pct_delta(x)
    return format_number(x)


# ---------------------------------------------------------------- gates


def _gate_state(row: dict) -> str:
    """'passed', 'failed' or 'none' (not validated)."""
    gates = row.get("gates") or {}
    if not gates:
        return "none"
    return "failed" if any(not g.get("passed") for g in gates.values()) else "passed"


def _failed_gates(row: dict) -> list[str]:
    """One line per failing gate: 'KL mean 0.312 > limit 0.2'."""
    out = []
    for name, g in (row.get("gates") or {}).items():
        if g.get("passed"):
            continue
        label, is_min = GATES.get(name, (name, False))
        sign = "<" if is_min else ">"
        out.append(f"{label} {_gate_value(name, g.get('value'))} {sign} limit {_gate_value(name, g.get('limit'))}")
    return out


def _gates_cell(row: dict) -> str:
    state = _gate_state(row)
    if state == "none":
        return '<span class="gate gate-none">not validated</span>'
    if state == "passed":
        n = len(row["gates"])
        checked = ", ".join(GATES.get(k, (k,))[0] for k in row["gates"])
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


def _tp_pp(row: dict) -> str:
    tp, pp = row.get("tp"), row.get("pp")
    if tp is None and pp is None:
        return DASH
    return f"{DASH if tp is None else tp}/{DASH if pp is None else pp}"


def _target_cell(row: dict) -> str:
    details = []
    if row.get("variant"):
        details.append(f"variant {row['variant']}")
    if row.get("quant"):
        details.append(f"quant {row['quant']}")
    if row.get("kv_cache"):
        details.append(f"KV {row['kv_cache']}")
    sub = '<div class="sub">' + _esc(" \u00b7 ".join(details)) + "</div>" if details else ""
    return f'<td class="target"><code>{_esc(row.get("target", DASH))}</code>{sub}</td>'


def _status_cell(row: dict) -> str:
    status = str(row.get("status") or "unknown")
    text = "FAILED" if status == "failed" else status
    cls = f"status-{status}" if status in STATUSES else "status-other"
    return f'<td><span class="status {cls}">{_esc(text)}</span></td>'


def _row_html(row: dict) -> str:
    status = row.get("status")
    gate = _gate_state(row)
    classes = [f"kind-{row.get('kind')}", f"gates-{gate}"]
    if status == "failed" or gate == "failed":
        classes.append("row-failed")
    if status in ("skipped", "impossible", "planned"):
        classes.append("row-inactive")
    cells = [
        _target_cell(row),
        _td(row.get("kind") or DASH, "kind"),
        _td(row.get("gpu") or DASH, "gpu"),
        _td(_tp_pp(row), "tp/pp"),
        _status_cell(row),
        _td(format_size(row.get("size_bytes")), "size on disk"),
        _td(format_size(row.get("weights_bytes_per_gpu")), "est. weights/GPU"),
        _td(format_count(row.get("kv_tokens")), "KV tokens"),
        _td(format_number(row.get("kld_mean")), "KL mean"),
        _td(format_number(row.get("kld_p99")), "KL p99"),
        _td(format_share(row.get("top1_agreement")), "top-1 agreement"),
        _td(format_pct_delta(row.get("ppl_delta_pct")), "ppl \u0394%"),
        f"<td>{_gates_cell(row)}</td>",
        _td(row.get("measured_by") or DASH, "measured by"),
        _td(row.get("serves") or DASH, "serves"),
        _td(row.get("reason") or DASH, "reason", extra="reason"),
    ]
    return f'<tr class="{_esc(" ".join(classes))}">' + "".join(cells) + "</tr>"


# ---------------------------------------------------------------- the plot's data


def _has_metrics(row: dict) -> bool:
    return any(row.get(k) is not None for k in ("kld_mean", "top1_agreement", "ppl_delta_pct"))


def _plot_size(row: dict) -> tuple[Optional[float], bool]:
    """(bytes, estimated): size on disk, else the estimated weights of all its GPUs."""
    if row.get("size_bytes") is not None:
        return float(row["size_bytes"]), False
    if row.get("weights_bytes_per_gpu") is not None:
        return float(row["weights_bytes_per_gpu"]) * (row.get("tp") or 1) * (row.get("pp") or 1), True
    return None, False


def _plot_points(rows: list[dict]) -> tuple[list[dict], list[tuple[str, str]]]:
    """One point per variant, from its checkpoint row (engines share its numbers), else from its first
    row with metrics. Returns (points, [(target, why left out)])."""
    by_variant: dict[str, dict] = {}
    for row in rows:
        if not _has_metrics(row):
            continue
        variant = str(row.get("variant") or row.get("target"))
        current = by_variant.get(variant)
        if current is None or (row.get("kind") in CHECKPOINT_KINDS and current.get("kind") not in CHECKPOINT_KINDS):
            by_variant[variant] = row
    points, left_out = [], []
    for variant, row in by_variant.items():
        size, estimated = _plot_size(row)
        if size is None:
            left_out.append((str(row.get("target")), "no size"))
            continue
        points.append({"variant": variant, "row": row, "size": size, "estimated": estimated,
                       "kld_mean": row.get("kld_mean"), "top1": row.get("top1_agreement"),
                       "ppl_delta_pct": row.get("ppl_delta_pct"), "failed": _gate_state(row) == "failed"})
    for row in rows:
        if not _has_metrics(row):
            left_out.append((str(row.get("target")), "no metrics"))
    return points, left_out


# The plot's panels: (point key, gate, y label, title, how a gate limit reads in its label).
PANELS = (
    ("kld_mean", "kld_mean", "KL divergence, mean", "mean KL divergence to the reference (lower is better)",
     lambda v: f"KL mean \u2264 {_sig3(v)}"),
    ("top1", "top1_agreement", "top-1 agreement", "top-1 agreement with the reference (higher is better)",
     lambda v: f"top-1 \u2265 {format_share(v)}"),
    ("ppl_delta_pct", "ppl_delta_pct", "perplexity change (%)", "perplexity change against the reference (lower is better)",
     lambda v: f"ppl change \u2264 {v:g}%"),
)


def _gate_limits(points: list[dict], gate: str) -> list[tuple[float, list[str]]]:
    """Each distinct limit of `gate` among the plotted variants, with the variants it applies to
    (variants of different quantization families have different limits)."""
    by_limit: dict[float, list[str]] = {}
    for p in points:
        g = (p["row"].get("gates") or {}).get(gate)
        if g and g.get("limit") is not None:
            by_limit.setdefault(float(g["limit"]), []).append(p["variant"])
    return list(by_limit.items())  # in the variants' order, so a family keeps its line style on every panel


def accuracy_figure(title: str, points: list[dict]):
    """The report's plot as a matplotlib Figure: KL mean, top-1 agreement and perplexity change
    against size, one marker per variant, a dashed line per gate limit. Returns (figure, info)."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import PercentFormatter
    except ImportError as e:
        raise TrtbuildError("trtbuild report needs matplotlib: pip install 'trtbuild[report]'") from e

    fig = Figure(figsize=(16, 4.8), dpi=100, layout="constrained")
    axes = fig.subplots(1, len(PANELS))
    ax_kl, ax_top1, _ = axes
    fig.suptitle(f"{title}: accuracy against size", fontsize=12)

    max_size = max((p["size"] for p in points), default=GIB)
    unit, scale = ("GiB", GIB) if max_size >= GIB else ("MiB", MIB)

    kls = [p["kld_mean"] for p in points if p["kld_mean"] is not None]
    positive = [v for v in kls if v > 0]
    log_kl = len(positive) >= 2 and max(positive) / min(positive) > 100

    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
              "#bcbd22", "#17becf"]
    any_estimated = False
    for i, p in enumerate(points):
        color = colors[i % len(colors)]
        any_estimated |= p["estimated"]
        label = p["variant"] + (" (FAILED)" if p["failed"] else "")
        style = dict(marker="X" if p["failed"] else "o", s=70, edgecolors=color, linewidths=1.6, zorder=3,
                     facecolors="none" if p["estimated"] else color)
        for ax, (key, *_rest) in zip(axes, PANELS):
            y = p[key]
            if y is None:
                continue
            ax.scatter([p["size"] / scale], [y], **style)
            ax.annotate(label, (p["size"] / scale, y), xytext=(6, 5), textcoords="offset points", fontsize=9,
                        color="#b00020" if p["failed"] else "#1d2430")

    limits: dict[str, list[tuple[float, list[str]]]] = {}
    line_styles = ("--", ":", "-.")
    for ax, (_, gate, ylabel, panel_title, reads) in zip(axes, PANELS):
        limits[gate] = _gate_limits(points, gate)
        shared = len(limits[gate]) == 1
        for n, (limit, variants) in enumerate(limits[gate]):
            label = f"gate: {reads(limit)}" + ("" if shared else f" ({', '.join(variants)})")
            ax.axhline(limit, linestyle=line_styles[n % len(line_styles)], color="#b00020", linewidth=1.2, label=label)
        ax.set_ylabel(ylabel)
        ax.set_title(panel_title, fontsize=10)

    if log_kl:
        if len(positive) < len(kls):  # zeros (a reference against itself) stay visible
            ax_kl.set_yscale("symlog", linthresh=min(positive))
        else:
            ax_kl.set_yscale("log")
        ax_kl.set_ylabel("KL divergence, mean (log scale)")
    ax_top1.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=None))
    xlabel = f"size on disk ({unit})" + ("; hollow = estimated weights, not built" if any_estimated else "")
    for ax in axes:
        ax.set_xlabel(xlabel)
        ax.grid(True, which="major", alpha=0.3)
        ax.margins(x=0.15, y=0.15)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
    if not points:
        for ax in axes:
            ax.text(0.5, 0.5, "no target has metrics yet", transform=ax.transAxes, ha="center", va="center",
                    color="#6b7280")
            ax.set_xticks([])
            ax.set_yticks([])
    return fig, {"log_kl": log_kl, "limits": limits, "any_estimated": any_estimated}


def _render_png(title: str, points: list[dict], path: Path) -> dict:
    fig, info = accuracy_figure(title, points)
    png = io.BytesIO()
    fig.savefig(png, format="png", metadata={"Software": None})
    atomic_write(Path(path), png.getvalue())  # an interrupted report leaves the old file, not half a PNG
    return info


# ---------------------------------------------------------------- the page


def _summary(rows: list[dict]) -> tuple[str, str]:
    gates = Counter(_gate_state(r) for r in rows)
    n = len(rows)
    summary = (f'<p class="summary"><strong>{n} target{"s" if n != 1 else ""}</strong>: '
               f'<span class="count-pass">{gates["passed"]} passed gates</span>, '
               f'<span class="count-fail">{gates["failed"]} FAILED gates</span>, '
               f'<span class="count-none">{gates["none"]} not validated</span></p>')
    statuses = Counter(str(r.get("status") or "unknown") for r in rows)
    order = [s for s in STATUSES if s in statuses] + sorted(s for s in statuses if s not in STATUSES)
    parts = ", ".join(f"{statuses[s]} {'FAILED' if s == 'failed' else s}" for s in order)
    return summary, f'<p class="statuses">Status: {_esc(parts) if parts else "no targets"}</p>'


def _plot_text(points: list[dict], left_out: list[tuple[str, str]], info: dict) -> tuple[str, str, str]:
    """(alt text, caption html, notes html) describing the plot in words."""
    names = ", ".join(p["variant"] for p in points)
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
        size = format_size(p["size"]) + (" (estimated weights)" if p["estimated"] else " on disk")
        gate = {"passed": "gates passed", "failed": "gates FAILED", "none": "not validated"}[_gate_state(p["row"])]
        items.append(f"<li><code>{_esc(p['variant'])}</code>: {_esc(size)}, KL mean {_esc(format_number(p['kld_mean']))}, "
                     f"top-1 agreement {_esc(format_share(p['top1']))}, "
                     f"perplexity change {_esc(format_pct_delta(p['ppl_delta_pct']))}, {_esc(gate)} "
                     f"(from <code>{_esc(p['row'].get('target'))}</code>)</li>")
    if not points:
        items.append("<li>No target has accuracy metrics yet: the plot is empty.</li>")
    if left_out:
        missing = ", ".join(f"{t} ({why})" for t, why in left_out)
        items.append(f'<li class="left-out">Left out of the plot: {_esc(missing)}.</li>')
    return alt, _esc(caption), '<ul class="plot-notes">' + "".join(items) + "</ul>"


def render_report(title: str, rows: list[dict], out_dir: Path) -> tuple[Path, Path]:
    """Write `report.html` and `report.png` (accuracy against size) into out_dir; return their paths.

    `rows` has one dict per target of a recipe's build matrix (target, kind, variant, status, sizes,
    accuracy metrics, gates, reason); missing values are None and show as a dash."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    html_path, png_path = out_dir / "report.html", out_dir / "report.png"

    points, left_out = _plot_points(rows)
    info = _render_png(title, points, png_path)
    alt, caption, notes = _plot_text(points, left_out, info)
    summary, statuses = _summary(rows)

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
</main>
</body>
</html>
"""
    atomic_write(html_path, page.encode("utf-8"))
    return html_path, png_path
