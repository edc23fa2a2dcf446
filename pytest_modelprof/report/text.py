"""Units and the header of a :class:`~pytest_modelprof.Profile`'s reports."""

from __future__ import annotations

from .._format import plain
from ..results import Profile

_PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def format_count(value: float, unit: str = "") -> str:
    """``3_642_974_696, "FLOPs"`` -> ``"3.64 GFLOPs"`` (decimal prefixes)."""
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}".rstrip()


def format_seconds(value: float) -> str:
    """``0.0123`` -> ``"12.3 ms"``."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(value) >= scale:
            return f"{plain(value / scale, 3)} {unit}"
    return f"{plain(value / 1e-9, 3)} ns"


def format_latency(profile: Profile) -> list[str]:
    """The latency lines of a timed profile (none for an untimed one)."""
    latency = profile.latency
    if latency is None:
        return []
    low, high = latency.interval()
    lines = [
        f"  latency {format_seconds(latency.median):>14}   median of {latency.runs} repeats x {latency.calls_per_sample} calls "
        f"(95% interval {format_seconds(low)}-{format_seconds(high)}); min {format_seconds(latency.min)}, "
        f"mean {format_seconds(latency.mean)}, IQR {format_seconds(latency.iqr)}, std {format_seconds(latency.std)}",
    ]
    rates = []
    if latency.throughput is not None:
        rates.append(f"{latency.throughput:,.1f} samples/s")
    if profile.flops_per_second is not None:
        rates.append(f"{format_count(profile.flops_per_second, 'FLOP/s')} achieved")
    if latency.calibration_seconds is not None:
        rates.append(f"calibration {format_seconds(latency.calibration_seconds)}")
    lines.append(f"  on {latency.machine}: " + ", ".join(rates))
    lines += [f"  warning: {warning}" for warning in latency.warnings]
    return lines


def format_header(profile: Profile) -> str:
    """What was profiled, and its totals."""
    title = profile.name or profile.model
    mode = "training step" if profile.train else "inference"
    where = f"analytic, as on {profile.device}" if profile.analytic else profile.device
    phases = f"forward {format_count(profile.forward_flops)}"
    if profile.train:
        phases += f", loss {format_count(profile.loss_flops)}, backward {format_count(profile.backward_flops)}"
    if profile.recompute_flops:
        phases += f", recomputed {format_count(profile.recompute_flops)}"
    if profile.optimizer_flops:
        phases += f", optimizer {format_count(profile.optimizer_flops)}"
    lines = [
        f"{title}: {mode} ({where})",
        f"  FLOPs   {format_count(profile.flops, 'FLOPs'):>14}   {phases}",
        f"  MACs    {format_count(profile.macs, 'MACs'):>14}",
        f"  params  {format_count(profile.params):>14}   trainable {format_count(profile.trainable_params)}, "
        f"size {format_count(profile.model_size_bytes, 'B')}",
    ]
    lines += format_latency(profile)
    if profile.uncounted:
        lines.append("  uncounted ops: " + ", ".join(f"{op} x{calls}" for op, calls in profile.uncounted.items()))
    return "\n".join(lines)
