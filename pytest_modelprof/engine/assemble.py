"""The :class:`~pytest_modelprof.results.Profile` of a run: the model's own figures, each meter's
contribution, and the module tree's sums."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypedDict

import torch
from torch import nn

from ..results import ModuleStats, Profile
from .meters import Meter
from .observe.modules import ModuleTracker
from .workload import Workload


def assemble(workload: Workload, tracker: ModuleTracker, meters: Sequence[Meter]) -> Profile:
    """The profile of a metered run of ``workload``: each meter writes its figures in turn."""
    result = Profile(
        model=type(workload.model).__name__,
        train=workload.train,
        device=str(workload.target),
        analytic=workload.analytic,
        flops_counted=False,  # until the FLOP meter says it was there
        target=workload.target_gpu.name if workload.target_gpu is not None else None,
        target_memory_bytes=workload.target_gpu.memory_bytes if workload.target_gpu is not None else None,
        **model_figures(workload.named_params.values(), workload.named_buffers.values()),
    )
    modules = _module_rows(workload.named_modules, tracker)
    for meter in meters:
        meter.contribute(result, modules)
    for row in result.ops:
        row.modules = sorted(set(row.modules))
    for stats in modules.values():
        stats.ops.sort(key=lambda o: (-o.flops, o.op, o.phase))
    result.ops.sort(key=lambda r: (-r.flops, r.op, r.phase))
    total = result.flops
    for stats in modules.values():
        stats.share = stats.flops / total if total else 0.0
    result.modules = list(modules.values())
    roll_up_containers(result.modules, total)
    return result


_SUMMED = ("forward_flops", "backward_flops", "recompute_flops", "forward_macs", "backward_macs", "activation_bytes")
_HIGHEST = ("forward_peak_bytes", "backward_peak_bytes")
_TIMES = ("forward_seconds", "backward_seconds", "forward_device_seconds", "backward_device_seconds", "predicted_seconds")


def roll_up_containers(modules: list[ModuleStats], total_flops: int) -> None:
    """Give each module that was never called itself but whose children were (``nn.ModuleList``,
    ``nn.ModuleDict``: GPT-2's ``transformer.h``) the sums of its children's figures, deepest first,
    so that the tree adds up; it is marked as a container."""
    children: dict[str, list[ModuleStats]] = {}
    for module in modules:
        if module.path:
            children.setdefault(module.path.rpartition(".")[0], []).append(module)
    for module in sorted(modules, key=lambda m: -m.depth):
        below = children.get(module.path, [])
        if module.calls or not module.path or not any(c.calls or c.container for c in below):
            continue
        module.container = True
        for name in _SUMMED:
            setattr(module, name, sum(getattr(c, name) for c in below))
        for name in _HIGHEST:
            setattr(module, name, max(getattr(c, name) for c in below))
        for name in _TIMES:
            times = [getattr(c, name) for c in below if getattr(c, name) is not None]
            setattr(module, name, sum(times) if times else getattr(module, name))
        module.share = module.flops / total_flops if total_flops else 0.0


class ModelFigures(TypedDict):
    params: int
    trainable_params: int
    buffers: int
    param_bytes: int
    buffer_bytes: int


def model_figures(params: Iterable[torch.Tensor], buffers: Iterable[torch.Tensor]) -> ModelFigures:
    """Parameter and buffer counts and bytes, each tensor counted once (tied weights too)."""
    unique_params = list({id(p): p for p in params}.values())
    unique_buffers = list({id(b): b for b in buffers}.values())
    return ModelFigures(
        params=sum(p.numel() for p in unique_params),
        trainable_params=sum(p.numel() for p in unique_params if p.requires_grad),
        buffers=sum(b.numel() for b in unique_buffers),
        param_bytes=sum(p.numel() * p.element_size() for p in unique_params),
        buffer_bytes=sum(b.numel() * b.element_size() for b in unique_buffers),
    )


def _module_rows(named_modules: list[tuple[str, nn.Module]], tracker: ModuleTracker) -> dict[str, ModuleStats]:
    """A row per module of the model as the run began, and per path a module ran at that the model had not
    then (the model put modules in as it ran; one that took an old module's place keeps the old row)."""
    paths = {path for path, _ in named_modules}
    named_modules = named_modules + [(path, module) for path, module in tracker.ran.items() if path not in paths]
    params = _parameter_counts(named_modules)
    return {
        path: ModuleStats(
            path=path,
            type=type(module).__name__,
            depth=path.count(".") + 1 if path else 0,
            calls=tracker.calls.get(path, 0),
            params=params[id(module)],
        )
        for path, module in named_modules
    }


def _parameter_counts(named_modules: list[tuple[str, nn.Module]]) -> dict[int, int]:
    """For each module (by id), the elements of its parameters and its descendants', each counted once: summed up the
    tree where no parameter and no module is held twice (the common case), else by :func:`_parameters_per_module`."""
    counts: dict[int, int] = {}
    children: set[int] = set()
    params: set[int] = set()
    shared = False

    def visit(module: nn.Module) -> int:
        nonlocal shared
        count = counts.get(id(module))
        if count is None:
            count = 0
            for p in module._parameters.values():
                if p is not None:
                    shared = shared or id(p) in params
                    params.add(id(p))
                    count += p.numel()
            for child in module._modules.values():
                if child is not None:
                    shared = shared or id(child) in children
                    children.add(id(child))
                    count += visit(child)
            counts[id(module)] = count
        return count

    for _, module in named_modules:
        visit(module)
    if shared:  # tied weights, a block reached by two paths: each subtree's parameters once
        return {key: sum(held.values()) for key, held in _parameters_per_module(named_modules).items()}
    return counts


def _parameters_per_module(named_modules: list[tuple[str, nn.Module]]) -> dict[int, dict[int, int]]:
    """For each module, its parameters and its descendants' (id -> numel), each counted once."""
    found: dict[int, dict[int, int]] = {}

    def visit(module: nn.Module) -> dict[int, int]:
        own = found.get(id(module))
        if own is None:
            own = {id(p): p.numel() for p in module._parameters.values() if p is not None}
            for child in module._modules.values():
                if child is not None:
                    own.update(visit(child))
            found[id(module)] = own
        return own

    for _, module in named_modules:  # each: the model may have swapped a module out as it ran (BigBird its attention)
        visit(module)
    return found
