"""GitHub Actions: a Markdown summary of the run and annotations at the budget lines."""

from __future__ import annotations

import os
from pathlib import Path

from .budgets import Verdict
from .report.summary import SummaryRow, format_markdown

MAX_ANNOTATIONS = 10  # GitHub shows at most 10 error annotations per step


def in_github_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation_path(path: Path, root: Path) -> Path:
    """A budget file as GitHub resolves annotation paths: relative to ``$GITHUB_WORKSPACE`` (the
    checkout), which in a monorepo lies above pytest's rootdir ``root``; ``path`` is relative to ``root``."""
    absolute = (root / path).resolve()
    for base in (os.environ.get("GITHUB_WORKSPACE"), str(root)):
        if base:
            try:
                return absolute.relative_to(Path(base).resolve())
            except ValueError:
                continue
    return absolute


def error_annotations(verdicts: list[Verdict], root: Path) -> list[str]:
    """``::error file=...,line=...,title=...::message`` for each regression, capped."""
    lines = []
    for verdict in verdicts:
        for finding in verdict.regressions:
            file = annotation_path(finding.path, root)
            title = f"{verdict.name}: {finding.metric} over budget"
            where = f"file={escape_property(str(file))},line={finding.line},title={escape_property(title)}"
            lines.append(f"::error {where}::{escape_data(finding.message())}")
    if len(lines) > MAX_ANNOTATIONS:
        left = len(lines) - MAX_ANNOTATIONS
        lines = [*lines[:MAX_ANNOTATIONS], f"::warning::{left} more budget regressions; see the job summary"]
    return lines


def append_step_summary(markdown: str) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(markdown)


def append_budget_table(rows: list[SummaryRow]) -> None:
    """The session's summary table, as Markdown, to the job's step summary."""
    append_step_summary("## Model budgets\n\n" + format_markdown(rows))
