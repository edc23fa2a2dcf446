"""The kernel model on GPUs it was not fitted on: leave-one-GPU-out on NeuSight's measured kernel times.

For each of the five GPUs of pytest_modelprof/data/kernel-data (P4, P100, T4, V100, A100 PCIe), the kernel
model's constants are fitted on the measurements of the other four and the kernels of the nine H100 steps
of pytest_modelprof/data/gpu-truth (``calibrate.fit_kernels``: one set of constants for every GPU, each GPU
only its spec-table figures), as the shipped calibration is fitted, and the held-out GPU's measurements are
predicted. Printed: the median and 90th-percentile |error| per kernel class and GPU, the median over the
five held-out GPUs beside NeuSight's own out-of-distribution per-op errors, and the constants fitted on all.

The data's protocol times one op at a time with CUDA events, and its smallest ops take 25-60 us: that fixed
cost, the same for every op of a class, is fitted with the constants (``overhead``, per class) and added to
each predicted kernel time. Matrix products and convolutions run as in the measurements: fp32 with TF32 off.

    python benchmarks/kernel_data.py [--per-file N] [--fit-per-file N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import neusight  # noqa: E402
from benchmarks.predicted_vs_h100 import H100, workloads  # noqa: E402
from pytest_modelprof.engine.calibrate import KernelFit, fit_kernels  # noqa: E402

LONG = 100e-6  # measurements this long or longer: the kernel's own time, not the protocol's fixed cost, decides them


def errors(model: KernelFit, data: list[neusight.Measured], shortest: float = 0.0) -> dict[str, list[float]]:
    """|error| of each measurement (of ``shortest`` seconds or more) of its predicted time, by kernel class."""
    out: dict[str, list[float]] = defaultdict(list)
    for m in data:
        if m.seconds >= shortest:
            out[m.kind].append(abs(model.seconds(m.gpu, m.work, m.kind) / m.seconds - 1))
    return out


def table(title: str, held_out: dict[str, dict[str, list[float]]], kinds: list[str]) -> dict[str, float]:
    """Print median and 90th-percentile |error| per GPU and class; the median over GPUs per class."""
    print(f"\n{title}\n{'held out':16s}" + "".join(f"{k:>22s}" for k in kinds))
    medians: dict[str, list[float]] = defaultdict(list)
    for gpu, here in held_out.items():
        cells = ""
        for kind in kinds:
            e = sorted(here.get(kind, ()))
            if e:
                medians[kind].append(statistics.median(e))
                cells += f"{statistics.median(e):>12.1%} p90 {e[int(0.9 * len(e))]:>5.0%}"
            else:
                cells += f"{'-':>22s}"
        print(f"{gpu:16s}{cells}")
    return {kind: statistics.median(values) for kind, values in medians.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-file", type=int, default=1000, help="measurements of each op and GPU predicted (sampled)")
    parser.add_argument("--fit-per-file", type=int, default=150, help="... of which this many are fitted on")
    options = parser.parse_args()
    start = time.perf_counter()
    data = neusight.measurements(options.per_file)
    fitting = neusight.measurements(options.fit_per_file, seed=1)
    gpus = sorted({m.gpu.name for m in data if m.kind != "conv"})
    steps = [(H100, w) for w in workloads()]
    kinds = ["bmm", "linear", "elementwise", "softmax", "layer norm", "conv"]
    print(f"{len(data)} measurements predicted, {len(fitting)} fitted on ({time.perf_counter() - start:.0f} s to read)\n")
    every: dict[str, dict[str, list[float]]] = {}
    long: dict[str, dict[str, list[float]]] = {}
    for gpu in gpus:
        # the A100 80GB PCIe's convolutions stand in for the 40GB's: both are the A100 left out
        family = {gpu, "a100-pcie-80gb"} if gpu == "a100-pcie-40gb" else {gpu}
        model = fit_kernels([(m.gpu, m.work, m.kind, m.seconds) for m in fitting if m.gpu.name not in family], steps)
        here = [m for m in data if m.gpu.name in family]
        every[gpu], long[gpu] = errors(model, here), errors(model, here, LONG)
    all_medians = table("every measurement: |error| of the GPU left out", every, kinds)
    long_medians = table(f"measurements of {LONG * 1e6:.0f} us or more (the kernel, not the protocol's fixed cost)", long, kinds)
    print("\nmedian |error| over the held-out GPUs, every measurement and the long ones")
    print("(NeuSight's out-of-distribution per-op error beside them):")
    for kind in kinds:
        anchor = neusight.NEUSIGHT.get(kind)
        beside = f"   NeuSight {anchor:.1%}" if anchor is not None else ""
        print(f"  {kind:12s} {all_medians[kind]:6.1%} {long_medians.get(kind, float('nan')):6.1%}{beside}")
    everything = fit_kernels([(m.gpu, m.work, m.kind, m.seconds) for m in fitting], steps)
    print(f"\nfitted on all five GPUs:\n{everything}")
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
