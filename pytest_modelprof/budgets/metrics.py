"""The metrics a budget can hold, each with its unit in its key name.

Budget files use decimal units: 1 GFLOPs = 10^9 FLOPs, 1 MB = 10^6 bytes,
1 ms = 10^-3 s. Parameters are a plain count.

Latency is measured with a calibration workload timed next to the model (see
:mod:`pytest_modelprof.engine.timing`); ``calibration_ms`` is recorded beside each
latency baseline so that a later run can be compared at the baseline's machine speed.
It is a reference, not a limit: it has no ceiling and no tolerance.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .._format import plain
from ..results import Profile


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
    read: Callable[[Profile], float | None]
    per_device: bool = False
    limited: bool = True  # False: a reference recorded with the baselines, never checked itself

    def measure(self, profile: Profile) -> float | None:
        """The profile's figure in this metric's unit, rounded as baselines are; None if not measured."""
        raw = self.read(profile)
        if raw is None:
            return None
        return self.rounded(raw / self.scale)

    def rounded(self, value: float) -> float:
        return float(f"{value:.{self.digits}g}") if self.digits else float(round(value))

    def format(self, value: float) -> str:
        return f"{plain(value, 6)} {self.unit}" if self.digits else f"{value:,.0f} {self.unit}"

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


METRICS: dict[str, Metric] = {
    m.key: m
    for m in (
        Metric("gflops", "GFLOPs", 1e9, 9, _percent(0), lambda p: p.flops),
        Metric("params", "params", 1, 0, _percent(0), lambda p: p.params),
        Metric("peak_activation_mb", "MB", 1e6, 7, _percent(2), lambda p: p.peak_activation_bytes),
        Metric("peak_memory_mb", "MB", 1e6, 7, _percent(2), lambda p: p.peak_memory_bytes),
        Metric("latency_ms", "ms", 1e-3, 4, _percent(10), lambda p: p.latency_seconds, per_device=True),
        Metric(
            "calibration_ms",
            "ms",
            1e-3,
            4,
            _percent(0),
            lambda p: p.latency.calibration_seconds if p.latency is not None else None,
            per_device=True,
            limited=False,
        ),
    )
}


LIMITED = {key: metric for key, metric in METRICS.items() if metric.limited}
CONFIDENCE = 0.95  # of the interval a latency must lie wholly beyond to pass or fail a limit


def device_kind(profile: Profile) -> str:
    """``"cpu"`` or ``"cuda"``: the key of per-device ceilings such as ``max_latency_ms``."""
    return profile.device.partition(":")[0]


def is_finite_number(value: object) -> bool:
    """A TOML integer or float that a float can hold: not a bool, not inf or nan, not 1e400 written as an integer."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return abs(value) <= sys.float_info.max
    return math.isfinite(value)
