"""The analytic H100 memory of each ../shared/gpu-truth workload against the record, on this machine.

For each workload: the steady step's peak allocated bytes over ``max_memory_allocated``,
the reserved estimate over ``max_memory_reserved``, and the reserved bytes the allocator
model holds after the first step (its replay of the set-up and first step, before the
steady one) beside the record's first-step figure: where the two models part, in the
first step or in the steady one.

    python benchmarks/memory_vs_h100.py [WORKLOAD ...]
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gpu_truth
from pytest_modelprof import profile
from pytest_modelprof.engine.meters import memory as memory_meter
from pytest_modelprof.engine.targets.allocator import reserved_bytes

MiB = 1 << 20


def main() -> None:
    warnings.filterwarnings("ignore")
    if not gpu_truth.available():
        raise SystemExit("../shared/gpu-truth is not beside this checkout")
    records = gpu_truth.records()
    names = [name for name in sorted(records) if len(sys.argv) < 2 or name in sys.argv[1:]]
    histories: list[list[tuple[Any, int]]] = []
    stock = memory_meter.MemoryMeter._allocator_history

    def keep(self: Any, workspaces: list[int]) -> list[tuple[Any, int]]:
        history: list[tuple[Any, int]] = stock(self, workspaces)
        histories.append(history)
        return history

    memory_meter.MemoryMeter._allocator_history = keep  # type: ignore[method-assign]
    print(f"{'workload':48s} {'peak':>6s} {'reserved':>9s}   reserved after the first step, model / record (MiB)")
    try:
        for name in names:
            model, inputs, keywords = gpu_truth.workload(name)
            start = time.perf_counter()
            result = profile(model, inputs, target="h100", **keywords)
            seconds = time.perf_counter() - start
            history = histories[-1]
            # the set-up and first step: up to the last event of the first step's replay
            first_events = 1 + max(i for i, (key, _) in enumerate(history) if isinstance(key, tuple) and key[0] in ("first", "workspace"))
            record = records[name]
            peak = result.peak_memory_bytes / record["steady_step"]["max_allocated"]
            reserved = result.memory.estimates["reserved_bytes"] / record["steady_step"]["max_reserved"]
            first = reserved_bytes(history[:first_events]) / MiB
            measured_first = record["first_step"]["max_reserved"] / MiB
            print(f"{name:48s} {peak:6.3f} {reserved:9.3f}   {first:7.0f} / {measured_first:7.0f}  ({seconds:.1f} s)")
    finally:
        memory_meter.MemoryMeter._allocator_history = stock  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
