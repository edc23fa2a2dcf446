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


_BOUND_COLORS = {"compute": "#C44E52", "memory": "#4C72B0", "launch": "#8C8C8C"}


def plot_roofline(profile: Profile, path: str | Path, label: int = 6) -> None:
    """The predicted step's roofline on its target GPU: each operator (per phase) placed by its arithmetic
    intensity (FLOPs per byte moved) and the FLOP/s it reaches, sized by its share of the step, colored by
    what bounds it; under the GPU's roofs (memory bandwidth, peak FLOP/s per dtype). The ``label`` most
    expensive operators are named."""
    predicted = profile.predicted
    if predicted is None:
        raise ValueError("this profile has no predicted time: profile it with target=<GPU>")
    points = [op for op in predicted.ops if op.seconds > 0 and op.flops > 0 and op.bytes > 0]
    if not points:
        raise ValueError("the predicted step has no operator with both FLOPs and bytes to place on a roofline")
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(9, 6), layout="constrained")
    axes.set_xscale("log")
    axes.set_yscale("log")
    total = sum(op.seconds for op in predicted.ops) or 1.0
    for bound, color in _BOUND_COLORS.items():
        chosen = [op for op in points if op.bound == bound]
        if chosen:
            axes.scatter(
                [op.intensity for op in chosen],
                [op.flops / op.seconds for op in chosen],
                s=[20 + 600 * op.seconds / total for op in chosen],
                color=color,
                alpha=0.7,
                label=f"{bound}-bound",
                edgecolors="white",
            )
    low = min(op.intensity for op in points) / 4
    high = max(op.intensity for op in points) * 4
    if predicted.bandwidth and predicted.peak_flops:
        roofs = sorted({v for k, v in predicted.peak_flops.items() if k in ("bfloat16", "tf32", "float32")}, reverse=True)
        top = max(predicted.peak_flops.values())
        high = max(high, 4 * top / predicted.bandwidth)
        xs = [low * (high / low) ** (i / 200) for i in range(201)]
        for roof in roofs:
            dtypes = "/".join(k for k, v in predicted.peak_flops.items() if v == roof and k in ("bfloat16", "float16", "tf32", "float32"))
            axes.plot(xs, [min(predicted.bandwidth * x, roof) for x in xs], color="black", linewidth=1, alpha=0.6)
            axes.annotate(f"{dtypes} {format_count(roof, 'FLOP/s')}", (high, roof), ha="right", va="bottom", fontsize=8)
        axes.annotate(f"{format_count(predicted.bandwidth, 'B/s')}", (low, predicted.bandwidth * low), ha="left", va="bottom", fontsize=8)
    for op in sorted(points, key=lambda op: -op.seconds)[:label]:
        axes.annotate(f"{op.op.removeprefix('aten.')} ({op.phase})", (op.intensity, op.flops / op.seconds), fontsize=7, alpha=0.9)
    axes.set_xlim(low, high)
    axes.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    axes.set_ylabel("FLOP/s reached (predicted)")
    axes.yaxis.set_major_formatter(lambda value, _: format_count(value))
    axes.set_title(
        f"{profile.name or profile.model} on {predicted.target}: predicted step {predicted.seconds * 1e3:.3g} ms\n"
        "each operator by phase, sized by its share of the GPU's time",
        fontsize=11,
    )
    axes.legend(loc="lower right")
    figure.savefig(path, dpi=120)
    plt.close(figure)
