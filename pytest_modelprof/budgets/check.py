"""Holding a profile against its budget: ceilings first, then baselines with tolerance.

Counted figures (FLOPs, parameters, bytes) are exact and compared as they are.
A latency is a sample of a noisy quantity, so it is compared through a confidence
interval for its median (distribution-free, :data:`~..metrics.CONFIDENCE`): it fails
a limit only when the whole interval lies above it, passes only when the whole
interval lies at or below it, and counts as improved only when the whole interval lies
below the baseline's band. An interval across the limit is *inconclusive*: the run
cannot tell, and says why instead of guessing.

Against a baseline a latency is first brought to the baseline's machine speed: the
median ratio of each repeat to the calibration workload timed beside it, times the
calibration time recorded with the baseline. A machine that is 20% slower today makes
both the model and the calibration 20% slower, and the comparison does not move. That
holds for a machine that is uniformly slower, not for one shared with other busy
processes: threads that wait for a CPU slow a multi-threaded model more than the small
calibration. A run whose threads waited for a CPU (``LatencyReport.disturbance``) is
therefore inconclusive against a baseline, and against a ceiling unless it stayed
under it anyway (waiting only adds time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from .. import stats
from .._format import plain
from ..metrics import CONFIDENCE, LIMITED, METRICS, Metric
from ..results import Profile
from .load import ProfileBudget

Status = Literal["ok", "regressed", "improved", "new", "updated", "unchanged", "stale", "inconclusive"]
"""A verdict's or a finding's outcome (docs/budgets.md: "Statuses")."""
OK: Final = "ok"
REGRESSED: Final = "regressed"
IMPROVED: Final = "improved"
NEW: Final = "new"  # no budget entry yet
UPDATED: Final = "updated"  # --modelprof-update wrote new figures
UNCHANGED: Final = "unchanged"  # --modelprof-update: the entry already held these figures
STALE: Final = "stale"  # a budget entry no test made
INCONCLUSIVE: Final = "inconclusive"  # a sampled figure (latency) the run could not hold against its limit, with the reason


@dataclass
class Finding:
    """One metric held against one limit (a ceiling, or a baseline plus its tolerance)."""

    metric: str
    limit: str  # the budget key: "max_gflops", "baseline.gflops", "baseline.latency_ms.<machine>"
    measured: float
    reference: float  # the ceiling, or the baseline
    allowed: float  # the most that passes
    path: Path  # the budget file, relative to the root it was loaded under (pytest's rootdir) when inside it
    line: int
    status: Status  # OK, REGRESSED, IMPROVED or INCONCLUSIVE
    tolerance: str | None = None  # for baselines
    interval: tuple[float, float] | None = None  # a confidence interval of a sampled measurement (latency)
    note: str = ""  # how the measurement was brought to the reference (latency vs calibration)
    reason: str = ""  # why an INCONCLUSIVE finding could not be decided

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
        measured = metric.format(self.measured)
        if self.interval is not None:
            low, high = self.interval
            measured += f" (median; {CONFIDENCE:.0%} interval {plain(low)}-{plain(high)}{self.note})"
        return (
            f"{self.metric}: measured {measured}, allowed {metric.format(self.allowed)} ({limit}): "
            f"{percent} ({_signed(metric, change)}){versus} [{self.path}:{self.line}]"
        )


@dataclass
class Verdict:
    name: str
    status: Status
    findings: list[Finding] = field(default_factory=list)
    path: Path | None = None
    line: int | None = None
    notes: list[str] = field(default_factory=list)  # what was measured but not compared, and why

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
    notes = []
    for metric in LIMITED.values():
        measured = metric.measure(profile)
        if measured is None:
            continue
        findings.extend(_ceilings(metric, measured, profile, budget))
        if baselines:
            found = _baselines(metric, measured, profile, budget)
            findings.extend(found)
            machines = budget.machine_baselines.get(metric.key, {})
            targets = budget.device_ceilings.get(metric.key, {}) if metric.per_target else {}
            if targets and metric.table_key(profile) not in targets and metric.key not in budget.ceilings:
                notes.append(
                    f"max_{metric.key}: no ceiling for {metric.table_key(profile)} (given for {', '.join(sorted(targets))}): "
                    f"not checked [{budget.shown}:{budget.line_of('max_' + metric.key)}]"
                )
            if metric.per_device and not found and machines:
                notes.append(
                    f"{metric.key}: no baseline for this machine ({profile.machine}; recorded for {', '.join(sorted(machines))}): "
                    f"not compared; pytest --modelprof-update records one [{budget.shown}:{budget.line_of('baseline.' + metric.key)}]"
                )
    notes.extend(f"{f.metric}: inconclusive: {f.reason} [{f.path}:{f.line}]" for f in findings if f.status == INCONCLUSIVE)
    if profile.latency is not None:
        notes.extend(f"latency: {warning}" for warning in profile.latency.warnings)
    status: Status
    if any(f.status == REGRESSED for f in findings):
        status = REGRESSED
    elif any(f.status == INCONCLUSIVE for f in findings):
        status = INCONCLUSIVE
    elif any(f.status == IMPROVED for f in findings):
        status = IMPROVED
    else:
        status = OK
    return Verdict(name, status, findings, budget.shown, budget.line, notes)


def _ceilings(metric: Metric, measured: float, profile: Profile, budget: ProfileBudget) -> list[Finding]:
    key = f"max_{metric.key}"
    table = metric.table_key(profile)
    limit = budget.device_ceilings.get(metric.key, {}).get(table) if table is not None else None
    if limit is None:
        limit = budget.ceilings.get(metric.key)
    if limit is None:
        return []
    interval = metric.interval(profile, CONFIDENCE)
    low, high = interval if interval is not None else (measured, measured)
    status: Status = OK
    reason = ""
    if high > limit:
        disturbance = metric.disturbance(profile)
        if disturbance:
            status, reason = INCONCLUSIVE, f"over the ceiling while {disturbance}"
        elif low > limit:
            status = REGRESSED
        else:
            status, reason = INCONCLUSIVE, _straddle(metric, interval, limit)
    return [Finding(metric.key, key, measured, limit, limit, budget.shown, budget.line_of(key), status, interval=interval, reason=reason)]


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
    interval = metric.interval(profile, CONFIDENCE)
    note = ""
    timing = metric.timing(profile) if metric.timing is not None else None
    if interval is not None and timing is not None and metric.reference is not None and profile.machine:
        # brought to the baseline's machine speed: the repeats' ratios to the reference workload timed
        # beside them, times the reference's time recorded with the baseline
        reference = budget.machine_baselines.get(metric.reference, {}).get(profile.machine)
        ratios = timing.ratio_interval(CONFIDENCE)
        if reference is not None and ratios is not None:
            raw = measured
            measured = metric.rounded(stats.median(timing.ratios) * reference)
            interval = (ratios[0] * reference, ratios[1] * reference)
            speed = (timing.calibration_seconds or 0) / METRICS[metric.reference].scale / reference
            note = f"; at the baseline's machine speed: raw {metric.format(raw)}, calibration x{speed:.3f}"
    low, high = interval if interval is not None else (measured, measured)
    tolerance = budget.tolerance(metric.key)
    allowed = tolerance.allowed(baseline)
    floor = 2 * baseline - allowed  # as far below the baseline as the tolerance reaches above it
    disturbance = metric.disturbance(profile)
    verdict = ""
    status: Status
    if disturbance:
        status, verdict = INCONCLUSIVE, f"not compared with the baseline: {disturbance}"
    elif low > allowed:
        status = REGRESSED
    elif high < floor or (allowed == baseline and high < baseline):
        status = IMPROVED
    elif high <= allowed:
        status = OK
    else:
        status, verdict = INCONCLUSIVE, _straddle(metric, interval, allowed)
    line = budget.line_of(f"baseline.{metric.key}")
    allowed = metric.rounded(allowed)
    return [Finding(metric.key, key, measured, baseline, allowed, budget.shown, line, status, tolerance.text, interval, note, verdict)]


def _straddle(metric: Metric, interval: tuple[float, float] | None, limit: float) -> str:
    low, high = interval or (limit, limit)
    return (
        f"the {CONFIDENCE:.0%} interval of the median, {plain(low)}-{plain(high)} {metric.unit}, reaches across "
        f"the limit of {plain(limit)} {metric.unit}; more repeats (--modelprof-time-budget) or a quieter machine decide it"
    )


def _signed(metric: Metric, change: float) -> str:
    return ("+" if change >= 0 else "-") + metric.format(abs(change))
