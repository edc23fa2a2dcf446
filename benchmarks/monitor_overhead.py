"""What the MemoryMonitor costs a training loop when it is not printing, measured in one run.

A small CNN (two conv blocks and a classifier, batch 32 at 32 x 32) trains on the CPU
with SGD. Rounds of 20 iterations alternate between the plain loop and the same loop
with ``monitor.record()`` after each iteration (``print_period=0``: hooks and records,
no printing), each going first in every other round; the ratio of each monitored round to the plain round next to it is
printed, with their median (goal: under 1.05).

    python benchmarks/monitor_overhead.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pytest_modelprof import MemoryMonitor, stats  # noqa: E402

ITERATIONS = 20


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 10),
    )


def run(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list, monitor: MemoryMonitor | None) -> float:
    start = time.perf_counter()
    for x, y in batches:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if monitor is not None:
            monitor.record()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = small_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = [(torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))) for _ in range(ITERATIONS)]
    run(model, optimizer, batches, None)
    monitor = MemoryMonitor(model, optimizer)
    monitor.close()  # warm its code paths once, then measure fresh monitors
    ratios = []
    plain_times = []
    for round_ in range(args.rounds):

        def monitored_run() -> float:
            with MemoryMonitor(model, optimizer) as monitor:
                return run(model, optimizer, batches, monitor)

        if round_ % 2:  # alternate which goes first, so that an order effect cancels
            monitored = monitored_run()
            plain = run(model, optimizer, batches, None)
        else:
            plain = run(model, optimizer, batches, None)
            monitored = monitored_run()
        ratios.append(monitored / plain)
        plain_times.append(plain / ITERATIONS)
    threads = torch.get_num_threads()
    print(f"small CNN, batch 32 at 32x32, SGD, CPU ({threads} threads): {stats.median(plain_times) * 1e3:.2f} ms per iteration")
    print(f"monitored / plain, {args.rounds} interleaved rounds of {ITERATIONS} iterations: " + " ".join(f"{r:.3f}" for r in ratios))
    print(f"median {stats.median(ratios):.3f}x (goal: under 1.05x)")
    with MemoryMonitor(model, optimizer) as monitor:
        run(model, optimizer, batches[:1], monitor)
        costs = []
        for _ in range(200):
            start = time.perf_counter()
            monitor.record()
            costs.append(time.perf_counter() - start)
    record = stats.median(costs)
    print(f"record() alone: {record * 1e6:.0f} us, {record / stats.median(plain_times):.2%} of an iteration")


if __name__ == "__main__":
    main()
