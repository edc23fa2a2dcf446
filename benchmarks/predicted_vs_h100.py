"""Predicted step times against real H100 steps (../shared/gpu-truth/h100.json), and the fit behind them.

For each of the shared workloads, on this CPU-only machine: the analytic step on target
h100 and what the cost model needs of each op (:func:`op_features`). A calibration is
fitted in two stages: the kernel model (efficiency per kind of kernel, the shape of a
matrix product at which it reaches half of it, batch norm's bandwidth per channel, the
shortest kernel) to the measured kernel time of each operator and input shapes the
records hold, weighted by that time; then the host's time per op to the step times.
Each workload is also predicted by a calibration fitted without it (leave one out: both
stages, its kernels and its step left out). Printed: the step table (measured, predicted
with the shipped calibration, with the fit on all, leaving it out), the per-operator
errors, and the fitted calibration to ship in ``engine/targets/gpus.py``.

    python benchmarks/predicted_vs_h100.py [--no-leave-one-out]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import gpu_truth  # noqa: E402
from pytest_modelprof import GPUS, profile  # noqa: E402
from pytest_modelprof.engine.meters import Meter  # noqa: E402
from pytest_modelprof.engine.meters.flops import FormulaTable  # noqa: E402
from pytest_modelprof.engine.meters.predicted import op_features  # noqa: E402
from pytest_modelprof.engine.targets.cost import KINDS, StepClock, Work, kernel_seconds  # noqa: E402
from pytest_modelprof.engine.targets.gpus import Calibration  # noqa: E402

H100 = GPUS["h100"]
Key = tuple[str, tuple[tuple[int, ...], ...]]

# the names torch.profiler records for the kernels behind the ops the engine sees
ALIASES = {
    "aten.cudnn_convolution": "aten.convolution",
    "aten._conv_depthwise2d": "aten.convolution",
    "aten.clamp_min_": "aten.relu_",
    "aten.copy_": "aten._to_copy",
    "aten._cudnn_attention_forward": "aten._scaled_dot_product_cudnn_attention",
    "aten._cudnn_attention_backward": "aten._scaled_dot_product_cudnn_attention_backward",
}


def key(name: str, shapes: list) -> Key:
    """An operator and the shapes of its inputs of two dimensions or more (what the engine and the
    profiler both see: a convolution's bias and a foreach op's lists aside)."""
    return ALIASES.get(name, name), tuple(tuple(s) for s in shapes if isinstance(s, (list, tuple)) and len(s) >= 2)


class Features(Meter):
    """Each op in order: its work and key."""

    def __init__(self) -> None:
        self.ops: list[tuple[Work, Key]] = []
        self.formulas = FormulaTable()

    def op(self, op) -> None:  # type: ignore[no-untyped-def]
        shapes = [list(a.shape) if isinstance(a, torch.Tensor) else None for a in op.args]
        self.ops.append((op_features(op, self.formulas), key(op.name, shapes)))


@dataclasses.dataclass
class Workload:
    name: str
    ops: list[tuple[Work, Key]]
    step_seconds: float
    measured: dict[Key, float]  # kernel seconds per key, as recorded
    matched: dict[Key, tuple[list[Work], float]]  # keys the engine and the record share: its works, measured seconds


def workloads() -> list[Workload]:
    out = []
    for name, record in gpu_truth.records().items():
        model, inputs, keywords = gpu_truth.workload(name)
        features = Features()
        profile(model, inputs, target="h100", flops=False, memory=False, meters=[features], **keywords)
        measured: dict[Key, float] = defaultdict(float)
        for op in record["ops"]:
            measured[key(op["op"].replace("::", "."), json.loads(op["shapes"]))] += op["self_device_us"] * 1e-6
        works: dict[Key, list[Work]] = defaultdict(list)
        for work, k in features.ops:
            if work.kind != "none" and work.on_device:
                works[k].append(work)
        matched = {k: (works[k], measured[k]) for k in works if k in measured}
        out.append(Workload(name, features.ops, record["step_ms_median"] / 1e3, dict(measured), matched))
    return out


def step_seconds(workload: Workload, calibration: Calibration) -> float:
    clock = StepClock(H100, calibration)
    for work, _ in workload.ops:
        clock.issue(work)
    return clock.seconds


def predicted(works: list[Work], calibration: Calibration) -> float:
    return sum(kernel_seconds(H100, calibration, w)[0] for w in works)


# ------------------------------------------------------------------ the fit

PARAMETERS = (
    *(("efficiency", kind) for kind in (*KINDS, "cuda_cores")),
    *(("gemm_half", dim) for dim in "mnk"),
    ("reduction_bandwidth", "norm"),
    ("reduction_bandwidth", "norm_backward"),
    ("kernel_seconds", None),
)
BOUNDS = {
    "efficiency": (0.01, 1.0),
    "gemm_half": (1.0, 1e5),
    "reduction_bandwidth": (1e9, 1e12),
    "kernel_seconds": (1e-6, 2e-5),
    "host_seconds": (1e-6, 1e-4),
    "view_seconds": (1e-7, 5e-5),
}


START = {"reduction_bandwidth": 20e9}  # where a parameter the calibration lacks starts


def get(calibration: Calibration, parameter: tuple[str, str | None]) -> float:
    field, name = parameter
    value = getattr(calibration, field)
    if name is None:
        return value
    return value.get(name, getattr(Calibration(), field).get(name, START.get(field, 1.0)))


def put(calibration: Calibration, parameter: tuple[str, str | None], value: float) -> Calibration:
    field, name = parameter
    low, high = BOUNDS[field]
    value = min(max(value, low), high)
    if name is None:
        return dataclasses.replace(calibration, **{field: value})
    return dataclasses.replace(calibration, **{field: {**getattr(calibration, field), name: value}})


def kernel_loss(data: list[Workload], calibration: Calibration) -> float:
    """Squared log errors of each matched operator's kernel time, weighted by its measured time."""
    total = 0.0
    for workload in data:
        for works, seconds in workload.matched.values():
            total += seconds * math.log(predicted(works, calibration) / seconds) ** 2
    return total


def descend(calibration: Calibration, parameters, loss, rounds: int = 6) -> Calibration:  # type: ignore[no-untyped-def]
    """Coordinate descent in log space: each parameter in turn to the best of a shrinking set of factors."""
    best = loss(calibration)
    for step in [2.0, 1.5, 1.25, 1.1, 1.05, 1.02][:rounds]:
        improved = True
        while improved:
            improved = False
            for parameter in parameters:
                for factor in (step, 1 / step):
                    candidate = put(calibration, parameter, get(calibration, parameter) * factor)
                    value = loss(candidate)
                    if value < best - 1e-12:
                        calibration, best, improved = candidate, value, True
    return calibration


def fit(data: list[Workload], start: Calibration) -> Calibration:
    kinds = {w.kind for d in data for works, _ in d.matched.values() for w in works} | {"cuda_cores"}
    used = [p for p in PARAMETERS if p[0] != "efficiency" or p[1] in kinds]
    calibration = descend(start, used, lambda c: kernel_loss(data, c))

    def step_loss(candidate: Calibration) -> float:
        return sum(math.log(step_seconds(d, candidate) / d.step_seconds) ** 2 for d in data)

    calibration = descend(calibration, [("host_seconds", None), ("view_seconds", None)], step_loss, rounds=5)
    return dataclasses.replace(calibration, calibrated=True, source=f"fitted on {len(data)} H100 steps (../shared/gpu-truth, torch 2.11)")


# ------------------------------------------------------------------ report


def per_operator_errors(workload: Workload, calibration: Calibration) -> list[float]:
    """For the step's 20 most expensive recorded operators (by name and shapes), the relative error of
    the predicted kernel time of the engine's ops with that name and shapes."""
    top = sorted(workload.measured, key=lambda k: -workload.measured[k])[:20]
    return [predicted(workload.matched[k][0], calibration) / workload.measured[k] - 1 for k in top if k in workload.matched]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-leave-one-out", action="store_true")
    options = parser.parse_args()
    data = workloads()
    shipped = H100.calibration
    full = fit(data, shipped)
    print(f"{'workload':48s} {'measured':>9s} {'shipped':>9s} {'err':>7s} {'fit':>9s} {'err':>7s} {'left out':>9s} {'err':>7s}  (ms)")
    errors: dict[str, list[float]] = {"shipped": [], "fit": [], "left out": []}
    for workload in data:
        truth = workload.step_seconds
        row = {"shipped": step_seconds(workload, shipped), "fit": step_seconds(workload, full)}
        if not options.no_leave_one_out:
            rest = [d for d in data if d is not workload]
            row["left out"] = step_seconds(workload, fit(rest, full))
        cells = "".join(f" {row[c] * 1e3:9.3f} {row[c] / truth - 1:+7.1%}" for c in row)
        for column, value in row.items():
            errors[column].append(value / truth - 1)
        print(f"{workload.name:48s} {truth * 1e3:9.3f}{cells}")
    for column, values in errors.items():
        if values:
            print(f"{column:>9s}: median |error| {statistics.median(abs(e) for e in values):.1%}, max {max(abs(e) for e in values):.1%}")
    print("\nthe 20 most expensive operators (name and shapes) of each step, predicted vs measured kernel time (shipped calibration):")
    everything = []
    for workload in data:
        here = per_operator_errors(workload, shipped)
        everything.extend(here)
        print(f"  {workload.name:48s} {len(here):2d} matched, median |error| {statistics.median(abs(e) for e in here):.0%}")
    print(f"  all: median |error| {statistics.median(abs(e) for e in everything):.0%} over {len(everything)} operators")
    print("\nkernel time by kind, measured / predicted (shipped calibration; matched operators):")
    for workload in data:
        kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for works, seconds in workload.matched.values():
            kinds[works[0].kind][0] += seconds
            kinds[works[0].kind][1] += predicted(works, shipped)
        print(f"  {workload.name:48s} " + "  ".join(f"{k} {m * 1e3:.2f}/{p * 1e3:.2f}" for k, (m, p) in kinds.items()))
    print(f"\nfitted on all:\n{full}")


if __name__ == "__main__":
    main()
