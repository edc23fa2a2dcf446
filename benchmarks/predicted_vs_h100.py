"""Predicted step times against real H100 steps (pytest_modelprof/data/gpu-truth/h100.json), and the fit behind them.

For each of the shared workloads, on this CPU-only machine: the analytic step on target
h100, matched to its record (``engine/calibrate.py``: ``observe``). The shipped calibration, one
for every GPU, is fitted (``calibrate.fit``, from the round defaults) in two stages: the kernel
model (efficiency per kind of kernel, the tile and reduction constants of a matrix product, batch
norm's bandwidth per channel, a kernel's fixed time) to the measured kernel time of each operator
and input shapes the records hold, weighted by that time, together with NeuSight's kernels timed one
at a time on five other GPUs (pytest_modelprof/data/kernel-data, ``benchmarks/neusight.py``); then
the host's time per op to the step times. The operators of one-layer probes measured on an H200 (convolutions,
products, normalisations, pooling, activations and attention at shapes no held-out step has) join the steps'
kernels in the first stage (``probe_kernels``), and so do the elementwise kernels an H100 ran by their operands'
layout and the sums it ran by the dimensions they reduce (h100-layout.json; ``gpu_truth.layout_kernels``). Last,
the constants of the kinds of kernel no H100 step runs (PyTorch's own batch-norm kernels, which a model in half
precision takes: ``calibrate.fit_kinds``), on the batch norms of the one-layer probes measured on an H200
(pytest_modelprof/data/gpu-truth).
Each workload is also predicted by a calibration fitted without it (leave one out: both
stages, its kernels and its step left out). Printed: the step table (measured, predicted
with the shipped calibration, with the fit on all, leaving it out), the per-operator
errors, and the fitted calibration to ship in ``engine/targets/catalog.py``.

    python benchmarks/predicted_vs_h100.py [--no-leave-one-out]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import gpu_truth, neusight  # noqa: E402
from pytest_modelprof import GPUS  # noqa: E402
from pytest_modelprof.engine.calibrate import Observed, errors, fit, fit_kinds, kernel_time, key  # noqa: E402
from pytest_modelprof.engine.targets.cost import NATIVE_NORM_KINDS  # noqa: E402
from pytest_modelprof.engine.targets.gpus import Calibration  # noqa: E402

H100 = GPUS["h100"]


def workloads() -> list[Observed]:
    return gpu_truth.observed(H100, gpu_truth.records())


def native_batch_norms() -> list[tuple]:
    """The batch norms of the H200's one-layer probes (pytest_modelprof/data/gpu-truth/h200-probes.json) that run
    PyTorch's own kernels (float16 and bfloat16 weights): the kinds no H100 step runs, as ``fit_kinds`` takes them.
    A probe whose batch norm has the input shape of one of PyTorch's batch norms in a held-out step is left out,
    so that those steps stay a check of the fit (benchmarks/predicted_vs_h200.py)."""

    def native_inputs(record: dict) -> set[tuple[int, ...]]:
        return {tuple(json.loads(op["shapes"])[0]) for op in record["ops"] if op["op"].startswith("aten::native_batch_norm")}

    held_out = set().union(*(native_inputs(r) for name, r in gpu_truth.records("h200").items() if gpu_truth.heldout(name)))
    probes = {
        name
        for name, record in gpu_truth.records("h200-probes").items()
        if name.startswith("probe-batchnorm-") and not name.endswith("-fp32") and not native_inputs(record) & held_out
    }
    return [
        (GPUS["h200"], works, seconds) for name, o in probes_observed().items() if name in probes for works, seconds in o.matched.values()
    ]


def probe_kernels() -> list[tuple]:
    """The operators of the H200's one-layer probes (pytest_modelprof/data/gpu-truth: h200-probes.json,
    h200-probes-b.json), each its works and measured kernel seconds, as ``fit`` takes them: convolutions,
    products, normalisations, pooling, activations and attention at shapes no step of the fit has. An operator
    whose name and input shapes one of the held-out steps has is left out, so that those steps stay a check of
    the fit (benchmarks/predicted_vs_h200.py); so are PyTorch's own batch norms, whose constants are fitted on
    their own (``native_batch_norms``)."""
    held_out = {
        key(op["op"], json.loads(op["shapes"]))
        for name, record in gpu_truth.records("h200").items()
        if gpu_truth.heldout(name)
        for op in record["ops"]
    }
    return [
        (GPUS["h200"], works, seconds)
        for o in probes_observed().values()
        for k, (works, seconds) in o.matched.items()
        if k not in held_out and not any(w.kind in NATIVE_NORM_KINDS for w in works)
    ]


@functools.cache
def probes_observed() -> dict[str, Observed]:
    """The H200's one-layer probes (h200-probes.json, h200-probes-b.json), each run analytically and matched to its
    record, once for both the fit's stages."""
    records = {**gpu_truth.records("h200-probes"), **gpu_truth.records("h200-probes-b")}
    return dict(zip(records, gpu_truth.observed(GPUS["h200"], records)))


def kernels(per_file: int = 60) -> list[tuple]:
    """NeuSight's kernels timed on five GPUs (``per_file`` of each op and GPU), as the fit takes them."""
    return [(m.gpu, m.work, m.kind, m.seconds) for m in neusight.measurements(per_file, seed=1)]


# ------------------------------------------------------------------ report


def per_operator_errors(workload: Observed, calibration: Calibration) -> list[float]:
    """For the step's 20 most expensive recorded operators (by name and shapes), the relative error of
    the predicted kernel time of the engine's ops with that name and shapes."""
    top = sorted(workload.measured, key=lambda k: -workload.measured[k])[:20]
    return [kernel_time(H100, workload.matched[k][0], calibration) / workload.measured[k] - 1 for k in top if k in workload.matched]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-leave-one-out", action="store_true")
    options = parser.parse_args()
    data = workloads()
    timed = kernels()
    # with the H200's one-layer probes, the H100's layout probes (h100-layout.json): elementwise kernels by their
    # operands' layout (the vector and the strided path) and sums by the dimensions they reduce; the H200's,
    # h200-layout.json, stay a check (tests/test_targets.py, tests/test_reduce_kernel.py)
    layouts = gpu_truth.layout_kernels(H100)
    sums = sum(1 for _, works, _ in layouts if works[0].launches)
    probes = probe_kernels() + layouts
    shipped = H100.calibration
    source = (
        f"fitted on {len(data)} H100 steps (the project's gpu-truth records, torch 2.11), {len(probes) - len(layouts)} operators of an "
        f"H200's one-layer probes, {len(layouts) - sums} elementwise kernels and {sums} sums of an H100's layout probes and "
        f"{len(timed)} kernels timed on five GPUs (NeuSight's); PyTorch's own batch-norm kernels on the H200's probes"
    )
    full = fit(H100, data, source=source, timed=timed, kernels=probes)  # from the round defaults, as each leave-one-out fit starts
    # then the kinds no H100 step runs, on the H200's probes (the steps' figures do not depend on them)
    full = fit_kinds(full, native_batch_norms(), NATIVE_NORM_KINDS)
    print(f"{'workload':48s} {'measured':>9s} {'shipped':>9s} {'err':>7s} {'fit':>9s} {'err':>7s} {'left out':>9s} {'err':>7s}  (ms)")
    table: dict[str, list[float]] = {"shipped": errors(H100, data, shipped), "fit": errors(H100, data, full)}
    if not options.no_leave_one_out:
        table["left out"] = [errors(H100, [w], fit(H100, [d for d in data if d is not w], timed=timed, kernels=probes))[0] for w in data]
    for i, workload in enumerate(data):
        truth = workload.step_seconds
        cells = "".join(f" {(1 + e[i]) * truth * 1e3:9.3f} {e[i]:+7.1%}" for e in table.values())
        print(f"{workload.name:48s} {truth * 1e3:9.3f}{cells}")
    for column, values in table.items():
        print(f"{column:>9s}: median |error| {statistics.median(abs(e) for e in values):.1%}, max {max(abs(e) for e in values):.1%}")
    print("\nthe 20 most expensive operators (name and shapes) of each step, predicted vs measured kernel time (the fit on all):")
    everything = []
    for workload in data:
        here = per_operator_errors(workload, full)
        everything.extend(here)
        print(f"  {workload.name:48s} {len(here):2d} matched, median |error| {statistics.median(abs(e) for e in here):.0%}")
    print(f"  all: median |error| {statistics.median(abs(e) for e in everything):.0%} over {len(everything)} operators")
    print("\nkernel time by kind, measured / predicted (the fit on all; matched operators):")
    for workload in data:
        kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for works, seconds in workload.matched.values():
            kinds[works[0].kind][0] += seconds
            kinds[works[0].kind][1] += kernel_time(H100, works, full)
        print(f"  {workload.name:48s} " + "  ".join(f"{k} {m * 1e3:.2f}/{p * 1e3:.2f}" for k, (m, p) in kinds.items()))
    print(f"\nfitted on all:\n{full}")


if __name__ == "__main__":
    main()
