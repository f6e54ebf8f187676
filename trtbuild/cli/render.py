"""Plans as people and CI read them: a rich table, JSON, or a GitHub Actions job matrix."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterable, Optional

from trtbuild.plan.estimate import build_memory_needs, format_bytes
from trtbuild.plan.expand import ENGINE, Plan
from trtbuild.store.records import format_utc
from trtbuild.store.summaries import ValidationSummary


def plans_json(plans: list[Plan]) -> str:
    """One plan prints as its object; several as a list of them."""
    data = [p.as_json() for p in plans]
    return json.dumps(data[0] if len(data) == 1 else data, indent=2)


def github_matrix(plans: Iterable[Plan], embedded: bool = False) -> str:
    """`{"include": [...]}` for `strategy.matrix`: one entry per buildable engine target, ordered by
    GPU so that a job per SM (`runs-on: [self-hosted, <gpu>]`) builds its own slice. `embedded`:
    the plans are of the package's embedded recipe, whose entries say `"recipe": ""`."""
    include = []
    for plan in plans:
        recipe = "" if embedded else matrix_recipe_path(plan.loaded.path)
        for t in plan.targets:
            if t.kind == ENGINE and t.ok:
                include.append({
                    "recipe": recipe, "target": t.name, "gpu": t.gpu, "variant": t.variant,
                    "tp": t.tp, "pp": t.pp, "num_gpus": (t.tp or 1) * (t.pp or 1),
                })
    include.sort(key=lambda e: (int(e["gpu"][2:]), e["recipe"]))
    return json.dumps({"include": include})


def matrix_recipe_path(path: Path, cwd: Optional[Path] = None) -> str:
    """A recipe as a CI job on another checkout of the same repository can name it: relative to
    the current folder when it is inside it (POSIX separators), else the path as given."""
    cwd = (cwd or Path.cwd()).resolve()
    try:
        return path.resolve().relative_to(cwd).as_posix()
    except ValueError:
        return str(path)


def print_table(plan: Plan, console) -> None:
    from rich.markup import escape
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
    for column, style in (("target", "bold"), ("kind", ""), ("gpu", ""), ("status", ""), ("weights/GPU", "right"),
                          ("KV/token", "right"), ("KV tokens", "right"), ("estimated on", ""), ("build host", ""),
                          ("why / notes", "")):
        table.add_column(column, justify="right" if style == "right" else "left",
                         style=style if style == "bold" else None, overflow="fold")
    for t in plan.targets:
        est = t.estimate
        status = "[green]ok[/]" if t.ok else "[red]impossible[/]"
        notes = t.reason or "; ".join(([f"serves: {t.serves_line()}"] if t.serves is not None else []) + list(t.warnings))
        if t.ok and t.warnings:
            status = "[yellow]ok[/]"
        table.add_row(
            t.name, t.kind, t.gpu or "-", status,
            format_bytes(est.weights_bytes_per_gpu) if est else "-",
            format_bytes(est.kv_bytes_per_token) if est else "-",
            f"{est.kv_tokens:,}" if est and est.kv_tokens is not None else "-",
            (est.gpu_label() if est else None) or "-",
            build_memory_needs(plan, t).label() if t.kind == ENGINE else "-",
            escape(notes or ""),
        )
    console.print(table)
    for t in plan.targets:  # whole, where the table's column folds them
        if not t.ok:
            console.print(f"- {t.name}: {escape(t.reason or '')}", highlight=False, soft_wrap=True)
        elif t.serves is not None:
            console.print(f"- {t.name} serves: {escape(t.serves_line())}", highlight=False, soft_wrap=True)


# Validation metrics the build table shows: (summary["metrics"] name, column, format).
ACCURACY_COLUMNS = (
    ("kld_mean", "KL mean", lambda v: f"{v:.3g}"),
    ("top1_agreement", "top-1", lambda v: f"{v:.1%}"),
    ("ppl_delta_pct", "ppl change", lambda v: f"{v:+.2f}%"),
)


def _accuracy_cells(result) -> list[tuple[str, str]]:
    """A validation's headline metrics (red where its gate failed); empty for other nodes."""
    summary = result.summary
    if not isinstance(summary, ValidationSummary):
        return [("", "")] * len(ACCURACY_COLUMNS)
    cells = []
    for name, _, fmt in ACCURACY_COLUMNS:
        value = getattr(summary.metrics, name)
        failed = name in summary.gates and not summary.gates[name].passed  # the stored verdict
        cells.append((f"[red]{fmt(value)}[/]" if failed else fmt(value), fmt(value)))
    return cells


BUILD_COLUMNS = ("artifact", "stage", "status", "seconds", "digest", *(c for _, c, _ in ACCURACY_COLUMNS), "why / notes")
RIGHT_COLUMNS = {"seconds", *(column for _, column, _ in ACCURACY_COLUMNS)}


def _escape(text: str) -> str:
    """rich.markup.escape, imported only for text it changes (brackets, backslashes)."""
    if "[" not in text and "\\" not in text:
        return text
    from rich.markup import escape

    return escape(text)


def _ref_note(result) -> str:
    """Whose figures moved a validated node's ref (the runtime's first), or why it did not move."""
    if result.ref:
        return f"held back: {result.ref}"
    if not result.decided_by:
        return ""
    return "published: gates passed on " + ", ".join(f"{d['runner']} ({d['device']})" for d in result.decided_by)


def _build_report(outcome) -> tuple[list[list[tuple[str, str]]], list[tuple[str, str, bool]]]:
    """The build table's rows and the lines under it: each cell (markup, plain text), each line
    (markup, plain text, soft wrap). Rich prints the markup as the plain text where plainout.as_is
    holds for it."""
    from collections import Counter

    from trtbuild.cli.progress import STATUS_STYLE

    rows = []
    for r in outcome.results:
        note = "; ".join(part for part in (r.reason or r.note or (f"pulled from {r.pulled['store']}" if r.pulled else ""),
                                           _ref_note(r)) if part)
        rows.append([_same(r.id), _same(r.stage or "-"), (f"[{STATUS_STYLE.get(r.status, '')}]{r.status}[/]", f"{r.status}"),
                     _same(f"{r.seconds:.1f}"), _same(r.digest[:12] if r.digest else "-"), *_accuracy_cells(r),
                     (_escape(note), note)])
    lines = []
    for r in outcome.results:
        if r.log_tail:  # a failed stage's last words, so nobody has to open the log to see them
            lines.append((*_same(f"{r.id}: last lines of its log:"), True))
            lines.extend((f"    {_escape(line)}", f"    {line}", True) for line in r.log_tail)
    standins = [r.id for r in outcome.results if r.standin and r.done]
    if standins:
        text = (f" toolchain made {', '.join(standins)}: test artifacts, not real engines or TensorRT-LLM results; "
                "they can never be published.")
        lines.append((f"[bold red]STAND-IN[/]{text}", f"STAND-IN{text}", True))
    lines.extend((*_same(line), True) for line in folder_lines(outcome.results))
    counts = Counter(r.status for r in outcome.results)
    summary = ", ".join(f"{n} {status}" for status, n in counts.items())
    pulled = [r.pulled["store"] for r in outcome.results if r.pulled]
    if pulled:
        summary += f" ({len(pulled)} pulled from {pulled[0]})"
    summary = f"{outcome.recipe}: {summary}" + (f"; lock: {outcome.lock_path}" if outcome.lock_path and outcome.lock_path.exists() else "")
    lines.append((*_same(summary), True))
    if counts.get("built", 0) == 0 and counts.get("failed", 0) == 0 and counts.get("cached", 0):
        lines.append((*_same("Nothing was built: every buildable artifact was already in the store."), False))
    return rows, lines


def folder_lines(results) -> list[str]:
    """Where each target the build made or found is (its read-only checkout, for `trtbuild check`
    and the runtimes), and why one is held back from publishing (publication.held_back)."""
    from trtbuild.facts.nodeids import is_target

    done = [r for r in results if r.done and r.path and is_target(r.id, r.stage)]
    if not done:
        return []
    width = max(len(r.id) for r in done)
    lines = ["folders (read-only; `trtbuild check FOLDER` checks one):"]
    for r in done:
        lines.append(f"  {r.id.ljust(width)}  {r.path}" + (f"  (held back: {r.ref})" if r.ref else ""))
    return lines


def _same(text: str) -> tuple[str, str]:
    """Text given to rich as markup as it is (as before: ids, digests and paths are not escaped)."""
    return text, text


def print_build(outcome, console) -> None:
    from rich.table import Table

    rows, lines = _build_report(outcome)
    table = Table(show_lines=False)
    for column in BUILD_COLUMNS:
        table.add_column(column, overflow="fold", justify="right" if column in RIGHT_COLUMNS else "left")
    for row in rows:
        table.add_row(*(markup for markup, _ in row))
    console.print(table)
    for markup, _, soft_wrap in lines:
        console.print(markup, highlight=False, soft_wrap=soft_wrap)


def print_build_plain(outcome, stream=None) -> bool:
    """print_build's text on a file or pipe, written without rich (plainout); False, having written
    nothing, where only rich can be sure to write it (a terminal, text that is not as_is)."""
    from trtbuild.cli import plainout

    stream = stream or sys.stdout
    if not plainout.plain_stream(stream):
        return False
    rows, lines = _build_report(outcome)
    table = plainout.table(BUILD_COLUMNS, [column in RIGHT_COLUMNS for column in BUILD_COLUMNS],
                           [[plain for _, plain in row] for row in rows], plainout.WIDTH)
    if table is None or not all(plainout.line_as_is(plain, None if soft_wrap else plainout.WIDTH)
                                for _, plain, soft_wrap in lines):
        return False
    stream.write("".join(f"{line}\n" for line in [*table, *(plain for _, plain, _ in lines)]))
    stream.flush()
    return True


def print_explain(explained, console) -> None:
    from rich.markup import escape

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
        if ex.command:  # on its own line, unindented, so that it can be copied and run as it is
            console.print(ex.command, markup=False, highlight=False, soft_wrap=True)
            console.print(f"    {ex.command_note}", markup=False, highlight=False, soft_wrap=True)
            for f in ex.flags:
                value = json.dumps(f.value) if not isinstance(f.value, str) else f.value
                console.print(f"    flag {f.name:<23} = {value:<20} [dim]{escape(f.origin)}[/]", highlight=False,
                              soft_wrap=True)
        for f in ex.fields:
            value = json.dumps(f.value) if not isinstance(f.value, str) else f.value
            console.print(f"    {f.name:<28} = {value:<20} [dim]{f.origin}[/]", highlight=False, soft_wrap=True)


RECORD_COLUMNS = ("key", "recipe", "target", "stage", "created", "size", "seconds", "toolchain", "digest")


def _record_rows(records) -> list[list[tuple[str, str]]]:
    """`cache ls`'s rows: each cell (markup, plain text)."""
    rows = []
    for r in records:
        made_with = ", ".join(f"{name} {version}" for name, version in sorted(r.toolchain.items()) if version) or "-"
        toolchain = _same(made_with)
        if r.standin:  # never mistaken for an artifact of the real tools
            standin = f"STAND-IN ({', '.join(r.standin)}): {made_with}"
            toolchain = (f"[bold red]STAND-IN[/]{standin[len('STAND-IN'):]}", standin)
        rows.append([*map(_same, (r.key[:12], r.recipe, r.target, r.stage, format_utc(r.created), format_bytes(r.size),
                                  f"{r.execution.seconds:.1f}")), toolchain, _same(r.digest[:12])])
    return rows


def print_records(records, console) -> None:
    from rich.table import Table

    table = Table()
    for column in RECORD_COLUMNS:
        table.add_column(column, overflow="fold")
    for row in _record_rows(records):
        table.add_row(*(markup for markup, _ in row))
    console.print(table)
    console.print(f"{len(records)} records", highlight=False)


def print_records_plain(records, stream=None) -> bool:
    """print_records on a file or pipe: one record per line (the table as wide as its widest row,
    where rich would fold cells across lines at any fixed width), written without rich
    (plainout.unfolded_table), or by rich on a console that wide where a cell is not ASCII; False,
    having written nothing, on a terminal (rich's table, as wide as the terminal)."""
    from trtbuild.cli import plainout

    stream = stream or sys.stdout
    if not plainout.plain_stream(stream):
        return False
    rows = _record_rows(records)
    plain = [[text for _, text in row] for row in rows]
    lines = plainout.unfolded_table(RECORD_COLUMNS, [False] * len(RECORD_COLUMNS), plain)
    if lines is None:
        from rich.cells import cell_len
        from rich.console import Console

        width = sum(max(map(cell_len, texts)) + 3 for texts in zip(RECORD_COLUMNS, *plain)) + 1
        print_records(records, Console(file=stream, width=width))
        return True
    stream.write("".join(f"{line}\n" for line in [*lines, f"{len(records)} records"]))
    stream.flush()
    return True
