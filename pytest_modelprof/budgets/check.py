"""Holding a profile against its budget: ceilings first, then baselines with tolerance."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..engine.result import Profile
from .load import ProfileBudget
from .metrics import METRICS, Metric, device_kind

OK, REGRESSED, IMPROVED, NEW, UPDATED, STALE = "ok", "regressed", "improved", "new", "updated", "stale"


@dataclass
class Finding:
    """One metric held against one limit (a ceiling, or a baseline plus its tolerance)."""

    metric: str
    limit: str  # the budget key: "max_gflops", "baseline.gflops", "baseline.latency_ms.<machine>"
    measured: float
    reference: float  # the ceiling, or the baseline
    allowed: float  # the most that passes
    path: Path
    line: int
    status: str  # OK, REGRESSED or IMPROVED
    tolerance: str | None = None  # for baselines

    def message(self) -> str:
        """``gflops: measured 4.21 GFLOPs, allowed 4 GFLOPs (max_gflops): +5.25% (+0.21 GFLOPs) [budgets/x.toml:3]``"""
        metric = METRICS[self.metric]
        change = self.measured - self.reference
        percent = f"{change / self.reference:+.2%}" if self.reference else "new"
        if self.tolerance is None:
            limit = self.limit
            versus = ""
        else:
            limit = f"baseline {metric.format(self.reference)} + {self.tolerance}"
            versus = " vs baseline"
        return (
            f"{self.metric}: measured {metric.format(self.measured)}, allowed {metric.format(self.allowed)} ({limit}): "
            f"{percent} ({_signed(metric, change)}){versus} [{self.path}:{self.line}]"
        )


@dataclass
class Verdict:
    name: str
    status: str
    findings: list[Finding] = field(default_factory=list)
    path: Path | None = None
    line: int | None = None

    @property
    def regressions(self) -> list[Finding]:
        return [f for f in self.findings if f.status == REGRESSED]

    @property
    def improvements(self) -> list[Finding]:
        return [f for f in self.findings if f.status == IMPROVED]


def check(profile: Profile, name: str, budget: ProfileBudget | None, *, baselines: bool = True) -> Verdict:
    """Hold ``profile`` against ``budget``; ``baselines=False`` checks ceilings only (while updating)."""
    if budget is None:
        return Verdict(name, NEW)
    findings = []
    for metric in METRICS.values():
        measured = metric.measure(profile)
        if measured is None:
            continue
        findings.extend(_ceilings(metric, measured, profile, budget))
        if baselines:
            findings.extend(_baselines(metric, measured, profile, budget))
    if any(f.status == REGRESSED for f in findings):
        status = REGRESSED
    elif any(f.status == IMPROVED for f in findings):
        status = IMPROVED
    else:
        status = OK
    return Verdict(name, status, findings, budget.path, budget.line)


def _ceilings(metric: Metric, measured: float, profile: Profile, budget: ProfileBudget) -> list[Finding]:
    key = f"max_{metric.key}"
    limit = budget.device_ceilings.get(metric.key, {}).get(device_kind(profile)) if metric.per_device else None
    if limit is None:
        limit = budget.ceilings.get(metric.key)
    if limit is None:
        return []
    status = REGRESSED if measured > limit else OK
    return [Finding(metric.key, key, measured, limit, limit, budget.path, budget.line_of(key), status)]


def _baselines(metric: Metric, measured: float, profile: Profile, budget: ProfileBudget) -> list[Finding]:
    if metric.per_device:
        machine = profile.machine
        baseline = budget.machine_baselines.get(metric.key, {}).get(machine) if machine else None
        key = f"baseline.{metric.key}.{machine}"
    else:
        baseline = budget.baselines.get(metric.key)
        key = f"baseline.{metric.key}"
    if baseline is None:
        return []
    tolerance = budget.tolerance(metric.key)
    allowed = tolerance.allowed(baseline)
    floor = 2 * baseline - allowed  # as far below the baseline as the tolerance reaches above it
    if measured > allowed:
        status = REGRESSED
    elif measured < floor or (allowed == baseline and measured < baseline):
        status = IMPROVED
    else:
        status = OK
    line = budget.line_of(f"baseline.{metric.key}")
    return [Finding(metric.key, key, measured, baseline, metric.rounded(allowed), budget.path, line, status, tolerance.text)]


def _signed(metric: Metric, change: float) -> str:
    return ("+" if change >= 0 else "-") + metric.format(abs(change))
