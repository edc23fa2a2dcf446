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
of half efficiency, batch norm's bandwidth per channel, the shortest kernel) to the
matched operators' kernel times, weighted by their time; then the host's time per op (with
a kernel, and without: a view) to the step times.

``modelprof calibrate --target NAME -o FILE`` measures :data:`PROBES` (steps of small
models that run every kind of kernel) on the GPU at hand, fits, and writes a calibration
file (:func:`~.targets.catalog.save_calibration`) that ``target=FILE`` loads on any machine after.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import torch
from torch import nn

from .formulas import FormulaTable
from .meters import Meter, Op
from .meters.predicted import op_features
from .targets.cost import KINDS, StepClock, Work, kernel_seconds
from .targets.gpus import Calibration, GPUSpec

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
KERNEL_PARAMETERS: tuple[Parameter, ...] = (
    *(("efficiency", kind) for kind in (*KINDS, "cuda_cores")),
    *(("gemm_half", dim) for dim in "mnk"),
    ("reduction_bandwidth", "norm"),
    ("reduction_bandwidth", "norm_backward"),
    ("kernel_seconds", None),
)
HOST_PARAMETERS: tuple[Parameter, ...] = (("host_seconds", None), ("view_seconds", None))
BOUNDS = {
    "efficiency": (0.01, 1.0),
    "gemm_half": (1.0, 1e5),
    "reduction_bandwidth": (1e9, 1e12),
    "kernel_seconds": (1e-6, 2e-5),
    "host_seconds": (1e-6, 1e-4),
    "view_seconds": (1e-7, 5e-5),
}
_START = {"reduction_bandwidth": 20e9}  # where a parameter the calibration lacks starts


def _get(calibration: Calibration, parameter: Parameter) -> float:
    field, name = parameter
    value = getattr(calibration, field)
    if name is None:
        return float(value)
    return float(value.get(name, getattr(Calibration(), field).get(name, _START.get(field, 1.0))))


def _put(calibration: Calibration, values: Mapping[Parameter, float]) -> Calibration:
    changes: dict[str, Any] = {}
    for (field, name), value in values.items():
        low, high = BOUNDS[field]
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
    start = [math.log(_get(calibration, p)) for p in parameters]
    low = [math.log(BOUNDS[p[0]][0]) for p in parameters]
    high = [math.log(BOUNDS[p[0]][1]) for p in parameters]

    def at(x: list[float]) -> Calibration:
        return _put(calibration, {p: math.exp(v) for p, v in zip(parameters, x)})

    return at(least_squares(lambda x: residuals(at(x)), start, low, high))


def _slow_start(kinds: AbstractSet[str]) -> Calibration:
    """Where a fit starts by default: the round defaults, with the kinds it fits at half their efficiency
    and the shortest kernel at its least, so that each kernel starts above the shortest-kernel floor,
    where its time still depends on the figures (a kind it does not see keeps its default)."""
    defaults = Calibration()
    efficiency = {kind: value / 2 if kind in kinds else value for kind, value in defaults.efficiency.items()}
    return dataclasses.replace(defaults, efficiency=efficiency, kernel_seconds=BOUNDS["kernel_seconds"][0])


def fit(gpu: GPUSpec, observed: Sequence[Observed], start: Calibration | None = None, source: str | None = None) -> Calibration:
    """The calibration of ``gpu`` that best predicts ``observed`` (see the module's notes), starting
    from ``start`` (by default, figures that make every kernel slow)."""
    matched = [(works, seconds) for o in observed for works, seconds in o.matched.values() if seconds > 0]
    if not matched:
        raise ValueError("no measured operator matches an op of the analytic runs: nothing to fit the kernel model to")
    kinds = {w.kind for works, _ in matched for w in works}
    calibration = start or _slow_start(kinds)
    used = [p for p in KERNEL_PARAMETERS if p[0] != "efficiency" or p[1] in kinds or p[1] == "cuda_cores"]
    if not kinds & {"norm", "norm_backward"}:
        used = [p for p in used if p[0] != "reduction_bandwidth"]

    def kernels(candidate: Calibration) -> list[float]:
        return [math.sqrt(seconds) * math.log(kernel_time(gpu, works, candidate) / seconds) for works, seconds in matched]

    calibration = _fit_stage(calibration, used, kernels)

    def steps(candidate: Calibration) -> list[float]:
        return [math.log(step_seconds(gpu, o, candidate) / o.step_seconds) for o in observed]

    calibration = _fit_stage(calibration, HOST_PARAMETERS, steps)
    names = ", ".join(o.name for o in observed if o.name)
    source = source or f"fitted on {len(observed)} steps measured on {gpu.name} ({names})"
    return dataclasses.replace(calibration, calibrated=True, source=source)


def errors(gpu: GPUSpec, observed: Sequence[Observed], calibration: Calibration) -> list[float]:
    """Each observed step's relative error under ``calibration``."""
    return [step_seconds(gpu, o, calibration) / o.step_seconds - 1 for o in observed]


# ------------------------------------------------------------------ measuring on a GPU


@dataclasses.dataclass(frozen=True)
class Probe:
    """A step ``calibrate`` measures: ``build(device)`` gives the model (on ``device``), its inputs and
    :func:`~pytest_modelprof.profile`'s keywords for it (``train``, ``optimizer``, ``autocast``)."""

    name: str
    build: Callable[[torch.device], tuple[nn.Module, Any, dict[str, Any]]]


def _vision(name: str, batch: int, size: int, train: bool, optimizer: str | None, frames: int = 0) -> Probe:
    def build(device: torch.device) -> tuple[nn.Module, Any, dict[str, Any]]:
        import torchvision

        family = torchvision.models.video if frames else torchvision.models
        with device:
            model = getattr(family, name)(num_classes=400 if frames else 1000)
            shape = (batch, 3, frames, size, size) if frames else (batch, 3, size, size)
            x = torch.randn(shape)
        return model, x, _keywords(model, train, optimizer)

    suffix = f"b{batch}-{'train' if train else 'eval'}-fp32"
    return Probe(f"{name}-{suffix}", build)


def _keywords(model: nn.Module, train: bool, optimizer: str | None, autocast: torch.dtype | None = None) -> dict[str, Any]:
    make: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
        "sgdm": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
        "adamw": torch.optim.AdamW,
        "adam": torch.optim.Adam,
    }
    return {"train": train, "optimizer": make[optimizer](model.parameters()) if optimizer else None, "autocast": autocast}


def _vit(device: torch.device) -> tuple[nn.Module, Any, dict[str, Any]]:
    import torchvision

    with device:
        model = torchvision.models.vit_b_16().to(torch.bfloat16)
        x = torch.randn(16, 3, 224, 224, dtype=torch.bfloat16)
    return model, x, _keywords(model, False, None)


def _encoder(device: torch.device) -> tuple[nn.Module, Any, dict[str, Any]]:
    with device:
        layer = nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.1, batch_first=True, norm_first=True)
        model = nn.Sequential(nn.TransformerEncoder(layer, 6, enable_nested_tensor=False), nn.Linear(512, 1000))
        x = torch.randn(8, 512, 512)
    return model, x, _keywords(model, True, "adamw", torch.bfloat16)


def _mlp(device: torch.device, width: int, batch: int, dtype: torch.dtype) -> tuple[nn.Module, Any, dict[str, Any]]:
    with device:
        layers: list[nn.Module] = []
        for _ in range(6):
            layers += [nn.Linear(width, width), nn.GELU()]
        model = nn.Sequential(*layers).to(dtype)
        x = torch.randn(batch, width, dtype=dtype)
    return model, x, _keywords(model, True, "adamw")


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(512, 1024, num_layers=2, batch_first=True)
        self.head = nn.Linear(1024, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.lstm(x)[0])
        return out


def _lstm(device: torch.device) -> tuple[nn.Module, Any, dict[str, Any]]:
    with device:
        model = _Recurrent()
        x = torch.randn(32, 128, 512)
    return model, x, _keywords(model, True, "adam")


PROBES: tuple[Probe, ...] = (
    _vision("resnet18", 32, 224, True, "sgdm"),
    _vision("resnet50", 32, 224, False, None),
    _vision("mobilenet_v3_large", 32, 224, True, "adamw"),
    _vision("r3d_18", 4, 112, False, None, frames=16),
    Probe("vit_b_16-b16-eval-bf16", _vit),
    Probe("encoder6x512-s512-b8-train-autocast_bf16-adamw", _encoder),
    Probe("mlp6x4096-b4096-train-bf16-adamw", lambda d: _mlp(d, 4096, 4096, torch.bfloat16)),
    Probe("mlp6x256-b32-train-fp32-adamw", lambda d: _mlp(d, 256, 32, torch.float32)),  # small kernels: the host's time
    Probe("lstm2x1024-s128-b32-train-fp32-adam", _lstm),
)


def probe_loss(output: Any) -> torch.Tensor:
    """The loss of the probes' training steps, measured and analysed: the mean square of the output."""
    first = output if isinstance(output, torch.Tensor) else next(t for t in output if isinstance(t, torch.Tensor))
    loss: torch.Tensor = first.float().pow(2).mean()
    return loss


def training_step(
    model: nn.Module,
    inputs: Any,
    train: bool,
    optimizer: torch.optim.Optimizer | None,
    autocast: torch.dtype | None,
    loss_fn: Callable[[Any], torch.Tensor],
    device_type: str,
) -> Callable[[], None]:
    """One step as a training script runs it on a GPU (forward under ``autocast``, loss, backward,
    optimizer step, ``zero_grad(set_to_none=True)``), or a forward pass under ``no_grad`` when not
    ``train``: what the measured records time and profile."""
    model.train(train)

    def step() -> None:
        if train:
            with torch.autocast(device_type, dtype=autocast or torch.float32, enabled=autocast is not None):
                loss = loss_fn(model(inputs))
            loss.backward()  # type: ignore[no-untyped-call]
            if optimizer is not None:
                optimizer.step()
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                model(inputs)

    return step


def measure_probe(probe: Probe, device: torch.device, steps: int = 20) -> dict[str, Any]:
    """Run ``probe`` on the GPU ``device``: its record (see the module's notes)."""
    from torch.profiler import ProfilerActivity

    from .timing.layers import one_cycle_profile

    torch.manual_seed(0)
    model, inputs, keywords = probe.build(device)
    step = training_step(model, inputs, keywords["train"], keywords["optimizer"], keywords["autocast"], probe_loss, device.type)
    for _ in range(3):
        step()
    torch.cuda.synchronize(device)
    times = []
    for _ in range(steps):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))  # type: ignore[no-untyped-call]
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    with one_cycle_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as recorded:
        step()
        torch.cuda.synchronize(device)
    ops = []
    for event in recorded.key_averages(group_by_input_shape=True):
        seconds = getattr(event, "self_device_time_total", 0.0)
        if event.key.startswith("aten::") and seconds > 0:
            ops.append({"op": event.key, "shapes": json.dumps(event.input_shapes), "count": event.count, "self_device_us": seconds})
    return {"name": probe.name, "step_ms_median": statistics.median(times), "step_ms_all": times, "ops": ops}


def calibrate(
    gpu: GPUSpec,
    probes: Sequence[Probe] = PROBES,
    measure: Callable[[Probe], Mapping[str, Any]] | None = None,
    device: torch.device | str = "cuda",
) -> tuple[Calibration, list[Observed]]:
    """Measure ``probes`` (with ``measure``: :func:`measure_probe` on ``device`` unless given), run each
    analytically on ``gpu``, and fit; the calibration and what it was fitted to."""
    where = torch.device(device)
    if measure is None:
        if where.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError("calibrating measures kernels on the GPU to calibrate: no CUDA device is available here")
        measure = functools.partial(measure_probe, device=where)
    observed = []
    for probe in probes:
        record = {**measure(probe), "name": probe.name}
        model, inputs, keywords = probe.build(torch.device("meta"))
        observed.append(observe(gpu, model, inputs, record, loss_fn=probe_loss, **keywords))
    return fit(gpu, observed, source=f"calibrated on {gpu.name} ({len(observed)} steps measured)"), observed
