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

``--by-kernel CLASS`` prints instead, for one kernel class, the shipped calibration's predicted over measured time
per GPU and kernel (the data's ``kernel_name``), over the measurements of 100 us or more, with the protocol's fixed
cost per op given by ``--overhead-us``: by default softmax's, 36.4 us; each class's is in the ``overhead`` of the fit on
all five GPUs, printed at the end of a full run (linear's 50.8 us). It shows where a class's misses come from
(docs/targets.md, "Predicted step time").

    python benchmarks/kernel_data.py [--per-file N] [--fit-per-file N]
    python benchmarks/kernel_data.py --by-kernel softmax [--overhead-us 36.4]
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


def by_kernel(kind: str, overhead: float) -> None:
    """Per GPU and kernel the data name, the shipped calibration's predicted / measured time of the class's
    measurements of :data:`LONG` or more: median, 10th and 90th percentile."""
    model = KernelFit(H100.calibration, {kind: overhead})
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    formulas = neusight.FormulaTable()
    with neusight.tf32_flags(matmul=False, cudnn=False):  # the protocol's: products in fp32
        for row in neusight.rows():
            seconds = float(row["ms"]) * 1e-3
            if neusight.CLASSES[row["op"]] != kind or seconds < LONG:
                continue
            gpu = neusight.GPUS[neusight.GPU_NAMES[row["gpu"]]]
            ratios[(gpu.name, row["kernel_name"])].append(model.seconds(gpu, neusight.work_of(row, formulas), kind) / seconds)
    fixed, long = overhead * 1e6, LONG * 1e6
    print(f"{kind}: predicted / measured, the shipped calibration, {fixed:.1f} us of fixed cost, measurements of {long:.0f} us or more")
    for (gpu, kernel), values in sorted(ratios.items()):
        values.sort()
        p10, p90 = values[len(values) // 10], values[9 * len(values) // 10]
        print(f"  {gpu:16s} {kernel[:60]:60s} {len(values):5d}  median {statistics.median(values):.2f}  p10 {p10:.2f}  p90 {p90:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-file", type=int, default=1000, help="measurements of each op and GPU predicted (sampled)")
    parser.add_argument("--fit-per-file", type=int, default=150, help="... of which this many are fitted on")
    parser.add_argument("--by-kernel", metavar="CLASS", help="per GPU and kernel, one class (e.g. softmax), the shipped calibration")
    parser.add_argument(
        "--overhead-us",
        type=float,
        default=36.4,
        help="the protocol's fixed cost per op, with --by-kernel (default: softmax's; a full run prints each class's)",
    )
    options = parser.parse_args()
    if options.by_kernel:
        by_kernel(options.by_kernel, options.overhead_us * 1e-6)
        return
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
