"""A target's calibration, fitted to kernel and step times measured on that GPU.

A *record* is what a real step on the GPU measured (the format of
``pytest_modelprof/data/gpu-truth/h100.json``, and of what :func:`measure_probe` writes): the step's median
time (``step_ms_median``) and every ATen op's self device time by its input shapes
(``ops``: ``op``, ``shapes``, ``self_device_us``), as ``torch.profiler`` gives them. The
same workload run analytically on the target gives each op's :class:`~.targets.cost.Work`
(:func:`observe`); an op of the run and an operator of the record are matched by name
and the shapes of their inputs (:func:`key`).

:func:`fit` then fits the cost model in two stages, each a least-squares fit in log space
(Levenberg-Marquardt, bounded): the kernel model (each kind's efficiency, the product size
of half efficiency, batch norm's bandwidth per channel, pooling's elements per SM cycle, a
layer norm's cycles a row, its backward pass's weight-gradient blocks' elements per cycle, the shortest kernel) to the
matched operators' kernel times, weighted by their time; then the host's time per op (with
a kernel, and without: a view) to the step times.

``modelprof calibrate --target NAME -o FILE`` measures :data:`.probes.PROBES` (steps of small
models that run every kind of kernel) on the GPU at hand, fits, and writes a calibration
file (:func:`~.targets.catalog.save_calibration`) that ``target=FILE`` loads on any machine after.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple

import torch
from torch import nn

from .formulas import FormulaTable
from .meters import Meter, Op
from .meters.predicted import op_features
from .targets.cost import (
    COMPUTE_KINDS,
    MATH_OF,
    NORM_KINDS,
    POOL_KINDS,
    RATE_OF,
    ROW_NORMS,
    STAND_IN,
    StepClock,
    Work,
    gemm_half_key,
    kernel_seconds,
    math_unit,
)
from .targets.gpus import Calibration, GPUSpec, clock_fraction, simt_loss, threads_per_sm
from .targets.reduce_kernel import blocks_per_output

Key = tuple[str, tuple[tuple[int, ...], ...]]

# the names torch.profiler records for the kernels behind the ops the engine sees
ALIASES = {
    "aten.cudnn_convolution": "aten.convolution",
    "aten._conv_depthwise2d": "aten.convolution",
    "aten.clamp_min_": "aten.relu_",
    "aten.copy_": "aten._to_copy",
    "aten._cudnn_attention_forward": "aten._scaled_dot_product_cudnn_attention",
    "aten._cudnn_attention_backward": "aten._scaled_dot_product_cudnn_attention_backward",
}


def key(name: str, shapes: Sequence[Any]) -> Key:
    """An operator and the shapes of its inputs of two dimensions or more (what the engine and the
    profiler both see: a convolution's bias and a foreach op's lists aside)."""
    name = name.replace("::", ".")
    return ALIASES.get(name, name), tuple(tuple(s) for s in shapes if isinstance(s, (list, tuple)) and len(s) >= 2)


class _Features(Meter):
    """Each op of the run in order: its work and key."""

    def __init__(self) -> None:
        self.ops: list[tuple[Work, Key]] = []
        self.formulas = FormulaTable()

    def op(self, op: Op) -> None:
        shapes = [list(a.shape) if isinstance(a, torch.Tensor) else None for a in op.args]
        self.ops.append((op_features(op, self.formulas, "cuda"), key(op.name, shapes)))


@dataclasses.dataclass
class Observed:
    """A workload's analytic run on the target beside its record."""

    name: str
    ops: list[tuple[Work, Key]]  # every op of the step, in order
    step_seconds: float  # measured
    measured: dict[Key, float]  # kernel seconds per operator and shapes, as recorded
    matched: dict[Key, tuple[list[Work], float]]  # what the run and the record share: its works, measured seconds


def observe(gpu: GPUSpec, model: nn.Module, inputs: Any, record: Mapping[str, Any], **keywords: Any) -> Observed:
    """Run ``model`` analytically on ``gpu`` (``keywords``: :func:`~pytest_modelprof.profile`'s, e.g.
    ``train``, ``optimizer``, ``autocast``) and match its ops to ``record``."""
    from .run import profile  # the engine's entry point; this module is one of its users

    features = _Features()
    profile(model, inputs, target=gpu, flops=False, memory=False, meters=[features], **keywords)
    measured: dict[Key, float] = defaultdict(float)
    for op in record["ops"]:
        shapes = json.loads(op["shapes"]) if isinstance(op["shapes"], str) else op["shapes"]
        measured[key(op["op"], shapes)] += op["self_device_us"] * 1e-6
    works: dict[Key, list[Work]] = defaultdict(list)
    for work, k in features.ops:
        if work.kind != "none" and work.on_device:
            works[k].append(work)
    matched = {k: (works[k], measured[k]) for k in works if k in measured}
    return Observed(str(record.get("name", "")), features.ops, record["step_ms_median"] / 1e3, dict(measured), matched)


def step_seconds(gpu: GPUSpec, observed: Observed, calibration: Calibration) -> float:
    """The predicted time of the observed step under ``calibration``."""
    clock = StepClock(gpu, calibration)
    for work, _ in observed.ops:
        clock.issue(work)
    return clock.seconds


def kernel_time(gpu: GPUSpec, works: Sequence[Work], calibration: Calibration) -> float:
    return sum(kernel_seconds(gpu, calibration, w)[0] for w in works)


# ------------------------------------------------------------------ the fit

Parameter = tuple[str, "str | None"]
HOST_PARAMETERS: tuple[Parameter, ...] = (("host_seconds", None), ("view_seconds", None))
BOUNDS = {
    "efficiency": (0.01, 1.0),
    "gemm_half": (1.0, 1e5),
    "tile_cost": (0.01, 500.0),
    "reduction_bandwidth": (1e9, 1e12),
    "reduction_cycles": (1.0, 1e5),
    "kernel_seconds": (1e-6, 2e-5),
    "power_exponent": (1.0, 3.0),
    "simt_integer": (0.01, 1.0),
    "simt_issue": (0.01, 1.0),
    "host_seconds": (1e-6, 1e-4),
    "view_seconds": (1e-7, 5e-5),
}
# a convolution on CUDA cores may multiply less than its FLOPs count (Winograd's, FFT's kernels)
ABOVE_PEAK: dict[Parameter, float] = {
    ("efficiency", "conv_simt"): 2.5,
    ("efficiency", "conv_backward_simt"): 2.5,
    # a pooling kind's is elements per SM and cycle, not a fraction of a peak
    ("efficiency", "pool"): 16.0,
    ("efficiency", "pool_backward"): 16.0,
    **{("efficiency", rate): 16.0 for rate in RATE_OF.values()},
    ("efficiency", "strided_rate"): 64.0,
    ("efficiency", "reduction_rate"): 64.0,
    ("efficiency", "norm_columns_rate"): 64.0,
}


def _bounds(parameter: Parameter) -> tuple[float, float]:
    low, high = BOUNDS[parameter[0]]
    return low, ABOVE_PEAK.get(parameter, high)


def kernel_parameters(works: Sequence[tuple[GPUSpec, Work]]) -> list[Parameter]:
    """The kernel model's constants that the time of these ops (each on its GPU) depends on."""
    efficiencies = {"cuda_cores"}
    parameters: set[Parameter] = {("kernel_seconds", None)}
    for gpu, work in works:
        kind = work.kind
        if kind in COMPUTE_KINDS:
            math_dtype = MATH_OF.get(work.name, work.dtype)
            tensor_cores = math_unit(gpu, kind, math_dtype, work.tf32)[1]
            efficiencies.add(kind if tensor_cores else f"{kind}_simt")
            if work.gemms:
                parameters.update({("gemm_half", gemm_half_key(kind, tensor_cores)), ("tile_cost", "tensor" if tensor_cores else "simt")})
            if clock_fraction(gpu) < 1:
                parameters.add(("power_exponent", None))
            loss = None if tensor_cores else simt_loss(gpu, math_dtype)
            if loss is not None:
                parameters.add((loss, None))
        elif kind in RATE_OF:  # PyTorch's own batch norms: their elements' rate; their bytes and channels at cuDNN's
            efficiencies.add(RATE_OF[kind])
        elif kind != "none":
            efficiencies.add(kind)
            if kind == "memory" and work.elements:  # an elementwise kernel on the strided path: its SMs' work
                efficiencies.update(("strided_rate", "strided_byte_cycles"))
            if any(kernel.offsets for kernel in work.launches):  # a reduction's offsets, dimension by dimension
                efficiencies.add("reduction_rate")
            if any(blocks_per_output(kernel, gpu.sm_count, threads_per_sm(gpu.compute_capability)) > 1 for kernel in work.launches):
                parameters.add(("reduction_cycles", "staging"))  # a split reduction's staging steps
            if kind in POOL_KINDS:  # its rate per SM and cycle, beside its bytes at the memory's
                efficiencies.add("memory")
            if kind in NORM_KINDS:
                parameters.add(("reduction_bandwidth", kind))
            if work.name in ROW_NORMS and work.reductions:  # a layer norm's cycles a row
                parameters.add(("reduction_cycles", "norm"))
            if work.columns:  # a norm's weight-gradient kernel: its blocks' rate
                efficiencies.add("norm_columns_rate")
    parameters.update(("efficiency", name) for name in efficiencies)
    return sorted(parameters, key=lambda p: (p[0], p[1] or ""))


# where a parameter the calibration lacks starts (by its table, or its name)
_START = {
    "norm_columns_rate": 10.0,
    "reduction_bandwidth": 20e9,
    "reduction_cycles": 1000.0,
    "strided_rate": 4.0,
    "strided_byte_cycles": 0.05,
}


def _get(calibration: Calibration, parameter: Parameter) -> float:
    field, name = parameter
    value = getattr(calibration, field)
    if name is None:
        return float(value)
    if name not in value and STAND_IN.get(name) in value:  # the figure that prices the kind while it has none
        return float(value[STAND_IN[name]])
    return float(value.get(name, getattr(Calibration(), field).get(name, _START.get(name, _START.get(field, 1.0)))))


def _put(calibration: Calibration, values: Mapping[Parameter, float]) -> Calibration:
    changes: dict[str, Any] = {}
    for (field, name), value in values.items():
        low, high = _bounds((field, name))
        value = min(max(value, low), high)
        if name is None:
            changes[field] = value
        else:
            changes[field] = {**changes.get(field, getattr(calibration, field)), name: value}
    return dataclasses.replace(calibration, **changes)


def least_squares(
    residuals: Callable[[list[float]], list[float]], start: list[float], low: list[float], high: list[float], iterations: int = 60
) -> list[float]:
    """Levenberg-Marquardt: the ``x`` within ``[low, high]`` that minimises ``sum(residuals(x)**2)``,
    from ``start``, with a forward-difference Jacobian."""
    x = torch.tensor([min(max(v, a), b) for v, a, b in zip(start, low, high)], dtype=torch.float64)
    lower, upper = torch.tensor(low, dtype=torch.float64), torch.tensor(high, dtype=torch.float64)

    def evaluate(point: torch.Tensor) -> torch.Tensor:
        return torch.tensor(residuals(point.tolist()), dtype=torch.float64)

    r = evaluate(x)
    cost = float(r @ r)
    damping = 1e-3
    for _ in range(iterations):
        columns = []
        for i in range(len(x)):
            step = 1e-4 * max(1.0, abs(float(x[i])))
            shifted = x.clone()
            shifted[i] = shifted[i] + step if shifted[i] + step <= upper[i] else shifted[i] - step
            columns.append((evaluate(shifted) - r) / (shifted[i] - x[i]))
        jacobian = torch.stack(columns, dim=1)
        normal, gradient = jacobian.T @ jacobian, jacobian.T @ r
        # a parameter at a bound that the descent pushes beyond it stays there: the step is solved for the others
        held = ((x <= lower) & (gradient > 0)) | ((x >= upper) & (gradient < 0))
        free = (~held).nonzero().flatten()
        improved = False
        while damping < 1e10 and len(free):
            reduced = normal[free][:, free]
            system = reduced + damping * torch.diag(torch.diagonal(reduced).clamp_min(1e-12))
            delta = torch.zeros_like(x)
            delta[free] = torch.linalg.solve(system, gradient[free])
            candidate = torch.minimum(torch.maximum(x - delta, lower), upper)
            trial = evaluate(candidate)
            trial_cost = float(trial @ trial)
            if trial_cost < cost:
                improved = cost - trial_cost > 1e-12 * max(cost, 1e-30)
                x, r, cost = candidate, trial, trial_cost
                damping = max(damping / 3, 1e-9)
                break
            damping *= 4
        if not improved:
            break
    return [float(v) for v in x]


def _fit_stage(calibration: Calibration, parameters: Sequence[Parameter], residuals: Callable[[Calibration], list[float]]) -> Calibration:
    """The ``parameters`` of ``calibration`` that minimise the squared ``residuals``, fitted in log space."""
    start = [math.log(_inside(calibration, p)) for p in parameters]
    low = [math.log(_bounds(p)[0]) for p in parameters]
    high = [math.log(_bounds(p)[1]) for p in parameters]

    def at(x: list[float]) -> Calibration:
        return _put(calibration, {p: math.exp(v) for p, v in zip(parameters, x)})

    return at(least_squares(lambda x: residuals(at(x)), start, low, high))


def _inside(calibration: Calibration, parameter: Parameter) -> float:
    """The figure of ``calibration`` a fit starts ``parameter`` from, within its bounds (one at zero, as no
    issue slots lost, starts at its lower bound)."""
    low, high = _bounds(parameter)
    return min(max(_get(calibration, parameter), low), high)


def _slow_start(kinds: AbstractSet[str]) -> Calibration:
    """Where a fit starts by default: the round defaults, with the kinds it fits at half their efficiency
    and the shortest kernel at its least, so that each kernel starts above the shortest-kernel floor,
    where its time still depends on the figures (a kind it does not see keeps its default)."""
    defaults = Calibration()
    efficiency = {kind: value / 2 if kind.removesuffix("_simt") in kinds else value for kind, value in defaults.efficiency.items()}
    # (the FMAs' issue slots start partly lost, as the integer lanes do: a fit from there finds the shipped figures)
    return dataclasses.replace(defaults, efficiency=efficiency, kernel_seconds=BOUNDS["kernel_seconds"][0], simt_issue=0.1)


Timed = tuple[GPUSpec, Work, str, float]  # a kernel timed on its own: the GPU, the op's work, its class, the seconds


class KernelFit(NamedTuple):
    """A kernel model fitted to kernels timed one at a time (:func:`fit_kernels`): the calibration, and per
    class of op the fixed cost the timing adds to each of its kernels (the timer's own, the launch)."""

    calibration: Calibration
    overhead: Mapping[str, float]

    def seconds(self, gpu: GPUSpec, work: Work, kind: str) -> float:
        """The timed seconds of ``work`` (of class ``kind``) on ``gpu``, timed over and over: the GPU idle
        for the overhead between kernels, which a power-capped GPU clocks up for."""
        overhead = self.overhead.get(kind, 0.0)
        kernel = kernel_seconds(gpu, self.calibration, work)[0]
        if overhead and clock_fraction(gpu) < 1:
            kernel = kernel_seconds(gpu, self.calibration, work, duty=kernel / (kernel + overhead))[0]
        return kernel + overhead


OVERHEAD_BOUNDS = (1e-7, 2e-4)


def _matched(steps: Iterable[tuple[GPUSpec, Observed]]) -> list[tuple[GPUSpec, list[Work], float]]:
    """Each measured operator of the steps that an op of their analytic runs matched: its GPU, works, seconds."""
    return [(gpu, works, seconds) for gpu, o in steps for works, seconds in o.matched.values() if seconds > 0]


def _fit_kernel_model(start: Calibration | None, steps: Sequence[tuple[GPUSpec, list[Work], float]], timed: Sequence[Timed]) -> KernelFit:
    """The kernel model's constants that best predict the kernels of measured steps (each operator's works
    on its GPU and measured seconds, weighted by its time) and kernels timed on their own (every one alike,
    with a fixed cost per class fitted beside), each set weighing as much as the other: least squares of
    the log ratio, in log space, from ``start`` (by default, figures that make every kernel slow)."""
    kinds = {w.kind for _, works, _ in steps for w in works} | {work.kind for _, work, _, _ in timed}
    calibration = start or _slow_start(kinds)
    used = kernel_parameters([*((gpu, w) for gpu, works, _ in steps for w in works), *((gpu, work) for gpu, work, _, _ in timed)])
    classes = sorted({kind for _, _, kind, _ in timed})
    low = [math.log(_bounds(p)[0]) for p in used] + [math.log(OVERHEAD_BOUNDS[0])] * len(classes)
    high = [math.log(_bounds(p)[1]) for p in used] + [math.log(OVERHEAD_BOUNDS[1])] * len(classes)
    origin = [math.log(_inside(calibration, p)) for p in used] + [math.log(1e-5)] * len(classes)
    step_weight = 1 / math.sqrt(sum(seconds for _, _, seconds in steps) or 1.0)
    timed_weight = 1 / math.sqrt(len(timed) or 1)

    def at(x: list[float]) -> KernelFit:
        values = [math.exp(v) for v in x]
        return KernelFit(_put(calibration, dict(zip(used, values))), dict(zip(classes, values[len(used) :])))

    def residuals(x: list[float]) -> list[float]:
        model = at(x)
        out = [
            step_weight * math.sqrt(seconds) * math.log(kernel_time(gpu, works, model.calibration) / seconds)
            for gpu, works, seconds in steps
        ]
        out += [timed_weight * math.log(model.seconds(gpu, work, kind) / seconds) for gpu, work, kind, seconds in timed]
        return out

    return at(least_squares(residuals, origin, low, high))


def fit(
    gpu: GPUSpec,
    observed: Sequence[Observed],
    start: Calibration | None = None,
    source: str | None = None,
    timed: Sequence[Timed] = (),
    kernels: Sequence[tuple[GPUSpec, list[Work], float]] = (),
) -> Calibration:
    """The calibration that best predicts ``observed`` steps on ``gpu`` (see the module's notes), and with
    them ``timed`` kernels (timed on their own, on any GPU: :func:`fit_kernels`) and ``kernels`` (operators of
    other steps, on any GPU: each its works and measured seconds, weighed as the steps' are), starting from
    ``start`` (by default, figures that make every kernel slow)."""
    matched = [*_matched((gpu, o) for o in observed), *((g, works, seconds) for g, works, seconds in kernels if works and seconds > 0)]
    if not matched:
        raise ValueError("no measured operator matches an op of the analytic runs: nothing to fit the kernel model to")
    calibration = _fit_kernel_model(start, matched, _usable(timed)).calibration

    def steps(candidate: Calibration) -> list[float]:
        return [math.log(step_seconds(gpu, o, candidate) / o.step_seconds) for o in observed]

    calibration = _fit_stage(calibration, HOST_PARAMETERS, steps)
    names = ", ".join(o.name for o in observed if o.name)
    source = source or f"fitted on {len(observed)} steps measured on {gpu.name} ({names})"
    return dataclasses.replace(calibration, calibrated=True, source=source)


def fit_kinds(calibration: Calibration, kernels: Sequence[tuple[GPUSpec, list[Work], float]], kinds: AbstractSet[str]) -> Calibration:
    """``calibration`` with the constants of ``kinds`` alone (their efficiency, their reduction bandwidth)
    fitted to ``kernels`` (each an operator's works on its GPU and its measured seconds, weighted by its
    time, as :func:`fit` weighs a step's), every other constant kept: kinds of kernel that the steps a
    calibration is fitted on do not run (a model in half precision's batch norm)."""
    kernels = [(gpu, works, seconds) for gpu, works, seconds in kernels if works and seconds > 0 and all(w.kind in kinds for w in works)]
    if not kernels:
        raise ValueError(f"no measured kernel of the kinds {sorted(kinds)} to fit their constants to")
    own = {*kinds, *(RATE_OF[kind] for kind in kinds if kind in RATE_OF)}
    parameters = [p for p in kernel_parameters([(gpu, w) for gpu, works, _ in kernels for w in works]) if p[1] in own]
    weight = 1 / math.sqrt(sum(seconds for _, _, seconds in kernels))

    def residuals(candidate: Calibration) -> list[float]:
        return [weight * math.sqrt(seconds) * math.log(kernel_time(gpu, works, candidate) / seconds) for gpu, works, seconds in kernels]

    return _fit_stage(calibration, parameters, residuals)


def _usable(timed: Sequence[Timed]) -> list[Timed]:
    return [t for t in timed if t[3] > 0 and t[1].on_device and t[1].kind != "none"]


def fit_kernels(timed: Sequence[Timed], steps: Sequence[tuple[GPUSpec, Observed]] = (), start: Calibration | None = None) -> KernelFit:
    """The kernel model's constants (one set for every GPU: each GPU is its spec-table figures) that best
    predict ``timed``: each an op's work on a GPU, its class, and its seconds timed on its own, which include
    a fixed cost per class (fitted too); the least squares of the log ratio, every kernel alike. With
    ``steps`` (steps measured on a GPU), their kernels too, as :func:`fit` weighs them."""
    timed = _usable(timed)
    matched = _matched(steps)
    if not timed and not matched:
        raise ValueError("no timed kernel to fit the kernel model to")
    fitted = _fit_kernel_model(start, matched, timed)
    gpus = sorted({gpu.name for gpu, _, _, _ in timed} | {gpu.name for gpu, _ in steps})
    source = f"fitted on {len(timed)} kernels timed on their own and {len(steps)} steps, on {', '.join(gpus)}"
    return fitted._replace(calibration=dataclasses.replace(fitted.calibration, calibrated=True, source=source))


def errors(gpu: GPUSpec, observed: Sequence[Observed], calibration: Calibration) -> list[float]:
    """Each observed step's relative error under ``calibration``."""
    return [step_seconds(gpu, o, calibration) / o.step_seconds - 1 for o in observed]
