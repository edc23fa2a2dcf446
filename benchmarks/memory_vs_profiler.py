"""Our memory figures for a real ResNet-50 training step (batch 8, CPU), against PyTorch's own.

Three records of the same steady-state step (SGD with momentum, one step taken before):

- torch.profiler's "[memory]" events (every allocation and free), plus what was resident
  before the step: the step's true peak;
- torch.profiler's memory timeline (``torch.profiler._memory_profiler``), which sorts
  every tensor into categories from the recorded graph: each category's maximum;
- ``torch.distributed._tools.mem_tracker.MemTracker``: its peak.

Ours (``profile(model, x, train=True, optimizer=...)``) is printed beside each, with the
relative difference.

    python benchmarks/memory_vs_profiler.py [--batch 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torchvision

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pytest_modelprof import profile  # noqa: E402
from pytest_modelprof.engine.timing.layers import one_cycle_profile  # noqa: E402


def step(model: torch.nn.Module, x: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def profiler_records(model: torch.nn.Module, x: torch.Tensor, optimizer: torch.optim.Optimizer) -> tuple[int, dict[str, int]]:
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    tensors = [*model.parameters(), *model.buffers(), x, *(v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))]
    resident = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}
    activities = [torch.profiler.ProfilerActivity.CPU]
    with one_cycle_profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step(model, x, optimizer)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    total = peak = 0
    for _, nbytes in events:
        total += nbytes
        peak = max(peak, total)
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(torch.device("cpu"))
    maxima = {category.name: max(row[index + 1] for row in sizes) for category, index in _CATEGORY_TO_INDEX.items() if category is not None}
    return sum(resident.values()) + peak, maxima


def mem_tracker_peak(model: torch.nn.Module, x: torch.Tensor, optimizer: torch.optim.Optimizer) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, optimizer, x)
    with tracker:
        step(model, x, optimizer)
    return int(
        sum(tracker.get_tracker_snapshot("peak")[torch.device("cpu")].values())
        - tracker.get_tracker_snapshot("peak")[torch.device("cpu")].get("Total", 0)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torchvision.models.resnet50()
    x = torch.randn(args.batch, 3, 224, 224)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step(model, x, optimizer)  # the momentum buffers now exist: every record sees a steady-state step
    recorded_peak, maxima = profiler_records(model, x, optimizer)
    ours = profile(model, x, train=True, optimizer=optimizer).memory
    assert ours is not None
    print(f"ResNet-50, batch {args.batch} at 224 x 224, SGD with momentum, one real CPU training step")
    difference = ours.peak_bytes / recorded_peak - 1
    print(f"peak: ours {ours.peak_bytes / 1e6:.2f} MB, profiler's [memory] events {recorded_peak / 1e6:.2f} MB: {difference:+.3%}")
    pairs = (
        ("parameters", "PARAMETER"),
        ("gradients", "GRADIENT"),
        ("optimizer_state", "OPTIMIZER_STATE"),
        ("activations", "ACTIVATION"),
    )
    for name, theirs in pairs:
        mine, other = ours.category_max[name], maxima[theirs]
        print(f"  {name:16} max: ours {mine / 1e6:10.3f} MB, profiler's {theirs:16} {other / 1e6:10.3f} MB: {mine / other - 1:+.4%}")
    rest = ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in maxima.items() if k not in dict(pairs).values())
    print(f"  (ours: temporaries {ours.category_max['temporaries'] / 1e6:.2f} MB; the profiler's other categories: {rest})")
    try:
        tracker = mem_tracker_peak(model, x, optimizer)
    except Exception as error:  # a private tool: report, don't fail
        print(f"MemTracker could not run here: {type(error).__name__}: {error}")
        return
    print(f"MemTracker peak {tracker / 1e6:.2f} MB: {tracker / recorded_peak - 1:+.3%} of the profiler's record")


if __name__ == "__main__":
    main()
