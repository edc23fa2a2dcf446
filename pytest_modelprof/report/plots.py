"""Plots (matplotlib, the ``plot`` extra): FLOPs per module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..results import Profile
from .tables import visible_modules
from .text import format_count


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'pytest-modelprof[plot]'") from None
    return plt


def plot_module_flops(profile: Profile, path: str | Path, depth: int = 1, top: int = 20) -> None:
    """A horizontal bar chart of the modules at ``depth``: forward, backward and recomputed FLOPs, stacked."""
    plt = _pyplot()
    modules = [m for m in visible_modules(profile, depth) if m.depth == depth]
    modules = sorted(modules, key=lambda m: m.flops, reverse=True)[:top][::-1]
    if not modules:
        raise ValueError(f"the profile has no module at depth {depth}")
    labels = [f"{m.path} ({m.type})" for m in modules]
    height = max(2.5, 0.35 * len(modules) + 1.2)
    figure, axes = plt.subplots(figsize=(9, height), layout="constrained")
    left = [0.0] * len(modules)
    for phase, color in (("forward", "#4C72B0"), ("backward", "#DD8452"), ("recompute", "#55A868")):
        values = [getattr(m, f"{phase}_flops") for m in modules]
        if any(values):
            axes.barh(labels, values, left=left, color=color, label=phase)
            left = [a + b for a, b in zip(left, values)]
    axes.set_xlabel("FLOPs")
    axes.xaxis.set_major_formatter(lambda value, _: format_count(value))
    mode = "training step" if profile.train else "inference"
    total = format_count(profile.flops, "FLOPs")
    axes.set_title(f"{profile.name or profile.model}: FLOPs per module at depth {depth}\n{mode}, {total} in all", fontsize=11)
    axes.legend(loc="lower right")
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_memory_timeline(profile: Profile, path: str | Path) -> None:
    """Memory after each op, stacked by category, with the phases shaded and the peak marked."""
    memory = profile.memory
    if memory is None:
        raise ValueError("this profile did not follow memory (profile(..., memory=True))")
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(10, 4.8), layout="constrained")
    steps = range(len(memory.timeline))
    series = [[row[i] for _, row in memory.timeline] for i in range(len(memory.categories))]
    shown = [(name, values) for name, values in zip(memory.categories, series) if any(values)]
    axes.stackplot(steps, *[values for _, values in shown], labels=[name for name, _ in shown], alpha=0.85)
    start = 0
    for index in range(1, len(memory.timeline) + 1):
        if index == len(memory.timeline) or memory.timeline[index][0] != memory.timeline[start][0]:
            phase = memory.timeline[start][0]
            if phase != "forward":
                axes.axvspan(start, index - 1, color="grey", alpha=0.08, lw=0)
            axes.text((start + index - 1) / 2, 1.01, phase, transform=axes.get_xaxis_transform(), ha="center", fontsize=8)
            start = index
    peak = max(steps, key=lambda i: sum(memory.timeline[i][1]))
    axes.axvline(peak, color="black", lw=0.8, ls="--")
    axes.annotate(
        f"peak {format_count(memory.peak_bytes, 'B')}", (peak, memory.peak_bytes), xytext=(6, -12), textcoords="offset points", fontsize=9
    )
    axes.set_xlabel("op")
    axes.set_ylabel("bytes allocated")
    axes.yaxis.set_major_formatter(lambda value, _: format_count(value, "B"))
    axes.set_title(f"{profile.name or profile.model}: memory by category", pad=14)
    axes.legend(loc="upper left", fontsize=8)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_monitor(monitor: Any, path: str | Path) -> Path:
    """A :class:`~pytest_modelprof.MemoryMonitor`'s categories over the recorded iterations, epochs marked,
    as a PNG at ``path`` (needs matplotlib)."""
    rows = monitor.rows
    if not rows:
        raise ValueError("the monitor recorded no iteration")
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(10, 4.8), layout="constrained")
    steps = [row.iteration for row in rows]
    names = ("weights", "gradients", "optimizer_state", "activations_peak", "activations_alive", "cuda_allocated", "cuda_max_allocated")
    for name in names:
        values = [getattr(row, name) for row in rows]
        if any(v for v in values if v is not None):
            axes.plot(steps, [v or 0 for v in values], label=name.replace("_", " "), lw=1.4)
    for previous, row in zip(rows, rows[1:]):
        if row.epoch != previous.epoch:
            axes.axvline(row.iteration - 0.5, color="grey", lw=0.8, ls=":")
    axes.set_xlabel("iteration")
    axes.set_ylabel("bytes")
    axes.yaxis.set_major_formatter(lambda value, _: format_count(value, "B"))
    axes.set_title(f"{type(monitor.model).__name__}: memory over the training loop")
    axes.legend(loc="upper left", fontsize=8)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return Path(path)
