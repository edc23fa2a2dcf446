"""Base vs head as a table: text for the terminal, Markdown for a pull request comment or the
job's step summary. One row per profile, one column per metric either side measured."""

from __future__ import annotations

import math

from ..compare import CHANGED, NEW, REMOVED, UNCHANGED, Change, ProfileChange, signed
from ..metrics import Metric


def _cell(change: Change | None) -> str:
    """``base → head (+absolute, +relative%)``; one figure when unchanged; ``—`` for a side not measured."""
    if change is None:
        return ""
    metric = change.metric
    base = "—" if change.base is None else metric.cell(change.base)
    head = "—" if change.head is None else metric.cell(change.head)
    if change.base == change.head:
        return head
    if change.absolute is None or change.relative is None:
        return f"{base} → {head}"
    relative = f", {change.relative:+.2%}" if math.isfinite(change.relative) else ""
    return f"{base} → {head} ({signed(metric, change.absolute)}{relative})"


def _label(metric: Metric) -> str:
    """A metric's column: the summary table's name where it has one (``peak MB``), else its key in
    words with its unit (``peak activation MB``)."""
    if metric.column:
        return metric.column
    *words, last = metric.key.split("_")
    return " ".join([*words, metric.unit if last == metric.unit.lower() else last])


def _table(rows: list[ProfileChange]) -> list[tuple[str, ...]]:
    keys: list[str] = []
    for row in rows:
        keys += [key for key in row.changes if key not in keys]
    metrics = {key: next(row.changes[key].metric for row in rows if key in row.changes) for key in keys}
    header = ("profile", *(_label(m) for m in metrics.values()), "")
    return [header, *((row.name, *(_cell(row.changes.get(key)) for key in keys), row.status) for row in rows)]


def counts(rows: list[ProfileChange]) -> str:
    """``2 changed, 1 new, 0 removed, 5 unchanged``."""
    return ", ".join(f"{sum(r.status == s for r in rows)} {s}" for s in (CHANGED, NEW, REMOVED, UNCHANGED))


def format_comparison(rows: list[ProfileChange]) -> list[str]:
    """Aligned text rows."""
    table = _table(rows)
    widths = [max(len(cells[i]) for cells in table) for i in range(len(table[0]))]
    lines = [
        "  ".join(c.ljust(w) if i in (0, len(widths) - 1) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
        for cells in table
    ]
    return [*lines, counts(rows)]


def comparison_markdown(rows: list[ProfileChange], title: str = "Model budgets: base vs head") -> str:
    """A Markdown section: counts, then the table (changed, new and removed profiles; the unchanged folded away)."""
    shown = [r for r in rows if r.status != UNCHANGED]
    same = [r for r in rows if r.status == UNCHANGED]

    def markdown(part: list[ProfileChange]) -> list[str]:
        header, *body = _table(part)
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 2) + ["---"]) + "|"]
        return lines + ["| " + " | ".join(c.replace("|", "\\|") or " " for c in cells) + " |" for cells in body]

    lines = [f"## {title}", "", counts(rows), ""]
    if shown:
        lines += [*markdown(shown), ""]
    if same:
        lines += ["<details><summary>unchanged profiles</summary>", "", *markdown(same), "", "</details>", ""]
    return "\n".join(lines)
