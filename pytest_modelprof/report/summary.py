"""The end-of-session summary: one row per profile, as text for the terminal and as Markdown."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..budgets import Verdict
from ..metrics import METRICS
from ..results import Profile

# the figure columns: the metrics that have one, in the table's order
COLUMNS = [metric for metric in METRICS.values() if metric.column]


@dataclass
class SummaryRow:
    name: str
    status: str
    figures: dict[str, str] = field(default_factory=dict)  # metric key -> cell, in the metric's unit
    change: str = ""


def summary_row(verdict: Verdict, profile: Profile | None, baseline_gflops: float | None) -> SummaryRow:
    """Figures of one profile in budget units; ``change`` is GFLOPs against the baseline."""
    row = SummaryRow(verdict.name, verdict.status)
    if profile is None:
        return row
    for metric in COLUMNS:
        value = metric.measure(profile)
        row.figures[metric.key] = metric.cell(value) if value is not None else ""
    gflops = METRICS["gflops"].measure(profile)
    if baseline_gflops and gflops is not None:
        row.change = f"{(gflops - baseline_gflops) / baseline_gflops:+.2%}"
    return row


HEADERS = ("profile", *(metric.column for metric in COLUMNS), "vs baseline", "status")


def _cells(row: SummaryRow) -> tuple[str, ...]:
    return (row.name, *(row.figures.get(metric.key, "") for metric in COLUMNS), row.change, row.status)


def _columns(rows: list[SummaryRow]) -> list[tuple[str, ...]]:
    """Header and rows, without the figure columns no row has (memory, latency not measured)."""
    table = [HEADERS, *(_cells(r) for r in rows)]
    keep = [i for i in range(len(HEADERS)) if i in (0, len(HEADERS) - 1) or any(cells[i] for cells in table[1:])]
    return [tuple(cells[i] for i in keep) for cells in table]


def format_table(rows: list[SummaryRow]) -> list[str]:
    """Aligned text rows, numbers right-aligned."""
    table = _columns(rows)
    widths = [max(len(cells[i]) for cells in table) for i in range(len(table[0]))]
    lines = []
    for cells in table:
        parts = [cells[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(cells[1:-1], widths[1:-1])] + [cells[-1]]
        lines.append("  ".join(parts).rstrip())
    return lines


def format_markdown(rows: list[SummaryRow]) -> str:
    def escape(text: str) -> str:
        return text.replace("|", "\\|")

    header, *body = _columns(rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 2) + ["---"]) + "|"]
    lines += ["| " + " | ".join(escape(c) or " " for c in cells) + " |" for cells in body]
    return "\n".join(lines) + "\n"
