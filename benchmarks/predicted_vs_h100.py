"""Predicted step times against real H100 steps (../shared/gpu-truth/h100.json), and the fit behind them.

For each of the shared workloads, on this CPU-only machine: the analytic step on target
h100, each op's features (kind, FLOPs at peak, bytes, kernels) and the measured kernel
time per kind of kernel. A calibration (efficiency per kind, the kernel floor, the host's
time per op) is fitted to measured *kernel* times and step times; each workload is then
predicted by a calibration fitted without it (leave one out). Printed: the step table
(measured, predicted with the shipped calibration, predicted leaving it out, errors),
per kind the measured and predicted kernel time, and the fitted calibration to ship.

    python benchmarks/predicted_vs_h100.py
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import gpu_truth  # noqa: E402
from pytest_modelprof import GPUS, profile  # noqa: E402
from pytest_modelprof.engine.meters import Meter  # noqa: E402
from pytest_modelprof.engine.meters.flops import FormulaTable  # noqa: E402
from pytest_modelprof.engine.meters.predicted import op_features  # noqa: E402
from pytest_modelprof.engine.targets.cost import KINDS, StepClock, kind_of  # noqa: E402
from pytest_modelprof.engine.targets.gpus import Calibration  # noqa: E402

H100 = GPUS["h100"]


class Features(Meter):
    """Each op in order: name, kind, FLOPs, bytes, dtype, kernels."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, str, int, int, torch.dtype, int]] = []
        self.formulas = FormulaTable()

    def op(self, op) -> None:  # type: ignore[no-untyped-def]
        self.ops.append(op_features(op, self.formulas))


def workloads() -> dict[str, tuple[list, dict]]:
    out = {}
    for name, record in gpu_truth.records().items():
        model, inputs, keywords = gpu_truth.workload(name)
        features = Features()
        profile(model, inputs, target="h100", flops=False, memory=False, meters=[features], **keywords)
        out[name] = (features.ops, record)
    return out


def measured_by_kind(record: dict) -> dict[str, float]:
    kinds = dict.fromkeys(KINDS, 0.0)
    for op in record["ops"]:
        name = op["op"].replace("::", ".")
        kind = kind_of(name)
        if kind == "conv" and _depthwise(name, op["shapes"]):
            kind = "conv_grouped"
        kinds["memory" if kind == "none" else kind] += op["self_device_us"] * 1e-6
    return kinds


def _depthwise(name: str, shapes: str) -> bool:
    """A recorded convolution whose weight has one input channel per group and several output channels."""
    try:
        weight = json.loads(shapes)[2 if name == "aten.convolution_backward" else 1]
    except (ValueError, IndexError):
        return False
    return len(weight) >= 3 and weight[1] == 1 and weight[0] > 1


def replay(ops: list, calibration: Calibration) -> tuple[StepClock, list[float]]:
    """The step's ops issued on an H100 under ``calibration``: the clock, and each op's kernel seconds."""
    clock = StepClock(H100, calibration)
    return clock, [clock.issue(name, kind, flops, nbytes, dtype, kernels)[0] for name, kind, flops, nbytes, dtype, kernels in ops]


def predicted_by_kind(ops: list, calibration: Calibration) -> dict[str, float]:
    kinds = dict.fromkeys(KINDS, 0.0)
    for (_, kind, *_rest), seconds in zip(ops, replay(ops, calibration)[1]):
        if kind != "none":
            kinds[kind] += seconds
    return kinds


def step_seconds(ops: list, calibration: Calibration) -> float:
    return replay(ops, calibration)[0].seconds


# the names torch.profiler records for the kernels behind the ops the engine sees
ALIASES = {
    "aten.cudnn_convolution": "aten.convolution",
    "aten._conv_depthwise2d": "aten.convolution",
    "aten._cudnn_attention_forward": "aten._scaled_dot_product_cudnn_attention",
    "aten._cudnn_attention_backward": "aten._scaled_dot_product_cudnn_attention_backward",
    "aten.copy_": "aten._to_copy",
}


def per_op_errors(ops: list, record: dict, calibration: Calibration) -> list[float]:
    """For the step's 20 most expensive recorded operators (by name, over all shapes), the relative
    error of the predicted kernel time of the ops of that name."""
    measured: dict[str, float] = {}
    for op in record["ops"]:
        name = op["op"].replace("::", ".")
        name = ALIASES.get(name, name)
        measured[name] = measured.get(name, 0.0) + op["self_device_us"] * 1e-6
    predicted: dict[str, float] = {}
    for (name, *_rest), seconds in zip(ops, replay(ops, calibration)[1]):
        predicted[name] = predicted.get(name, 0.0) + seconds
    top = sorted(measured, key=lambda n: -measured[n])[:20]
    return [predicted[n] / measured[n] - 1 for n in top if predicted.get(n)]


def fit(data: dict[str, tuple[list, dict]]) -> Calibration:
    """Efficiencies and floor from kernel times by kind (squared log errors, weighted by the measured
    time), then the host's time per op from step times."""
    calibration = Calibration()
    measured = {name: measured_by_kind(record) for name, (_, record) in data.items()}

    def loss_of(candidate: Calibration, kinds: tuple[str, ...]) -> float:
        total = 0.0
        for name, (ops, _) in data.items():
            predicted = predicted_by_kind(ops, candidate)
            for kind in kinds:
                if measured[name][kind] > 0 and predicted[kind] > 0:  # weighted by the time at stake
                    total += measured[name][kind] * math.log(predicted[kind] / measured[name][kind]) ** 2
        return total

    grid = [0.05 * i for i in range(1, 21)]
    floors = [1e-6 * f for f in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8)]
    best = min(
        ((e, f) for e in grid for f in floors),
        key=lambda ef: loss_of(
            dataclasses.replace(calibration, efficiency={**calibration.efficiency, "memory": ef[0]}, kernel_seconds=ef[1]), ("memory",)
        ),
    )
    calibration = dataclasses.replace(calibration, efficiency={**calibration.efficiency, "memory": best[0]}, kernel_seconds=best[1])
    for kind in ("norm", "norm_backward"):
        e = min(grid, key=lambda e: loss_of(dataclasses.replace(calibration, efficiency={**calibration.efficiency, kind: e}), (kind,)))
        calibration = dataclasses.replace(calibration, efficiency={**calibration.efficiency, kind: e})
    halves = [10.0**k for k in range(6, 12)]
    for kind in ("matmul", "conv", "conv_grouped", "attention", "rnn"):
        if not any(measured[name][kind] > 0 for name in data):
            continue
        e, half = min(
            ((e, h) for e in grid for h in halves),
            key=lambda eh: loss_of(
                dataclasses.replace(
                    calibration, efficiency={**calibration.efficiency, kind: eh[0]}, half_flops={**calibration.half_flops, kind: eh[1]}
                ),
                (kind,),
            ),
        )
        calibration = dataclasses.replace(
            calibration, efficiency={**calibration.efficiency, kind: e}, half_flops={**calibration.half_flops, kind: half}
        )
    hosts = [1e-6 * h for h in range(2, 41)]
    host = min(
        hosts,
        key=lambda h: sum(
            abs(
                math.log(
                    step_seconds(ops, dataclasses.replace(calibration, host_seconds=h, view_seconds=h / 4))
                    / (record["step_ms_median"] / 1e3)
                )
            )
            for ops, record in data.values()
        ),
    )
    return dataclasses.replace(
        calibration,
        host_seconds=host,
        view_seconds=host / 4,
        calibrated=True,
        source=f"fitted on {len(data)} H100 steps (../shared/gpu-truth, torch 2.11)",
    )


def main() -> None:
    data = workloads()
    shipped = H100.calibration
    full = fit(data)
    print(f"{'workload':48s} {'measured':>9s} {'shipped':>9s} {'err':>7s} {'left out':>9s} {'err':>7s}  (ms)")
    errors, shipped_errors = [], []
    for name, (ops, record) in data.items():
        rest = {k: v for k, v in data.items() if k != name}
        left_out = step_seconds(ops, fit(rest)) * 1e3
        now = step_seconds(ops, shipped) * 1e3
        truth = record["step_ms_median"]
        errors.append(left_out / truth - 1)
        shipped_errors.append(now / truth - 1)
        print(f"{name:48s} {truth:9.3f} {now:9.3f} {now / truth - 1:+7.1%} {left_out:9.3f} {left_out / truth - 1:+7.1%}")
    print(
        f"shipped calibration ({shipped.source}): median |error| {statistics.median(abs(e) for e in shipped_errors):.1%}, "
        f"max {max(abs(e) for e in shipped_errors):.1%}"
    )
    print(f"leave one out: median |error| {statistics.median(abs(e) for e in errors):.1%}, max {max(abs(e) for e in errors):.1%}")
    print("\nkernel time by kind, measured / predicted with the fit on all (ms):")
    for name, (ops, record) in data.items():
        m, p = measured_by_kind(record), predicted_by_kind(ops, full)
        print(f"  {name:48s} " + "  ".join(f"{k} {m[k] * 1e3:.2f}/{p[k] * 1e3:.2f}" for k in KINDS if m[k] or p[k]))
    print("\nthe 20 most expensive operators of each step, measured vs predicted kernel time (shipped calibration):")
    all_errors = []
    for name, (ops, record) in data.items():
        errors_here = per_op_errors(ops, record, shipped)
        all_errors.extend(errors_here)
        print(f"  {name:48s} {len(errors_here):2d} matched, median |error| {statistics.median(abs(e) for e in errors_here):.0%}")
    print(f"  all: median |error| {statistics.median(abs(e) for e in all_errors):.0%} over {len(all_errors)} operators")
    print(f"\nfitted on all: {full}")


if __name__ == "__main__":
    main()
