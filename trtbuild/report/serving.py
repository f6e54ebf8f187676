"""The report's "Serving measurements" section: per (GPU or CPU product, workload@concurrency) a table
of every measured target with its accuracy (the validation figures the build matrix shows) beside
its throughput and latency, and per (product, workload) a Pareto plot of accuracy against output
throughput, one panel per concurrency level (figures under different loads never compare).

The figures are the store's bench records of each target's artifact (`trtbuild bench`, or pulled
with the artifact); a stand-in's are never shown. No records: no section."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from trtbuild.errors import TrtbuildError
from trtbuild.report.collect import ReportRow
from trtbuild.store.hash import atomic_write


@dataclass(frozen=True)
class ServingRow:
    """One target measured under one workload at one concurrency level on one product."""

    product: str
    workload: str
    concurrency: int
    target: str
    variant: Optional[str]
    runtime: str
    kld_mean: Optional[float]
    top1_agreement: Optional[float]
    output_tok_s: float
    ttft_p50_ms: float
    e2el_p99_ms: float

    @property
    def load(self) -> str:
        return f"{self.workload}@{self.concurrency}"


def serving_rows(rows: Sequence[ReportRow], digests: dict[str, str], store) -> list[ServingRow]:
    """Every bench record of each row's artifact (`digests`: target -> the lock's digest), newest run
    of each measurement, sorted by product, workload, concurrency, then output throughput (best first)."""
    out = []
    for row in rows:
        digest = digests.get(row.target)
        if digest is None:
            continue
        for record in store.bench_records(digest):
            if record.standin:
                continue
            f = record.figures
            out.append(ServingRow(record.platform.product, record.workload, int(record.workload_spec["concurrency"]),
                                  row.target, row.variant, record.runtime, row.kld_mean, row.top1_agreement,
                                  f.output_token_throughput, f.ttft_ms.p50, f.e2el_ms.p99))
    return sorted(out, key=lambda r: (r.product, r.workload, r.concurrency, -r.output_tok_s, r.target, r.runtime))


def pareto(points: Sequence[ServingRow]) -> set[int]:
    """Indexes of the points no other beats on both axes (lower KL mean, higher output throughput);
    points without a KL mean are on no frontier."""
    placed = [(i, p) for i, p in enumerate(points) if p.kld_mean is not None]
    best = set()
    for i, p in placed:
        dominated = any(q.kld_mean <= p.kld_mean and q.output_tok_s >= p.output_tok_s
                        and (q.kld_mean < p.kld_mean or q.output_tok_s > p.output_tok_s) for j, q in placed if j != i)
        if not dominated:
            best.add(i)
    return best


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def plot_file(product: str, workload: str) -> str:
    return f"serving-{_slug(product)}-{_slug(workload)}.png"


def render_plot(product: str, workload: str, rows: Sequence[ServingRow], path: Path) -> None:
    """KL mean (down is better) against output tokens/s (right is better), one panel per concurrency
    level; Pareto-optimal points filled and joined, the others hollow."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise TrtbuildError("trtbuild report needs matplotlib: pip install 'trtbuild[report]'") from e

    levels = sorted({r.concurrency for r in rows})
    fig = Figure(figsize=(5.5 * len(levels), 4.4), dpi=100, layout="constrained")
    axes = fig.subplots(1, len(levels), squeeze=False)[0]
    fig.suptitle(f"{product}, {workload}: accuracy against output throughput", fontsize=12)
    for ax, level in zip(axes, levels):
        points = [r for r in rows if r.concurrency == level]
        front = pareto(points)
        for i, p in enumerate(points):
            if p.kld_mean is None:
                continue
            on = i in front
            ax.scatter([p.output_tok_s], [p.kld_mean], marker="o", s=70, edgecolors="#1f77b4", linewidths=1.6,
                       facecolors="#1f77b4" if on else "none", zorder=3)
            ax.annotate(f"{p.target} ({p.runtime})", (p.output_tok_s, p.kld_mean), xytext=(6, 5),
                        textcoords="offset points", fontsize=9)
        frontier = sorted((points[i] for i in front), key=lambda p: p.output_tok_s)
        if len(frontier) >= 2:
            ax.plot([p.output_tok_s for p in frontier], [p.kld_mean for p in frontier], "--", color="#1f77b4",
                    linewidth=1, label="Pareto frontier")
            ax.legend(loc="best", fontsize=8)
        ax.set_title(f"concurrency {level}", fontsize=10)
        ax.set_xlabel("output tokens/s (higher is better)")
        ax.set_ylabel("KL divergence, mean (lower is better)")
        ax.grid(True, alpha=0.3)
        ax.margins(x=0.2, y=0.2)
    png = io.BytesIO()
    fig.savefig(png, format="png", metadata={"Software": None})
    atomic_write(Path(path), png.getvalue())


def _fmt(value: Optional[float], digits: str = ".4g") -> str:
    return "-" if value is None else format(value, digits)


def section(rows: Sequence[ServingRow], out_dir: Path, esc) -> str:
    """The section's HTML (tables and plots, the plots written into `out_dir`); "" without rows."""
    if not rows:
        return ""
    parts = ["<h2>Serving measurements</h2>",
             "<p>Each target's serving figures as <code>trtbuild bench</code> measured them, beside the accuracy "
             "the build matrix shows. Filled markers are Pareto-optimal (no other target has both a lower KL mean "
             "and a higher output throughput under the same load).</p>"]
    groups: dict[tuple[str, str, int], list[ServingRow]] = {}
    for r in rows:
        groups.setdefault((r.product, r.workload, r.concurrency), []).append(r)
    head = "".join(f'<th scope="col">{c}</th>' for c in ("variant", "target", "runtime", "KL mean", "top-1",
                                                          "output tok/s", "TTFT p50 (ms)", "E2EL p99 (ms)", "Pareto"))
    for (product, workload, level), members in groups.items():
        front = pareto(members)
        body = "".join(
            f"<tr><td>{esc(r.variant or '-')}</td><td><code>{esc(r.target)}</code></td><td>{esc(r.runtime)}</td>"
            f"<td>{_fmt(r.kld_mean)}</td><td>{'-' if r.top1_agreement is None else f'{r.top1_agreement * 100:.1f}%'}</td>"
            f"<td>{r.output_tok_s:.1f}</td><td>{r.ttft_p50_ms:.1f}</td><td>{r.e2el_p99_ms:.1f}</td>"
            f"<td>{'yes' if i in front else ''}</td></tr>" for i, r in enumerate(members))
        parts.append(f'<h3>{esc(product)}, {esc(workload)}@{level}</h3>\n<div class="table-wrap"><table class="serving">'
                     f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")
    plots: dict[tuple[str, str], list[ServingRow]] = {}
    for r in rows:
        plots.setdefault((r.product, r.workload), []).append(r)
    for (product, workload), members in plots.items():
        name = plot_file(product, workload)
        render_plot(product, workload, members, Path(out_dir) / name)
        alt = (f"Mean KL divergence against output tokens per second on {product} under {workload}, one panel per "
               f"concurrency level, for {', '.join(sorted({m.target for m in members}))}")
        parts.append(f'<figure><img src="{esc(name)}" alt="{esc(alt)}"><figcaption>{esc(product)}, {esc(workload)}: '
                     "KL mean against output throughput; filled markers are Pareto-optimal.</figcaption></figure>")
    return "\n".join(parts)
