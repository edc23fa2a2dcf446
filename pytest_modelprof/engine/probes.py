"""The steps ``modelprof calibrate`` measures on a GPU (:data:`PROBES`), how it measures them
(:func:`measure_probe`: the record format of ``pytest_modelprof/data/gpu-truth``), and
:func:`calibrate`: measure, run each analytically on the target, fit (:func:`.calibrate.fit`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .calibrate import Observed, fit, observe
from .targets.gpus import Calibration, GPUSpec


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
