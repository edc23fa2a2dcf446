"""The one table of budgetable metrics: what each is called, its unit, how it reads a Profile.

Budgets (ceilings, baselines, tolerances), the budget check, the baselines written by
``--modelprof-update``, the end-of-session summary and the JSON Schema's list of metric
names all read :data:`METRICS`; a new metric is a new row here. Each key carries its unit.

Budget files use decimal units: 1 GFLOPs = 10^9 FLOPs, 1 MB = 10^6 bytes, 1 GB = 10^9 bytes,
1 ms = 10^-3 s. Parameters are a plain count. ``comm_gb`` is the payload of a sharded step's
collectives per rank (``profile(world_size=...)``: :attr:`Profile.comm_bytes`).

Memory ceilings can be tables per target GPU: ``max_peak_memory_mb = { h100 = 4200, l4 = 20000 }``
holds a profile made with ``target="h100"`` to 4200 MB; a key may also be a device kind
(``cpu``, ``cuda``) for profiles without a target.

Latency is measured with a calibration workload timed next to the model (see
:mod:`pytest_modelprof.engine.timing.latency`); ``calibration_ms`` is recorded beside each
latency baseline so that a later run can be compared at the baseline's machine speed.
It is a reference, not a limit: it has no ceiling and no tolerance.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ._format import plain
from .results import LatencyReport, Profile


@dataclass(frozen=True)
class Tolerance:
    """How far a measurement may exceed its baseline: relative, or absolute in the metric's unit."""

    text: str
    relative: float = 0.0
    absolute: float = 0.0

    def allowed(self, baseline: float) -> float:
        return baseline + max(self.relative * abs(baseline), self.absolute)


@dataclass(frozen=True)
class Metric:
    """One budgeted figure: ``max_<key>`` is its ceiling, ``baseline.<key>`` its baseline."""

    key: str
    unit: str
    scale: float  # raw engine units per budget unit
    digits: int  # significant digits kept in baselines (and in comparisons with them); 0: an exact count
    default_tolerance: Tolerance
    read: Callable[[Profile], float | None]  # the raw figure (FLOPs, bytes, seconds); None: not measured
    per_device: bool = False  # measured on a machine: ceilings per device kind, baselines per machine
    per_target: bool = False  # ceilings may be a table per target GPU (profile(target=)) or device kind
    limited: bool = True  # False: a reference recorded with the baselines, never checked itself
    column: str = ""  # its column in the end-of-session summary ("": none)
    column_digits: int = 4  # significant digits shown there
    # the timed run behind a measured figure: a disturbed one (a shared CPU) is neither judged nor recorded
    timing: Callable[[Profile], LatencyReport | None] | None = None
    sampled: bool = False  # a sample's median: compared through its confidence interval (the timing's)
    reference: str | None = None  # the metric recorded beside its baselines that brings it to their machine's speed

    def table_key(self, profile: Profile) -> str | None:
        """The key of this metric's ceiling tables that applies to ``profile``: its device kind
        (per-device metrics), its target GPU or else device kind (per-target ones); None: no tables."""
        if self.per_device:
            return device_kind(profile)
        if self.per_target:
            return profile.target or device_kind(profile)
        return None

    def interval(self, profile: Profile, confidence: float) -> tuple[float, float] | None:
        """The confidence interval of a sampled figure, in this metric's unit; None for exact ones."""
        report = self.timing(profile) if self.sampled and self.timing is not None else None
        if report is None:
            return None
        low, high = report.interval(confidence)
        return low / self.scale, high / self.scale

    def disturbance(self, profile: Profile) -> str | None:
        """Why this profile's figure cannot be judged or recorded (a timing on a shared CPU); None: it can."""
        report = self.timing(profile) if self.timing is not None else None
        return report.disturbance if report is not None else None

    def measure(self, profile: Profile) -> float | None:
        """The profile's figure in this metric's unit, rounded as baselines are; None if not measured."""
        raw = self.read(profile)
        if raw is None:
            return None
        return self.rounded(raw / self.scale)

    def rounded(self, value: float) -> float:
        return float(f"{value:.{self.digits}g}") if self.digits else float(round(value))

    def format(self, value: float) -> str:
        return f"{self.cell(value, 6)} {self.unit}"

    def cell(self, value: float, digits: int | None = None) -> str:
        """``value`` (in this metric's unit) without the unit, as a table shows it."""
        return plain(value, digits or self.column_digits) if self.digits else f"{value:,.0f}"

    def parse_tolerance(self, text: str) -> Tolerance:
        """``"2%"``, or an amount in this metric's unit such as ``"0.5 GFLOPs"``; raises ValueError."""
        relative = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*%\s*", text)
        if relative:
            return Tolerance(text, relative=float(relative.group(1)) / 100)
        absolute = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]+)\s*", text)
        if absolute and absolute.group(2).lower() == self.unit.lower():
            return Tolerance(text, absolute=float(absolute.group(1)))
        raise ValueError(f'expected a percentage such as "2%" or an amount such as "1.5 {self.unit}", got {text!r}')


def _percent(value: float) -> Tolerance:
    return Tolerance(f"{value:g}%", relative=value / 100)


def _latency(profile: Profile) -> LatencyReport | None:
    return profile.latency


METRICS: dict[str, Metric] = {
    m.key: m
    for m in (
        Metric("gflops", "GFLOPs", 1e9, 9, _percent(0), lambda p: p.flops if p.flops_counted else None, column="GFLOPs"),
        Metric("params", "params", 1, 0, _percent(0), lambda p: p.params, column="params"),
        Metric("peak_activation_mb", "MB", 1e6, 7, _percent(2), lambda p: p.peak_activation_bytes, per_target=True),
        Metric("peak_memory_mb", "MB", 1e6, 7, _percent(2), lambda p: p.peak_memory_bytes, per_target=True, column="peak MB"),
        Metric("comm_gb", "GB", 1e9, 6, _percent(0), lambda p: p.comm_bytes, column="comm GB"),
        Metric(
            "predicted_ms",
            "ms",
            1e-3,
            6,
            _percent(1),
            lambda p: p.predicted.seconds if p.predicted is not None else None,
            per_target=True,
            column="predicted ms",
            column_digits=4,
        ),
        Metric(
            "latency_ms",
            "ms",
            1e-3,
            4,
            _percent(10),
            lambda p: p.latency_seconds,
            per_device=True,
            column="latency ms",
            column_digits=3,
            timing=_latency,
            sampled=True,
            reference="calibration_ms",
        ),
        Metric(
            "calibration_ms",
            "ms",
            1e-3,
            4,
            _percent(0),
            lambda p: p.latency.calibration_seconds if p.latency is not None else None,
            per_device=True,
            limited=False,
            timing=_latency,
        ),
    )
}


LIMITED = {key: metric for key, metric in METRICS.items() if metric.limited}
CONFIDENCE = 0.95  # of the interval a latency must lie wholly beyond to pass or fail a limit


def device_kind(profile: Profile) -> str:
    """``"cpu"`` or ``"cuda"``: the key of per-device ceilings such as ``max_latency_ms``."""
    return profile.device.partition(":")[0]


TIMED = tuple(key for key, metric in METRICS.items() if metric.timing is not None)  # a budget of these asks for a timed run
