"""Latency on real tensors, per-module and per-operator times, and the machine they were measured on.

Timing runs apart from the counting meters: no dispatch mode, no hooks and no
profiler are active while a repeat is timed, so their overhead never reaches the
figure.

How a latency is measured (:func:`measure_latency`):

1. Two checking calls run under a recording dispatch mode: a model that draws random
   numbers (dropout in train mode) or runs different operators on two calls with the
   same inputs gets a :class:`LatencyWarning`, and so does an inference output that
   changes between the two calls.
2. Warm-up calls, timed, estimate one call; a repeat then runs enough calls back to
   back to last at least 5 ms (timer resolution and launch jitter vanish), and
   the number of repeats fills the time budget.
3. Repeats of the model alternate with repeats of a fixed calibration workload (a
   convolution and a matrix product of fixed size) on the same device. The ratio of
   each repeat to the calibration next to it cancels what the machine does to both:
   frequency scaling, a neighbour on a shared runner, a slower machine of the same
   kind. On this project's 2-core CI machine, medians of ResNet-18 vary by about 25%
   from process to process while their ratio to the calibration varies by about 4%.

4. While the repeats run, the scheduler's counters tell how long the process's threads
   waited, ready to run, for a CPU (``LatencyReport.cpu_wait``). The calibration cancels
   a uniformly slower machine, not one shared with busy processes: threads that wait
   for a CPU (and for each other at every parallel region) slow a multi-threaded model
   far more than the small calibration, so such a run is marked disturbed
   (``LatencyReport.disturbance``) and the budget check does not judge it. Found
   already in the warm-up, it also keeps the run to its time budget.

On CPU a repeat is timed with :func:`time.perf_counter`; on CUDA with events recorded
on the stream around it, read after a synchronisation (no host timing of async work).

Per-module and per-operator times are :mod:`.layers`'s.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch._ops import HigherOrderOperator
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..._format import plain
from ...results import LatencyReport, cpu_was_shared
from ..errors import ProfileError
from ..ops import bound_arguments

MIN_SAMPLE_SECONDS = 5e-3  # a repeat runs calls back to back until it lasts this long
MAX_REPEATS = 100_000
MIN_REPEATS_SHARED = 3  # on a CPU found shared in the warm-up: enough for a median, not min_repeats


class LatencyWarning(UserWarning):
    """The latency was measured, but may not mean what it seems (see the message)."""


@dataclass(frozen=True)
class Timing:
    """How latency is measured; ``profile(..., latency=Timing(...))``.

    ``budget`` is the time, in seconds, that the timed repeats (model and calibration)
    may take; ``repeats`` fixes their number instead. ``warmup`` calls run first,
    untimed. ``calibrate=False`` skips the calibration workload (raw seconds only).
    ``layers=True`` adds per-module and per-operator times from ``layer_repeats``
    profiled calls; ``trace`` writes those calls as a Chrome/Perfetto trace (JSON).
    """

    budget: float = 2.0
    repeats: int | None = None
    warmup: int = 3
    min_repeats: int = 10
    calibrate: bool = True
    layers: bool = False
    layer_repeats: int = 3
    trace: str | Path | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.budget, (int, float)) and math.isfinite(self.budget) and self.budget > 0):
            raise ValueError(f"the timing budget must be a positive number of seconds, got {self.budget!r}")
        if self.repeats is not None and (not isinstance(self.repeats, int) or self.repeats < 1):
            raise ValueError(f"repeats must be a whole number of at least 1, got {self.repeats!r}")
        if not isinstance(self.min_repeats, int) or self.min_repeats < 1:
            raise ValueError(f"min_repeats must be a whole number of at least 1, got {self.min_repeats!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be a whole number of calls (0 or more), got {self.warmup!r}")
        if not isinstance(self.layer_repeats, int) or self.layer_repeats < 1:
            raise ValueError(f"layer_repeats must be a whole number of at least 1, got {self.layer_repeats!r}")


def machine_name(device: torch.device) -> str:
    """What a latency was measured on, as a budget key: ``cpu-amd-epyc-2t``, ``cuda-nvidia-h100-80gb-hbm3``."""
    if device.type == "cuda":
        return _slug(f"cuda {torch.cuda.get_device_name(device)}")
    return _slug(f"cpu {_cpu_model()} {torch.get_num_threads()}t")


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2]
    return platform.processor() or platform.machine() or "unknown"


def _slug(text: str) -> str:
    text = re.sub(r"\((r|tm)\)|\bcpu\b(?= @)|@|\bprocessor\b", " ", text, flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# workloads -----------------------------------------------------------------


class Clock:
    """Times a function on one device: perf_counter on CPU, events on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device

    def time(self, fn: Callable[[], Any], calls: int) -> float:
        """Seconds per call of ``calls`` back-to-back calls."""
        if not self.cuda:
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            return (time.perf_counter() - start) / calls
        begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        torch.cuda.synchronize(self.device)
        begin.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return float(begin.elapsed_time(end)) / 1e3 / calls


def cpu_wait_counters() -> tuple[int, int] | None:
    """Nanoseconds this process's threads have run and have waited, runnable, for a CPU
    (summed over ``/proc/self/task/*/schedstat``); None where the system does not tell."""
    run = wait = 0
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return None
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/schedstat", "rb") as handle:
                fields = handle.read().split()
        except OSError:
            continue  # a thread that ended since the listing
        if len(fields) >= 2:
            run += int(fields[0])
            wait += int(fields[1])
    return (run, wait) if run else None


def cpu_wait_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of runnable time spent waiting for a CPU between two readings."""
    if before is None or after is None:
        return None
    run, wait = max(after[0] - before[0], 0), max(after[1] - before[1], 0)
    return wait / (run + wait) if run + wait else None


def calibration_workload(device: torch.device) -> Callable[[], Any]:
    """A fixed reference workload on ``device``: a 3x3 convolution and a matrix product.

    Its size never changes, so its time measures the machine, not the model; it
    exercises the same kernels (convolution, GEMM, elementwise) as most models.
    """
    generator = torch.Generator(device="cpu").manual_seed(0)
    size = 1024 if device.type == "cuda" else 256
    image = torch.randn(1, 32, 56, 56, generator=generator).to(device)
    weight = torch.randn(32, 32, 3, 3, generator=generator).to(device)
    matrix = torch.randn(size, size, generator=generator).to(device)

    def run() -> None:
        with torch.no_grad():
            torch.conv2d(image, weight, padding=1).relu_()
            torch.mm(matrix, matrix)

    return run


class _Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the ops of a call, and the random ones among them (dropout, sampling)."""

    supports_higher_order_operators = True  # and passes them on (see observe/hops.py)

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[str] = []
        self.random: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if isinstance(func, HigherOrderOperator):
            return func(*args, **(kwargs or {}))
        name = str(func.overloadpacket)
        self.ops.append(name)
        if torch.Tag.nondeterministic_seeded in func.tags and _draws(func, args, kwargs or {}):
            self.random.add(f"aten.{name}" if "." not in name else name)
        return func(*args, **(kwargs or {}))


def _draws(func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a call of a seeded op draws random numbers: not with a probability of 0
    (``dropout_p=0`` of attention in train mode, ``p=0``) or ``train=False``."""
    for name, value in bound_arguments(func, args, kwargs).items():
        if name in ("dropout_p", "p") and isinstance(value, (int, float)) and value == 0:
            return False
        if name == "train" and value is False:
            return False
    return True


def _check_behaviour(step: Callable[[], Any], train: bool) -> list[str]:
    """Two recorded calls: what about the model makes its latency less than one clear figure."""
    problems = []
    first, second = _Recorder(), _Recorder()
    with first:
        out_first = step()
    with second:
        out_second = step()
    random = sorted(first.random | second.random)
    if random:
        mode = "in train mode (dropout?)" if train else "in eval mode"
        problems.append(
            f"the model draws random numbers {mode}: {', '.join(random)}; each repeat does work of a "
            "different draw and the latency is their median"
        )
    if first.ops != second.ops:
        problems.append(
            f"the model ran different operators on two calls with the same inputs ({len(first.ops)} vs "
            f"{len(second.ops)} ops): its latency depends on state or data, and the median mixes its paths"
        )
    elif not train and not random and not _same(out_first, out_second):
        problems.append("the model's output changed between two calls with the same inputs: it keeps state between calls")
    return problems


def _same(a: Any, b: Any) -> bool:
    left, right = tree_flatten(a)[0], tree_flatten(b)[0]
    if len(left) != len(right):
        return False
    for x, y in zip(left, right):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or not torch.equal(x, y):
                return False
    return True


# latency -------------------------------------------------------------------


def measure_latency(
    step: Callable[[], Any],
    device: torch.device,
    timing: Timing,
    *,
    train: bool,
    batch_size: int | None,
    clock: Clock | None = None,
    cpu_wait: Callable[[], tuple[int, int] | None] | None = None,
) -> LatencyReport:
    """Time ``step`` (one call of the workload, ready to run on ``device``) as described in the module docs.

    ``clock`` and ``cpu_wait`` are the timer and the scheduler's counters (tests pass their own).
    What makes the latency less than one clear figure is warned about (:class:`LatencyWarning`)
    when it concerns the model, and listed in ``LatencyReport.warnings`` in every case.
    """
    clock = clock or Clock(device)
    cpu_wait = cpu_wait or cpu_wait_counters
    problems = _check_behaviour(step, train)
    for problem in problems:
        warnings.warn(problem, LatencyWarning, stacklevel=3)
    estimate = math.inf
    warmup_counters = cpu_wait()
    for _ in range(max(timing.warmup, 1)):
        estimate = min(estimate, clock.time(step, 1))
    calls = max(1, math.ceil(MIN_SAMPLE_SECONDS / estimate)) if estimate > 0 else 1000
    calibrate = calibration_workload(device) if timing.calibrate else None
    calibration_calls = 0
    per_repeat = calls * estimate
    if calibrate is not None:
        calibrate()
        calibration_estimate = min(clock.time(calibrate, 1) for _ in range(3))
        calibration_calls = max(1, math.ceil(MIN_SAMPLE_SECONDS / calibration_estimate)) if calibration_estimate > 0 else 1000
        per_repeat += (calibration_calls + 1) * calibration_estimate
    shared = cpu_was_shared(cpu_wait_share(warmup_counters, cpu_wait()))  # over the warm-up and calibration calls
    if timing.repeats is not None:
        repeats = timing.repeats
    else:
        if timing.budget < estimate and not shared:  # (on a shared CPU, one call can take many times its own length)
            raise ProfileError(
                f"the timing budget of {plain(timing.budget)} s is shorter than one call of the workload "
                f"({_ms(estimate)}): give at least {_seconds(timing.min_repeats * per_repeat)}"
            )
        repeats = int(timing.budget / per_repeat)
        if repeats < timing.min_repeats:
            if shared:  # a run on a shared CPU will not decide anything: it keeps to its budget
                ran = max(repeats, MIN_REPEATS_SHARED)
                reason = "the CPU was shared during the warm-up"
            else:
                ran = timing.min_repeats
                reason = f"min_repeats={timing.min_repeats}"
            problems.append(
                f"the timing budget of {plain(timing.budget)} s allows {repeats} repeats of {_ms(per_repeat)}; "
                f"ran {ran} ({_seconds(ran * per_repeat)}): {reason}"
            )
            repeats = ran
        repeats = min(repeats, MAX_REPEATS)
    samples: list[float] = []
    calibration: list[float] = []
    counters = cpu_wait()
    for _ in range(repeats):
        samples.append(clock.time(step, calls))
        if calibrate is not None:
            calibrate()  # untimed: its data back in cache after the model's, so the model's footprint does not leak into it
            calibration.append(clock.time(calibrate, calibration_calls))
    return LatencyReport(
        device=str(device),
        machine=machine_name(device),
        samples=samples,
        calls_per_sample=calls,
        warmup=max(timing.warmup, 1) + 2,
        calibration=calibration,
        batch_size=batch_size,
        warnings=problems,
        cpu_wait=cpu_wait_share(counters, cpu_wait()),
    )


def _ms(seconds: float) -> str:
    return f"{plain(seconds * 1e3, 3)} ms" if seconds < 10 else _seconds(seconds)


def _seconds(seconds: float) -> str:
    return f"{plain(seconds, 2)} s"


def batch_size_of(args: Any) -> int | None:
    """The leading dimension of the first tensor input with one (the batch, by convention)."""
    for tensor in tree_flatten(args)[0]:
        if isinstance(tensor, torch.Tensor) and tensor.dim() > 0:
            return int(tensor.shape[0])
    return None
