"""The host's time per op by who issues it: Python with autograd recording, Python without, autograd's engine.

The predicted step time charges the host a time per op with a kernel (``Calibration.host_seconds``, fitted
to the step times of one GPU's host) and scales it by who issues the op (``gpus.HOST_RATIO``): a forward
under ``no_grad`` skips autograd's recording, and the backward pass's ops come from autograd's engine in
C++, without Python. Those ratios are the host's, not the GPU's: this script measures them on the CPU, with
tensors so small that the kernels take next to nothing, so that each op's time is its dispatch.

    python benchmarks/host_cost.py [--device cuda]

On a CUDA device the time per op includes the kernel's launch; the GPU, with kernels this small, keeps
up with the host, and each timing ends with a synchronisation. ``view`` is the time of a view or
metadata op (``view``, ``transpose``, ``expand``, ``unsqueeze``: no kernel) beside them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _ops(step: Callable[[], object]) -> int:
    counter = _Count()
    with counter:
        step()
    return counter.ops


def _seconds(step: Callable[[], object], repeats: int = 200) -> float:
    best = float("inf")
    for _ in range(5):
        _synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            step()
        _synchronize()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    device = torch.device(parser.parse_args().device)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(50):
        layers += [nn.Linear(8, 8), nn.LayerNorm(8), nn.GELU()]
    model = nn.Sequential(*layers).to(device)
    x = torch.randn(4, 8, device=device)

    def views() -> None:
        y = x
        for _ in range(50):
            y = y.view(8, 4).transpose(0, 1).unsqueeze(0).expand(2, 4, 8)[0].transpose(0, 1).view(4, 8)

    def recorded() -> torch.Tensor:
        out: torch.Tensor = model(x)
        return out

    def plain() -> None:
        with torch.no_grad():
            model(x)

    def both() -> None:
        recorded().sum().backward()  # type: ignore[no-untyped-call]

    forward_ops, backward_ops = _ops(recorded), _ops(both) - _ops(recorded)
    per_recorded = _seconds(recorded) / forward_ops
    per_plain = _seconds(plain) / _ops(plain)
    per_engine = (_seconds(both, 100) - _seconds(recorded)) / backward_ops
    per_view = _seconds(views) / _ops(views)
    per_op = {"recorded": per_recorded, "plain": per_plain, "engine": per_engine, "view": per_view}
    print(f"on {device}: per op: " + ", ".join(f"{who} {seconds * 1e6:.2f} us" for who, seconds in per_op.items()))
    print("ratios to recorded: " + ", ".join(f"{who} {seconds / per_recorded:.2f}" for who, seconds in per_op.items() if who != "recorded"))


if __name__ == "__main__":
    main()
