"""cuDNN's recurrent layers on a GPU target against an H100 and an H200: the persistent kernels' constants, fitted again
from the records, and each probe's kernels, GPU time, host time and step, measured and predicted.

The records (``pytest_modelprof/data/gpu-truth/``, from ``launch_probes.py`` there): ``h100-rnn-algo.json`` (432 forward
layers: LSTM, GRU, tanh RNN; float32, float16, bfloat16; hidden 32 to 1024; batch 1 to 128; 16 steps), and
``h100-launch.json``, ``h200-launch.json`` (74 layers each, inference and a training step: one to three layers, one
and two directions, 32 and 256 steps, hidden 64 and batch 1 or hidden 1024 and batch 32). Each probe is profiled here
analytically on target ``h100`` (the H200 has the H100's SMs and clock; its bandwidth does not bound these).

    python benchmarks/recurrent.py [--fit]

``--fit`` prints the persistent kernels' constants fitted by least squares (relative error) on h100-rnn-algo.json's
and the launch files' forward persistent kernels, as ``engine/targets/recurrent.py`` ships them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pytest_modelprof import GPUS, profile  # noqa: E402
from pytest_modelprof.engine.calibrate import _Features  # noqa: E402
from pytest_modelprof.engine.targets.cost import StepClock  # noqa: E402
from pytest_modelprof.engine.targets.recurrent import GATES, algorithm_on  # noqa: E402
from pytest_modelprof.engine.targets.recurrent import kernels as recurrent_kernels  # noqa: E402

TRUTH = ROOT / "pytest_modelprof" / "data" / "gpu-truth"
H100 = GPUS["h100"]
MODES = {"LSTM": 2, "GRU": 3, "RNN": 1}


def predict(row: dict) -> tuple[float, float, float, int, str]:
    """The probe on target h100: step, host's issuing and GPU seconds, kernels, and the forward's algorithm."""
    dtype = getattr(torch, row["dtype"])
    with torch.device("meta"):
        cell = getattr(nn, row["cell"])
        model = cell(row["input"], row["hidden"], row["layers"], batch_first=True, bidirectional=row.get("bidirectional", False))
    model = model.to(dtype)
    x = torch.empty(row["batch"], row["seq"], row["input"], device="meta", dtype=dtype)
    features = _Features()
    keywords = {"train": True, "loss_fn": lambda out: out[0].float().sum()} if row.get("train") else {"train": False}
    profile(model, x, target=H100, flops=False, memory=False, meters=[features], **keywords)
    clock = StepClock(H100)
    count, chosen = 0, "standard"
    for work, _ in features.ops:
        clock.issue(work)
        if work.recurrent is not None:
            algo = algorithm_on(H100, work.recurrent)
            count += recurrent_kernels(work.recurrent, algo)
            chosen = algo if not work.recurrent.backward else chosen
        elif work.kind != "none" and work.on_device:
            count += work.kernels
    return clock.seconds, clock.issuing, clock.busy, count, chosen


def table() -> None:
    errors: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name in ("h100-launch", "h200-launch"):
        rows = json.loads((TRUTH / f"{name}.json").read_text())["rnn"]
        print(f"\n{name}: measured / predicted (us), target h100")
        print(f"{'probe':44s} {'algorithm':9s} {'step':>15s} {'host issuing':>15s} {'GPU':>15s} {'kernels':>11s}")
        for row in rows:
            step, host, gpu, count, chosen = predict(row)
            shape = f"{row['cell']} L{row['layers']}{' bi' if row['bidirectional'] else ''} s{row['seq']} {row['size']} {row['dtype']}"
            mode = "train" if row["train"] else "eval"
            cells = [(row["step_us"], step * 1e6), (row["issue_us"], host * 1e6), (row["kernel_us"], gpu * 1e6)]
            figures = " ".join(f"{m:7.0f}/{p:7.0f}" for m, p in cells)
            print(f"{shape + ' ' + mode:44s} {chosen:9s} {figures} {row['kernel_count']:5d}/{count:5d}")
            group = f"{chosen} {mode}"
            for label, (measured, predicted) in zip(("step", "host", "gpu"), cells):
                errors[label][group].append(predicted / measured - 1)
    print("\nmedian |error| (largest) by the forward's algorithm and mode:")
    for label, groups in errors.items():
        cells = (f"{g} {statistics.median(map(abs, v)):.0%} ({max(map(abs, v)):.0%}, {len(v)})" for g, v in sorted(groups.items()))
        print(f"  {label:5s} " + "   ".join(cells))


def fit() -> None:
    """The persistent kernels' constants: per kernel ``start + per_weight W + steps (step + step_weight W + per_gate gates)``
    cycles (W: gates x hidden^2), on CUDA cores and on tensor cores apart; the static algorithm's ``start + steps (step
    + per_sample batch)``; at the H100's boost clock."""
    small: dict[str, list[tuple[list[float], float]]] = defaultdict(list)
    static: list[tuple[list[float], float]] = []
    algo = json.loads((TRUTH / "h100-rnn-algo.json").read_text())["algo"]
    launch = [r for f in ("h100-launch", "h200-launch") for r in json.loads((TRUTH / f"{f}.json").read_text())["rnn"] if not r["train"]]
    clock = H100.boost_clock * 1e-6  # cycles per microsecond
    for row in (*algo, *launch):
        gates = GATES[MODES[row["cell"]]]
        weights, steps = gates * row["hidden"] ** 2, row["seq"]
        for name, (count, us) in row["kernels"].items():
            if "blockPersist_fp" in name:
                unit = "tensor_cores" if "HMMA" in name else "cuda_cores"
                small[unit].append(([1.0, weights, steps, steps * weights, steps * gates], us / count * clock))
        total = sum(us for name, (_, us) in row["kernels"].items() if "RNN_persist_fp" in name or "lstm_tile" in name)
        if total:
            static.append(([1.0, steps, steps * row["batch"]], total * clock))
    for label, data in (*small.items(), ("static", static)):
        a = torch.tensor([x for x, _ in data], dtype=torch.float64)
        y = torch.tensor([t for _, t in data], dtype=torch.float64)
        weighted = a / y[:, None]
        solution = torch.linalg.lstsq(weighted, torch.ones_like(y)).solution
        error = (a @ solution) / y - 1
        print(
            f"{label:12s} {len(data):4d} kernels: {', '.join(f'{v:.4g}' for v in solution.tolist())} cycles; "
            f"median |error| {error.abs().median():.1%}, largest {error.abs().max():.1%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fit", action="store_true")
    options = parser.parse_args()
    if options.fit:
        fit()
    table()


if __name__ == "__main__":
    main()
