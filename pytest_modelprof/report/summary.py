"""The end-of-session summary: one row per profile, as text for the terminal and as Markdown."""

from __future__ import annotations

from dataclasses import dataclass

from .._format import plain
from ..budgets import METRICS, Verdict
from ..results import Profile


@dataclass
class SummaryRow:
    name: str
    status: str
    gflops: str = ""
    params: str = ""
    peak_mb: str = ""
    latency_ms: str = ""
    change: str = ""


def summary_row(verdict: Verdict, profile: Profile | None, baseline_gflops: float | None) -> SummaryRow:
    """Figures of one profile in budget units; ``change`` is GFLOPs against the baseline."""
    row = SummaryRow(verdict.name, verdict.status)
    if profile is None:
        return row
    gflops = METRICS["gflops"].measure(profile)
    row.gflops = plain(gflops) if gflops is not None else ""
    row.params = f"{profile.params:,}"
    peak = METRICS["peak_memory_mb"].measure(profile)
    row.peak_mb = plain(peak) if peak is not None else ""
    latency = METRICS["latency_ms"].measure(profile)
    row.latency_ms = plain(latency, 3) if latency is not None else ""
    if baseline_gflops and gflops is not None:
        row.change = f"{(gflops - baseline_gflops) / baseline_gflops:+.2%}"
    return row


HEADERS = ("profile", "GFLOPs", "params", "peak MB", "latency ms", "vs baseline", "status")


def _cells(row: SummaryRow) -> tuple[str, ...]:
    return (row.name, row.gflops, row.params, row.peak_mb, row.latency_ms, row.change, row.status)


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
