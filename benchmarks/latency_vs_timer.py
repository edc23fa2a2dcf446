"""Our latency against torch's own timer, and per-module times against the latency.

Two wall-clock relations that a test must not assert (a busy machine breaks them),
printed here as ratios measured in one run:

1. ``profile(..., latency=...)`` of a 512 x 512 matrix product against
   ``torch.utils.benchmark.Timer`` on the same model and input: the median of
   adjacent pairs, each side going first in turn (goal: within 5% of 1 on an idle machine).
2. The per-module times of ``Timing(layers=True)`` against the latency of the same
   profile: the top-level modules' sum and the root's time over the median latency,
   the median over rounds (goal: within 10% of 1; the profiler adds a few microseconds
   per operator).

    python benchmarks/latency_vs_timer.py [--pairs 25] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.benchmark import Timer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pytest_modelprof import Timing, profile


class MatMul(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.weight)


def versus_timer(pairs: int) -> list[float]:
    model, x = MatMul(512).eval(), torch.randn(512, 512)
    timer = Timer("model(x)", globals={"model": model, "x": x}, num_threads=torch.get_num_threads())

    def theirs() -> float:
        with torch.no_grad():  # many short blocks: blocked_autorange takes two or three long ones
            return statistics.median(timer.timeit(number=4).median for _ in range(15))

    def ours() -> float:
        result = profile(model, x, memory=False, latency=Timing(budget=0.1, calibrate=False))
        assert result.latency_seconds is not None
        return result.latency_seconds

    ratios = []
    for pair in range(pairs):
        if pair % 2:
            other, mine = theirs(), ours()
        else:
            mine, other = ours(), theirs()
        ratios.append(mine / other)
    return ratios


def layers_versus_latency(rounds: int) -> tuple[list[float], list[float]]:
    block = lambda: nn.Sequential(nn.Linear(1024, 1024), nn.ReLU())  # noqa: E731
    model, x = nn.Sequential(block(), block(), nn.Linear(1024, 1024)), torch.randn(512, 1024)
    children, root = [], []
    for _ in range(rounds):
        result = profile(model, x, memory=False, latency=Timing(budget=0.5, layers=True, layer_repeats=9))
        assert result.latency_seconds is not None
        children.append(sum(m.forward_seconds or 0.0 for m in result.modules if m.depth == 1) / result.latency_seconds)
        root.append((result.module("").forward_seconds or 0.0) / result.latency_seconds)
    return children, root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"{torch.get_num_threads()} threads")
    ratios = versus_timer(args.pairs)
    settled = ratios[4:] if len(ratios) > 8 else ratios  # the first pairs run while the machine settles
    every = ", ".join(f"{r:.2f}" for r in ratios)
    print(f"ours / torch Timer, 512x512 matmul: median {statistics.median(settled):.3f} over {len(settled)} pairs (all: {every})")
    children, root = layers_versus_latency(args.rounds)
    print(f"top-level module times / latency: median {statistics.median(children):.3f} over {args.rounds} rounds")
    print(f"root module time / latency: median {statistics.median(root):.3f}")


if __name__ == "__main__":
    main()
