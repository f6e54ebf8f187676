"""Plans as people and CI read them: a rich table, JSON, or a GitHub Actions job matrix."""

from __future__ import annotations

import json
from typing import Iterable

from trtbuild.estimate import format_bytes
from trtbuild.plan import ENGINE, Plan


def plans_json(plans: list[Plan]) -> str:
    """One plan prints as its object; several as a list of them."""
    data = [p.as_json() for p in plans]
    return json.dumps(data[0] if len(data) == 1 else data, indent=2)


def github_matrix(plans: Iterable[Plan]) -> str:
    """`{"include": [...]}` for `strategy.matrix`: one entry per buildable engine target, ordered by
    GPU so that a job per SM (`runs-on: [self-hosted, <gpu>]`) builds its own slice."""
    include = []
    for plan in plans:
        for t in plan.targets:
            if t.kind == ENGINE and t.ok:
                include.append({
                    "recipe": str(plan.loaded.path), "target": t.name, "gpu": t.gpu, "variant": t.variant,
                    "tp": t.tp, "pp": t.pp, "num_gpus": (t.tp or 1) * (t.pp or 1),
                })
    include.sort(key=lambda e: (int(e["gpu"][2:]), e["recipe"]))
    return json.dumps({"include": include})


def print_table(plan: Plan, console) -> None:
    from rich.table import Table

    ok = sum(t.ok for t in plan.targets)
    model = plan.model
    console.print(
        f"[bold]{plan.recipe.name}[/] ({plan.loaded.path}): {model.architecture} {plan.dtype}, "
        f"max_seq_len {plan.max_seq_len:,} (config: {plan.config_origin}); {len(plan.targets)} targets, "
        f"[green]{ok} ok[/], [red]{len(plan.targets) - ok} impossible[/]",
        highlight=False, soft_wrap=True,
    )
    table = Table(show_lines=False)
    for column, style in (("target", "bold"), ("kind", ""), ("gpu", ""), ("status", ""),
                          ("weights/GPU", "right"), ("KV/token", "right"), ("KV tokens", "right"), ("why / notes", "")):
        table.add_column(column, justify="right" if style == "right" else "left",
                         style=style if style == "bold" else None, overflow="fold")
    for t in plan.targets:
        est = t.estimate
        status = "[green]ok[/]" if t.ok else "[red]impossible[/]"
        notes = t.reason or "; ".join(t.warnings)
        if t.ok and t.warnings:
            status = "[yellow]ok[/]"
        table.add_row(
            t.name, t.kind, t.gpu or "-", status,
            format_bytes(est.weights_bytes_per_gpu) if est else "-",
            format_bytes(est.kv_bytes_per_token) if est else "-",
            f"{est.kv_tokens:,}" if est and est.kv_tokens is not None else "-",
            notes or "",
        )
    console.print(table)


def print_build(outcome, console) -> None:
    from collections import Counter

    from rich.table import Table

    from trtbuild.progress import STATUS_STYLE

    table = Table(show_lines=False)
    for column in ("artifact", "stage", "status", "seconds", "digest", "why / notes"):
        table.add_column(column, overflow="fold", justify="right" if column == "seconds" else "left")
    for r in outcome.results:
        style = STATUS_STYLE.get(r.status, "")
        table.add_row(r.id, r.stage or "-", f"[{style}]{r.status}[/]", f"{r.seconds:.1f}",
                      r.digest[:12] if r.digest else "-", r.reason or "")
    console.print(table)
    counts = Counter(r.status for r in outcome.results)
    summary = ", ".join(f"{n} {status}" for status, n in counts.items())
    console.print(f"{outcome.recipe}: {summary}" + (f"; lock: {outcome.lock_path}" if outcome.lock_path and outcome.lock_path.exists() else ""),
                  highlight=False, soft_wrap=True)
    if counts.get("built", 0) == 0 and counts.get("failed", 0) == 0 and counts.get("cached", 0):
        console.print("Nothing was built: every buildable artifact was already in the store.", highlight=False)


def print_explain(explained, console) -> None:
    for ex in explained:
        state = "in store" if ex.in_store else "not in store"
        head = f"[bold]{ex.id}[/] (stage {ex.stage})"
        if ex.key:
            head += f"  key {ex.key}  [{'green' if ex.in_store else 'yellow'}]{state}[/]"
            if ex.digest:
                head += f"  artifact {ex.digest}"
        console.print(head, highlight=False, soft_wrap=True)
        if ex.note:
            console.print(f"    {ex.note}", highlight=False, soft_wrap=True)
        for f in ex.fields:
            value = json.dumps(f.value) if not isinstance(f.value, str) else f.value
            console.print(f"    {f.name:<28} = {value:<20} [dim]{f.origin}[/]", highlight=False, soft_wrap=True)


def print_records(records, console) -> None:
    from rich.table import Table

    table = Table()
    for column in ("key", "recipe", "target", "stage", "created", "size", "seconds", "digest"):
        table.add_column(column, overflow="fold")
    for r in records:
        table.add_row(r["key"][:12], r.get("recipe", "-"), r.get("target", "-"), r.get("stage", "-"), r.get("created", "-"),
                      format_bytes(r.get("size", 0)), f"{r.get('seconds', 0):.1f}", r["digest"][:12])
    console.print(table)
    console.print(f"{len(records)} records", highlight=False)
