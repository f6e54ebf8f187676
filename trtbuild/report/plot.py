"""The report's plot: accuracy against size, one marker per variant, a dashed line per gate limit
(report.png), and the points it is drawn from."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from trtbuild.errors import TrtbuildError
from trtbuild.report.collect import ReportRow
from trtbuild.report.format import GIB, MIB, format_share, limit_relation, sig3
from trtbuild.store.hash import atomic_write
from trtbuild.validate import gates as gate_rules

CHECKPOINT_KINDS = ("checkpoint", "hf-checkpoint")


@dataclass(frozen=True)
class Point:
    """One variant on the plot, from one row of the matrix."""

    variant: str
    row: ReportRow
    size: float  # bytes: on disk, else the estimated weights of all its GPUs
    estimated: bool

    @property
    def kld_mean(self) -> Optional[float]:
        return self.row.kld_mean

    @property
    def top1(self) -> Optional[float]:
        return self.row.top1_agreement

    @property
    def ppl_delta_pct(self) -> Optional[float]:
        return self.row.ppl_delta_pct

    @property
    def failed(self) -> bool:
        return self.row.gate_state == gate_rules.FAILED


def has_metrics(row: ReportRow) -> bool:
    return any(v is not None for v in (row.kld_mean, row.top1_agreement, row.ppl_delta_pct))


def _plot_size(row: ReportRow) -> tuple[Optional[float], bool]:
    """(bytes, estimated): size on disk, else the estimated weights of all its GPUs."""
    if row.size_bytes is not None:
        return float(row.size_bytes), False
    if row.weights_bytes_per_gpu is not None:
        return float(row.weights_bytes_per_gpu) * (row.tp or 1) * (row.pp or 1), True
    return None, False


def plot_points(rows: Sequence[ReportRow]) -> tuple[list[Point], list[tuple[str, str]]]:
    """One point per variant, from its checkpoint row (engines share its numbers), else from its first
    row with metrics. Returns (points, [(target, why left out)])."""
    by_variant: dict[str, ReportRow] = {}
    for row in rows:
        if not has_metrics(row):
            continue
        variant = row.variant or row.target
        current = by_variant.get(variant)
        if current is None or (row.kind in CHECKPOINT_KINDS and current.kind not in CHECKPOINT_KINDS):
            by_variant[variant] = row
    points, left_out = [], []
    for variant, row in by_variant.items():
        size, estimated = _plot_size(row)
        if size is None:
            left_out.append((row.target, "no size"))
            continue
        points.append(Point(variant, row, size, estimated))
    left_out += [(row.target, "no metrics") for row in rows if not has_metrics(row)]
    return points, left_out


def _limit_label(gate: str, label: str, shown: Callable[[float], str]) -> Callable[[float], str]:
    return lambda v: f"{label} {limit_relation(gate, failed=False)} {shown(v)}"


# The plot's panels: (point attribute, gate, y label, title, how a gate limit reads in its label).
PANELS = (
    ("kld_mean", "kld_mean", "KL divergence, mean", "mean KL divergence to the reference (lower is better)",
     _limit_label("kld_mean", "KL mean", sig3)),
    ("top1", "top1_agreement", "top-1 agreement", "top-1 agreement with the reference (higher is better)",
     _limit_label("top1_agreement", "top-1", format_share)),
    ("ppl_delta_pct", "ppl_delta_pct", "perplexity change (%)", "perplexity change against the reference (lower is better)",
     _limit_label("ppl_delta_pct", "ppl change", lambda v: f"{v:g}%")),
)


def gate_limits(points: list[Point], gate: str) -> list[tuple[float, list[str]]]:
    """Each distinct limit of `gate` among the plotted variants, with the variants it applies to
    (variants of different quantization families have different limits)."""
    by_limit: dict[float, list[str]] = {}
    for p in points:
        g = (p.row.gates or {}).get(gate)
        if g is not None:
            by_limit.setdefault(float(g.limit), []).append(p.variant)
    return list(by_limit.items())  # in the variants' order, so a family keeps its line style on every panel


def accuracy_figure(title: str, points: list[Point]):
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

    max_size = max((p.size for p in points), default=GIB)
    unit, scale = ("GiB", GIB) if max_size >= GIB else ("MiB", MIB)

    kls = [p.kld_mean for p in points if p.kld_mean is not None]
    positive = [v for v in kls if v > 0]
    log_kl = len(positive) >= 2 and max(positive) / min(positive) > 100

    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
              "#bcbd22", "#17becf"]
    any_estimated = False
    for i, p in enumerate(points):
        color = colors[i % len(colors)]
        any_estimated |= p.estimated
        label = p.variant + (" (FAILED)" if p.failed else "")
        style = dict(marker="X" if p.failed else "o", s=70, edgecolors=color, linewidths=1.6, zorder=3,
                     facecolors="none" if p.estimated else color)
        for ax, (key, *_rest) in zip(axes, PANELS):
            y = getattr(p, key)
            if y is None:
                continue
            ax.scatter([p.size / scale], [y], **style)
            ax.annotate(label, (p.size / scale, y), xytext=(6, 5), textcoords="offset points", fontsize=9,
                        color="#b00020" if p.failed else "#1d2430")

    limits: dict[str, list[tuple[float, list[str]]]] = {}
    line_styles = ("--", ":", "-.")
    for ax, (_, gate, ylabel, panel_title, reads) in zip(axes, PANELS):
        limits[gate] = gate_limits(points, gate)
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


def render_png(title: str, points: list[Point], path: Path) -> dict:
    fig, info = accuracy_figure(title, points)
    png = io.BytesIO()
    fig.savefig(png, format="png", metadata={"Software": None})
    atomic_write(Path(path), png.getvalue())  # an interrupted report leaves the old file, not half a PNG
    return info
