"""Base vs head: what a change (a pull request) did to each profile's figures, and the rules
(``--fail-on gflops:+1%``) that turn chosen changes into a failure.

Figures are compared in budget units, rounded as baselines are (:meth:`Metric.measure`), so
a change too small to move a baseline is no change here either.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .metrics import LIMITED, Metric
from .results import Profile

CHANGED, UNCHANGED, NEW, REMOVED = "changed", "unchanged", "new", "removed"


@dataclass(frozen=True)
class Change:
    """One metric of one profile on both sides, in the metric's unit; None: not measured there."""

    metric: Metric
    base: float | None
    head: float | None

    @property
    def absolute(self) -> float | None:
        return None if self.base is None or self.head is None else self.head - self.base

    @property
    def relative(self) -> float | None:
        """(head - base) / |base|; ±inf from a base of zero; None where a side is not measured."""
        change = self.absolute
        if change is None or self.base is None:
            return None
        if self.base == 0:
            return 0.0 if change == 0 else math.copysign(math.inf, change)
        return change / abs(self.base)


@dataclass
class ProfileChange:
    """One profile, base vs head."""

    name: str
    status: str  # changed, unchanged, new (head only), removed (base only)
    changes: dict[str, Change] = field(default_factory=dict)  # metric key -> change, for metrics either side measured

    @property
    def largest(self) -> float:
        """The largest relative change of any metric (inf for a new or removed profile): the sort key."""
        if self.status in (NEW, REMOVED):
            return math.inf
        return max((abs(c.relative) for c in self.changes.values() if c.relative is not None), default=0.0)


def compare(base: Mapping[str, Profile], head: Mapping[str, Profile]) -> list[ProfileChange]:
    """A row per profile on either side, the largest change first (new and removed ones at the top)."""
    rows = []
    for name in sorted(set(base) | set(head)):
        before, after = base.get(name), head.get(name)
        changes = {}
        for key, metric in LIMITED.items():
            first = metric.measure(before) if before is not None else None
            second = metric.measure(after) if after is not None else None
            if first is not None or second is not None:
                changes[key] = Change(metric, first, second)
        if before is None:
            status = NEW
        elif after is None:
            status = REMOVED
        else:
            status = CHANGED if any(c.base != c.head for c in changes.values()) else UNCHANGED
        rows.append(ProfileChange(name, status, changes))
    return sorted(rows, key=lambda row: -row.largest)


@dataclass(frozen=True)
class FailOn:
    """A change that fails the comparison: ``gflops:+1%`` (an increase of more than 1%),
    ``peak_memory_mb:+50`` (more than 50 MB), ``latency_ms:-10%`` (a drop of more than 10%),
    or ``new`` / ``removed`` (a profile that appeared or disappeared)."""

    text: str
    metric: Metric | None = None  # None: a new/removed rule
    direction: int = 1  # +1: an increase, -1: a decrease
    amount: float = 0.0  # beyond which it fails
    relative: bool = True
    status: str = ""  # for a new/removed rule

    def failure(self, row: ProfileChange) -> str | None:
        """Why ``row`` fails this rule, in a line; None if it does not."""
        if self.metric is None:
            return f"{row.name}: {row.status} ({self.text})" if row.status == self.status else None
        change = row.changes.get(self.metric.key)
        if change is None or change.absolute is None:
            return None
        moved = change.relative if self.relative else change.absolute
        assert moved is not None
        if moved * self.direction <= self.amount:
            return None
        return f"{row.name}: {self.metric.key} {_show(change)} ({self.text})"


def signed(metric: Metric, amount: float) -> str:
    """A change of ``amount`` (in ``metric``'s unit) with its sign, in plain notation as the
    metric's cells show figures: ``+4,096``, ``-0.00003277``, never ``+3.277e-05``."""
    return ("-" if amount < 0 else "+") + metric.cell(abs(amount))


def _show(change: Change) -> str:
    assert change.base is not None and change.head is not None and change.absolute is not None
    metric = change.metric
    shown = f"{metric.cell(change.base)} -> {metric.cell(change.head)} {metric.unit}, {signed(metric, change.absolute)}"
    return shown + (f", {change.relative:+.2%}" if change.relative is not None and math.isfinite(change.relative) else "")


def parse_fail_on(text: str) -> FailOn:
    """A ``--fail-on`` rule; raises ValueError saying what was expected."""
    rule = text.strip()
    if rule in (NEW, REMOVED):
        return FailOn(rule, status=rule)
    match = re.fullmatch(r"([a-z_]+)\s*:\s*([+-])\s*(\d+(?:\.\d*)?|\.\d+)\s*(%?)\s*([A-Za-z]*)", rule)
    metrics = ", ".join(LIMITED)
    if not match:
        raise ValueError(
            f"--fail-on {text!r}: expected METRIC:+N% (an increase of more than N%), METRIC:+N (in the metric's unit), "
            f"METRIC:-N% (a decrease), 'new' or 'removed'; metrics: {metrics}"
        )
    key, sign, amount, percent, unit = match.groups()
    metric = LIMITED.get(key)
    if metric is None:
        raise ValueError(f"--fail-on {text!r}: unknown metric {key!r}; expected one of: {metrics}")
    if unit and (percent or unit.lower() != metric.unit.lower()):
        raise ValueError(f"--fail-on {text!r}: {key} is in {metric.unit}, got {unit!r}")
    value = float(amount) / 100 if percent else float(amount)
    return FailOn(rule, metric, 1 if sign == "+" else -1, value, relative=bool(percent))
