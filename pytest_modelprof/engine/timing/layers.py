"""Per-module and per-operator times of a workload, from :mod:`torch.profiler`.

Each module's forward runs inside a ``record_function`` range named after its dotted
path, and each backward node is given to the module whose forward created it (through
the autograd sequence number, as the meters' attribution does). Like latency, layer times are
measured on real tensors apart from the counting meters.
"""

from __future__ import annotations

import bisect
import contextlib
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

from ...results import ModuleStats, OpTime
from ..observe.modules import ROOT, ModuleTracker, StackKey

_LABEL = "modelprof::"
_CALL = "modelprof-call"
_TIME_FIELDS = (
    "forward_seconds",
    "backward_seconds",
    "self_forward_seconds",
    "self_backward_seconds",
    "forward_device_seconds",
    "backward_device_seconds",
)
_BACKWARD_NODE = "autograd::engine::evaluate_function: "


class _Labels:
    """Global module hooks that wrap every module's forward in a profiler range named by its path."""

    def __init__(self, tracker: ModuleTracker) -> None:
        self.tracker = tracker
        self.open: list[tuple[nn.Module, Any]] = []
        self.handles: list[Any] = []

    def __enter__(self) -> _Labels:
        # registered after the tracker's hooks: the pre-hook sees the path the tracker just pushed
        self.handles = [register_module_forward_pre_hook(self._enter), register_module_forward_hook(self._exit)]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        while self.open:
            self.open.pop()[1].__exit__(None, None, None)

    def _enter(self, module: nn.Module, args: Any) -> None:
        frames = self.tracker.frames
        if not frames or frames[-1][1] is not module:
            return
        label = torch.autograd.profiler.record_function(_LABEL + frames[-1][0])
        label.__enter__()  # type: ignore[no-untyped-call]
        self.open.append((module, label))

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if any(m is module for m, _ in self.open):
            while self.open:
                opened, label = self.open.pop()
                label.__exit__(None, None, None)
                if opened is module:
                    break


@dataclass
class LayerTimes:
    """Per-module and per-operator times of profiled calls, and the profiler that measured them.

    ``modules`` maps a dotted path to its times (the ``*_seconds`` fields of
    :class:`ModuleStats`); ``ops`` lists operator times per module and phase;
    ``events`` is the profiler's raw event list (``torch.autograd.profiler_util.EventList``).
    Seconds are per call of the workload.
    """

    modules: dict[str, dict[str, float]]
    ops: list[OpTime]
    events: Any
    calls: int

    def apply(self, modules: list[ModuleStats]) -> None:
        for module in modules:
            times = self.modules.get(module.path, {})
            for name in _TIME_FIELDS:
                setattr(module, name, times.get(name, 0.0))


def layer_times(
    step: Callable[[], Any], named_modules: list[tuple[str, nn.Module]], device: torch.device, calls: int, trace: str | Path | None = None
) -> LayerTimes:
    """Run ``step`` ``calls`` times under :mod:`torch.profiler` and attribute its time to modules."""
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    tracker = ModuleTracker(named_modules)
    # one profiled call more, whose events are dropped: the profiler's own start-up lands in
    # it (a warm-up schedule would restart the profiler, a second cycle)
    with one_cycle_profile(activities=activities) as profiler:
        with tracker, _Labels(tracker):
            for _ in range(calls + 1):
                with torch.autograd.profiler.record_function(_CALL):
                    step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
    if trace is not None:
        profiler.export_chrome_trace(str(trace))
    return _attribute(profiler.events(), tracker, calls)  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def one_cycle_profile(**options: Any) -> Iterator[torch_profile]:
    """:class:`torch.profiler.profile` for one cycle (no schedule). PyTorch 2.11 warns as every profiler
    starts that a cycle's events are cleared at its end (later releases warn only as a second cycle
    starts): with one cycle no event is lost, and the warning must not fail a user's run under
    ``-W error``."""
    with contextlib.ExitStack() as stack:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Warning: Profiler clears events", UserWarning)
            profiler = stack.enter_context(torch_profile(**options))
        yield profiler


def _attribute(events: Any, tracker: ModuleTracker, calls: int) -> LayerTimes:
    """Module times: those of the median profiled call (one slow call moves nothing);
    operator times: the mean per call (so that they add up to their totals). The first
    profiled call is the profiler's warm-up: its events are left out."""
    us = 1e-6
    starts = sorted(e.time_range.start for e in events if e.name == _CALL)
    per_call: list[dict[str, dict[str, float]]] = [defaultdict(lambda: defaultdict(float)) for _ in starts[1:]]
    ops: dict[tuple[str, str, str], OpTime] = {}
    for event in events:
        name = event.name
        call = bisect.bisect_right(starts, event.time_range.start) - 2  # -1: in the warm-up call, or before it
        if name == _CALL or name.startswith("ProfilerStep") or call < 0:
            continue
        times = per_call[call]
        if name.startswith(_LABEL):
            if _owner(event)[0] == "forward":  # (a range in the backward pass is recomputation: its node counts it)
                path = name[len(_LABEL) :]
                child = sum(c.cpu_time_total for c in _child_labels(event))
                times[path]["forward_seconds"] += event.cpu_time_total * us
                times[path]["self_forward_seconds"] += (event.cpu_time_total - child) * us
            continue
        phase, key = _owner(event)
        if name.startswith(_BACKWARD_NODE):
            key = _node_key(event, tracker)
            if key:
                times[key[-1]]["self_backward_seconds"] += event.cpu_time_total * us
                for path in key:
                    times[path]["backward_seconds"] += event.cpu_time_total * us
            continue
        if phase == "backward":
            key = _node_key(_backward_node(event), tracker)
        elif not key:
            phase = "other"  # outside the model: the loss, the optimizer step
        device_self = event.self_device_time_total * us
        for path in key:
            times[path][f"{phase}_device_seconds"] += device_self
        row = ops.setdefault((name, phase, key[-1] if key else ""), OpTime(name, phase, key[-1] if key else ""))
        row.calls += event.count
        row.seconds += event.cpu_time_total * us
        row.self_seconds += event.self_cpu_time_total * us
        row.device_seconds += event.device_time_total * us
        row.self_device_seconds += device_self
    for row in ops.values():  # per call of the workload
        row.calls /= calls
        row.seconds /= calls
        row.self_seconds /= calls
        row.device_seconds /= calls
        row.self_device_seconds /= calls
    # every module's figures from one call, the median one by the model's total: robust to a
    # slow call, and the figures still add up (a module's time is its children's plus its own)
    totals = [times[ROOT[0]].get("forward_seconds", 0.0) + times[ROOT[0]].get("backward_seconds", 0.0) for times in per_call]
    middle = per_call[sorted(range(len(totals)), key=totals.__getitem__)[len(totals) // 2]] if per_call else {}
    modules = {path: dict(values) for path, values in middle.items()}
    op_rows = sorted(ops.values(), key=lambda r: (-r.self_seconds, r.op, r.phase, r.module))
    return LayerTimes(modules, op_rows, events, calls)


def _child_labels(event: Any) -> Iterator[Any]:
    """The module ranges nested directly in ``event`` (through any ops between)."""
    for child in event.cpu_children:
        if child.name.startswith(_LABEL):
            yield child
        else:
            yield from _child_labels(child)


def _owner(event: Any) -> tuple[str, StackKey]:
    """The phase of ``event`` and, in the forward pass, the module stack of the ranges around it."""
    labels: list[str] = []
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(_BACKWARD_NODE):
            return "backward", ()
        if parent.name.startswith(_LABEL):
            labels.append(parent.name[len(_LABEL) :])
        parent = parent.cpu_parent
    return "forward", tuple(reversed(labels))


def _backward_node(event: Any) -> Any:
    parent = event.cpu_parent
    while parent is not None and not parent.name.startswith(_BACKWARD_NODE):
        parent = parent.cpu_parent
    return parent


def _node_key(event: Any, tracker: ModuleTracker) -> StackKey:
    if event is None or event.sequence_nr < 0:
        return ROOT
    return tracker.key_of_sequence_nr(event.sequence_nr) or ROOT
