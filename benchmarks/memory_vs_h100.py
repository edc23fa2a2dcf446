"""The analytic H100 memory of each gpu-truth workload (pytest_modelprof/data/gpu-truth) against the record, on this machine.

For each workload: the steady step's peak allocated bytes over ``max_memory_allocated``,
the reserved estimate over ``max_memory_reserved``, and the reserved bytes the allocator
model holds after the first step (its replay of the set-up and first step, before the
steady one) beside the record's first-step figure: where the two models part, in the
first step or in the steady one.

    python benchmarks/memory_vs_h100.py [--cudnn DIRECTORY] [WORKLOAD ...]

cuDNN's convolution workspaces are those of the cuDNN that sizes them. The records ran cuDNN
9.19.0 (torch 2.11.0+cu130's pin); with ``--cudnn`` the benchmark runs again with the cuDNN
libraries in DIRECTORY loaded in place of PyTorch's own, to compare like with like:

    pip download --no-deps -d /tmp/cudnn nvidia-cudnn-cu13==9.19.0.56
    python -m zipfile -e /tmp/cudnn/*.whl /tmp/cudnn/x
    python benchmarks/memory_vs_h100.py --cudnn /tmp/cudnn/x/nvidia/cudnn/lib
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import gpu_truth
from pytest_modelprof import profile
from pytest_modelprof.engine.meters import memory as memory_meter
from pytest_modelprof.engine.targets import cudnn
from pytest_modelprof.engine.targets.allocator import reserved_bytes

MiB = 1 << 20


def dotted(version: int) -> str:
    """cuDNN's version number (major x 10000 + minor x 100 + patch) as it is written: 9.19.0."""
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


def with_cudnn(directory: str, arguments: list[str]) -> None:
    """Run this benchmark again with the cuDNN in ``directory`` loaded before PyTorch's."""
    libraries = [os.path.join(directory, name) for name in ("libcudnn.so.9", "libcudnn_graph.so.9")]
    missing = [path for path in libraries if not os.path.exists(path)]
    if missing:
        raise SystemExit(f"--cudnn {directory}: no {', '.join(missing)}")
    environment = dict(os.environ, LD_PRELOAD=":".join(libraries))
    environment["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [directory, os.environ.get("LD_LIBRARY_PATH")]))
    os.execve(sys.executable, [sys.executable, __file__, *arguments], environment)


def main() -> None:
    if "--cudnn" in sys.argv[1:-1]:
        at = sys.argv.index("--cudnn")
        with_cudnn(sys.argv[at + 1], sys.argv[1:at] + sys.argv[at + 2 :])
    warnings.filterwarnings("ignore")
    try:  # PyTorch checks the cuDNN it finds against its own once, and refuses another release that once
        torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
    except RuntimeError:
        pass
    if not gpu_truth.available():
        raise SystemExit("pytest_modelprof/data/gpu-truth is missing from this checkout")
    records = gpu_truth.records()
    names = [name for name in sorted(records) if len(sys.argv) < 2 or name in sys.argv[1:]]
    histories: list[list[tuple[Any, int]]] = []
    stock = memory_meter.MemoryMeter._allocator_history

    def keep(self: Any, workspaces: list[int]) -> list[tuple[Any, int]]:
        history: list[tuple[Any, int]] = stock(self, workspaces)
        histories.append(history)
        return history

    memory_meter.MemoryMeter._allocator_history = keep  # type: ignore[method-assign]
    library = cudnn.library()
    version = dotted(library.version) if library else "none"
    print(f"cuDNN {version} sizes the convolution workspaces (the records': {dotted(gpu_truth.CUDNN)})")
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
