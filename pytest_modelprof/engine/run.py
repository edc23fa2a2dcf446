"""Runs a workload once under the meters: a forward pass, or a whole training step.

Real runs execute on CPU or CUDA tensors. Analytic runs (``device="meta"``, or a
model or inputs that are already fake tensors) execute on fake tensors that claim
the model's real device, so the same kernels are chosen as in a real run, while
nothing is allocated or computed.

The caller's model is never modified: parameters and buffers are swapped in for
the run with :func:`torch.func.functional_call` (detached views of the caller's
tensors, clones of buffers where a training step would update them), module
hooks live only during the run, the train/eval flags and the RNG state are
restored, and inputs are copied before the model sees them.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypedDict

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_map

from ..results import MemoryReport, ModuleOp, ModuleStats, OpStats, Profile
from .cuda_estimates import CUBLAS_OPS, cublas_workspace_bytes, reserved_bytes
from .errors import FormulaError, ProfileError
from .flops import FlopMeter
from .memo import LeafMemo
from .memory import (
    ACTIVATIONS,
    BUFFERS,
    CATEGORIES,
    CUDA_BLOCK,
    GRADIENTS,
    INPUTS,
    OPTIMIZER_STATE,
    PARAMETERS,
    TEMPORARIES,
    MemoryMeter,
)
from .modules import ROOT, ModuleTracker, StackKey
from .timing import Timing, batch_size_of, layer_times, measure_latency


def profile(
    model: nn.Module,
    inputs: Any = (),
    *,
    train: bool = False,
    loss_fn: Any = None,
    device: str | torch.device | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    memory: bool = True,
    no_grad: bool = True,
    set_to_none: bool = True,
    autocast: torch.dtype | None = None,
    latency: bool | Timing = False,
) -> Profile:
    """Profile one forward pass (``train=False``) or one training step of ``model``.

    ``inputs`` is a tensor, a tuple (or list) of positional inputs, a dict of keyword
    inputs, or a pair ``(args_tuple, kwargs_dict)``. Inference runs the model in eval
    mode under ``torch.no_grad()``; ``train=True`` runs it in train mode and profiles
    the forward pass, the loss (``loss_fn(output)``, by default the sum of every
    floating-point tensor in the output) and the backward pass.

    With ``optimizer`` (``train=True`` only) the step goes on: ``optimizer.step()`` and
    ``zero_grad()``, run by a copy of the optimizer (same class, hyperparameters and
    state) over the run's tensors, so the caller's optimizer and its state are left as
    they were. The figures are those of a steady-state step: an optimizer that has no
    state yet (it creates it lazily) first takes one unmetered step on zero gradients,
    so its state is resident from the start, as in every step after the first.

    ``device=None`` runs on the device of the model's parameters; ``"cpu"`` or
    ``"cuda"`` runs there (the caller's model is not moved); ``"meta"`` is analytic
    mode: fake tensors, no allocation, no computation, the same figures.

    ``memory=True`` follows memory in the same pass (``Profile.memory``,
    ``peak_memory_bytes``, ``peak_activation_bytes``); ``memory=False`` counts FLOPs only.
    ``no_grad=False`` runs inference with grad enabled (what autograd saves is kept, as
    when a forward pass is not wrapped in ``torch.no_grad()``). ``set_to_none=False``
    makes the step's ``zero_grad`` zero gradients in place instead of freeing them: they
    are then resident from the start of the step, as in every step after the first.
    ``autocast=torch.bfloat16`` (or ``torch.float16``) runs the forward pass and the loss
    under ``torch.autocast`` on the run's device, as mixed-precision training does.

    ``latency=True`` (or a :class:`Timing`) then times the same workload on real tensors,
    apart from the meters: ``Profile.latency`` holds the repeats and their statistics,
    ``latency_seconds`` the median and ``machine`` what it ran on. ``Timing(layers=True)``
    adds per-module times (on ``Profile.modules``) and per-operator times
    (``Profile.op_times``) from :mod:`torch.profiler`, whose raw events stay on
    ``Profile.profiler_events``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"profile() expects a torch.nn.Module as the model, got {type(model).__name__}")
    args, kwargs = _split_inputs(inputs)
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    if not set_to_none and not train:
        raise ProfileError("set_to_none=False describes the gradients of a training step: pass train=True")
    if optimizer is not None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not train:
            raise ProfileError("an optimizer step needs a backward pass: pass train=True with optimizer=")
    timing = Timing() if latency is True else latency or None
    if timing is not None and not isinstance(timing, Timing):
        raise TypeError(f"latency must be True, False or a Timing, got {type(latency).__name__}")
    named_params: dict[str, torch.Tensor] = dict(model.named_parameters())
    named_buffers = dict(model.named_buffers())
    fake_mode, target = _choose_mode(model, named_params, named_buffers, (args, kwargs), device)
    if timing is not None and fake_mode is not None:
        raise ProfileError("latency needs real tensors: an analytic run (device='meta', fake tensors) computes nothing to time")

    named_modules = list(model.named_modules(remove_duplicate=False))
    tracker = ModuleTracker(named_modules)
    meter = FlopMeter(tracker)
    training_flags = {module: module.training for _, module in named_modules}
    with contextlib.ExitStack() as stack:
        params, buffers, run_args, run_kwargs, run_optimizer = _run_copies(
            model, named_params, named_buffers, args, kwargs, fake_mode, target, train, optimizer
        )
        if fake_mode is None:
            stack.enter_context(torch.random.fork_rng(devices=[target] if target.type == "cuda" else [], device_type=target.type))
        else:
            stack.enter_context(fake_mode)
        if run_optimizer is not None:
            _create_state(run_optimizer)
        if not set_to_none:
            with torch.no_grad():
                for tensor in params.values():
                    if tensor.requires_grad:
                        tensor.grad = torch.zeros_like(tensor)
        if train:
            tracker.watch_parameters(params)
        stack.enter_context(_restore_training_flags(training_flags))
        if any(flag is not train for flag in training_flags.values()):
            model.train(train)
        # A real inference run on the model's own device needs no swapped tensors:
        # nothing receives a gradient and eval mode updates no buffer. Every other
        # run uses the prepared tensors (moved, fake, or safe to backpropagate into).
        in_place = fake_mode is None and not train and all(t.device == target for t in (*named_params.values(), *named_buffers.values()))
        state = None if in_place else {**params, **buffers}
        if memory:
            meter.memory = MemoryMeter(CUDA_BLOCK if target.type == "cuda" else 1)
            meter.memory.track_all(named_params if in_place else params, PARAMETERS)
            meter.memory.track_all(named_buffers if in_place else buffers, BUFFERS)
            meter.memory.track_all((run_args, run_kwargs), INPUTS)
            meter.memory.track_all([t.grad for t in params.values() if t.grad is not None], GRADIENTS)
            if run_optimizer is not None:
                meter.memory.track_all(list(run_optimizer.state.values()), OPTIMIZER_STATE)
            stack.callback(meter.memory.close)
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(_saver(meter.memory, tracker), _identity))
        stack.enter_context(tracker)
        if not memory:
            # FLOPs only: repeated calls of stock leaf modules replay their first call's rows
            tracker.observer = LeafMemo(meter, hooks=1)
        stack.enter_context(meter)
        stack.callback(meter.settle)
        _run(
            model,
            state,
            run_args,
            run_kwargs,
            train,
            loss_fn,
            tracker,
            meter,
            run_optimizer,
            params,
            grad=train or not no_grad,
            set_to_none=set_to_none,
            autocast=torch.autocast(target.type, dtype=autocast) if autocast is not None else contextlib.nullcontext(),
        )

    result = _build_profile(model, named_modules, meter, tracker, named_params, named_buffers, train, target, fake_mode is not None)
    if timing is not None:
        amp = (lambda: torch.autocast(target.type, dtype=autocast)) if autocast is not None else contextlib.nullcontext
        workload = _workload(
            model, named_modules, named_params, named_buffers, args, kwargs, target, train, loss_fn, optimizer, amp, no_grad, set_to_none
        )
        with workload as step:
            report = measure_latency(step, target, timing, train=train, batch_size=batch_size_of((args, kwargs)))
            result.latency = report
            result.latency_seconds = report.median
            result.machine = report.machine
            if timing.layers:
                times = layer_times(step, named_modules, target, timing.layer_repeats, timing.trace)
                times.apply(result.modules)
                roll_up_containers(result.modules, result.flops)
                result.op_times = times.ops
                result.profiler_events = times.events
    return result


@contextlib.contextmanager
def _workload(
    model: nn.Module,
    named_modules: list[tuple[str, nn.Module]],
    named_params: dict[str, torch.Tensor],
    named_buffers: dict[str, torch.Tensor],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    target: torch.device,
    train: bool,
    loss_fn: Any,
    optimizer: torch.optim.Optimizer | None,
    autocast: Callable[[], Any],
    no_grad: bool,
    set_to_none: bool,
) -> Iterator[Callable[[], Any]]:
    """One call of the workload on real tensors and no meters, ready to be timed.

    The same isolation as a metered run: the caller's model, tensors and optimizer are
    not touched (a training step works on its own tensors and optimizer copy), the
    train/eval flags and the RNG state are restored afterwards.
    """
    params, buffers, run_args, run_kwargs, run_optimizer = _run_copies(
        model, named_params, named_buffers, args, kwargs, None, target, train, optimizer
    )
    in_place = not train and all(t.device == target for t in (*named_params.values(), *named_buffers.values()))
    state = None if in_place else {**params, **buffers}
    trainable = [t for t in params.values() if t.requires_grad]

    def forward() -> Any:
        if state is None:
            return model(*run_args, **run_kwargs)
        return torch.func.functional_call(model, state, run_args, run_kwargs, tie_weights=True, strict=False)

    def step() -> Any:
        if not train:
            with torch.set_grad_enabled(not no_grad), autocast():
                return forward()
        with autocast():
            output = forward()
            loss = loss_fn(output) if loss_fn is not None else _sum_of_outputs(output)
        loss.backward()
        if run_optimizer is not None:
            run_optimizer.step()
            run_optimizer.zero_grad(set_to_none=set_to_none)
        else:
            for tensor in trainable:
                tensor.grad = None
        return output

    flags = {module: module.training for _, module in named_modules}
    with torch.random.fork_rng(devices=[target] if target.type == "cuda" else [], device_type=target.type), _restore_training_flags(flags):
        model.train(train)
        if run_optimizer is not None:
            _create_state(run_optimizer)
        yield step


def _saver(memory: MemoryMeter, tracker: ModuleTracker) -> Any:
    def pack(tensor: torch.Tensor) -> torch.Tensor:
        memory.saved_for_backward(tensor, tracker.key or ROOT)
        return tensor

    return pack


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _split_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, dict):
        _check_keywords(inputs)
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        if len(inputs) == 2 and isinstance(inputs[0], (tuple, list)) and isinstance(inputs[1], dict):
            _check_keywords(inputs[1])
            return tuple(inputs[0]), dict(inputs[1])
        return tuple(inputs), {}
    raise TypeError(
        "inputs must be a tensor, a tuple of positional inputs, a dict of keyword inputs "
        f"or a pair (args, kwargs); got {type(inputs).__name__}"
    )


def _check_keywords(kwargs: dict[Any, Any]) -> None:
    bad = [k for k in kwargs if not isinstance(k, str)]
    if bad:
        raise TypeError(f"keyword inputs need string keys, got {bad[0]!r}")


DEVICE_KINDS = ("cpu", "cuda", "meta")  # what device= accepts ("meta": analytic)


def device_kind(device: str) -> str | None:
    """The kind of device a ``device=`` string names (``"cuda:1"`` -> ``"cuda"``); None if torch cannot parse it."""
    try:
        return torch.device(device).type
    except (RuntimeError, ValueError):
        return None


def _choose_mode(
    model: nn.Module, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], inputs: Any, device: str | torch.device | None
) -> tuple[FakeTensorMode | None, torch.device]:
    tensors = [*params.values(), *buffers.values(), *(t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor))]
    existing_fake = next((t.fake_mode for t in tensors if isinstance(t, FakeTensor)), None)
    model_device = next((t.device for t in tensors if not isinstance(t, FakeTensor)), None)
    if existing_fake is not None:
        fake_device = next(t.device for t in tensors if isinstance(t, FakeTensor))
        return existing_fake, fake_device
    requested = torch.device(device) if device is not None else None
    if requested is not None and requested.type == "meta":
        # fake tensors claim the model's own device, so kernels are chosen as in a real run
        claimed = model_device if model_device is not None and model_device.type != "meta" else torch.device("cpu")
        # tensors the model keeps outside its parameters and buffers (plain attributes,
        # closures) become fake on first use
        return FakeTensorMode(allow_non_fake_inputs=True), claimed
    target = requested or model_device or torch.device("cpu")
    if target.type == "meta":
        raise ProfileError(f"{type(model).__name__} has tensors on the meta device: profile it analytically with device='meta'")
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ProfileError(f"device {str(target)!r} was asked for, but CUDA is not available on this machine")
    return None, target


def _run_copies(
    model: nn.Module,
    named_params: dict[str, torch.Tensor],
    named_buffers: dict[str, torch.Tensor],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    fake_mode: FakeTensorMode | None,
    target: torch.device,
    train: bool,
    optimizer: torch.optim.Optimizer | None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], tuple[Any, ...], dict[str, Any], torch.optim.Optimizer | None]:
    """Tensors for the run (made outside any fake mode), and its copy of the optimizer over them:
    the caller's tensors never receive gradients or in-place updates."""
    # an optimizer step writes into the parameters: then the run needs copies of its own
    copy_params = optimizer is not None

    def convert(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(target) if fake_mode is None else _to_fake(t, fake_mode, target)

    def parameter(t: torch.Tensor) -> torch.Tensor:
        run = t.detach().to(target, copy=True) if copy_params and fake_mode is None else convert(t)
        return run.requires_grad_(train and t.requires_grad)

    def copy(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        copied = t.detach().to(target, copy=True) if fake_mode is None else convert(t)
        if copied.is_floating_point() or copied.is_complex():
            copied.requires_grad_(t.requires_grad)
        return copied

    params = {name: parameter(t) for name, t in named_params.items()}
    buffers = {name: copy(t) if train else convert(t) for name, t in named_buffers.items()}
    run_args, run_kwargs = tree_map(copy, (args, kwargs))
    run_optimizer = None
    if optimizer is not None:
        run_tensors = {id(named_params[name]): tensor for name, tensor in params.items()}
        run_optimizer = _copy_optimizer(optimizer, run_tensors, lambda t: _copy_state(t, fake_mode, target), type(model).__name__)
    return params, buffers, run_args, run_kwargs, run_optimizer


def _run(
    model: nn.Module,
    state: dict[str, torch.Tensor] | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    train: bool,
    loss_fn: Any,
    tracker: ModuleTracker,
    meter: FlopMeter,
    optimizer: torch.optim.Optimizer | None,
    parameters: dict[str, torch.Tensor],
    grad: bool,
    set_to_none: bool,
    autocast: Any,
) -> None:
    try:
        with torch.set_grad_enabled(grad), autocast:
            if state is None:
                output = model(*args, **kwargs)
            else:
                output = torch.func.functional_call(model, state, args, kwargs, tie_weights=True, strict=False)
    except FormulaError:
        raise
    except Exception as error:
        raise _model_error(model, tracker, error) from error
    if not train:
        if meter.memory is not None:
            meter.memory.record_parameters(parameters)
        return
    meter.region = "loss"
    try:
        with autocast:
            loss = loss_fn(output) if loss_fn is not None else _sum_of_outputs(output)
    except Exception as error:
        raise ProfileError(f"the loss function raised {type(error).__name__}: {error}") from error
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ProfileError(f"the loss must be a scalar tensor, got {shape}")
    if not loss.requires_grad:
        raise ProfileError("the loss does not depend on any parameter that requires grad: nothing to backpropagate")
    try:
        loss.backward()  # type: ignore[no-untyped-call]
    except FormulaError:
        raise
    except Exception as error:
        raise ProfileError(f"the backward pass of {type(model).__name__} raised {type(error).__name__}: {error}") from error
    if meter.memory is not None:
        meter.memory.record_parameters(parameters)
    if optimizer is None:
        return
    try:
        meter.region = "optimizer"
        optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)
    except FormulaError:
        raise
    except Exception as error:
        raise ProfileError(f"the step of {type(optimizer).__name__} raised {type(error).__name__}: {error}") from error


def _copy_optimizer(
    optimizer: torch.optim.Optimizer, run_tensors: dict[int, torch.Tensor], copy_state: Any, model: str
) -> torch.optim.Optimizer:
    """The same optimizer (class, groups, hyperparameters, state) over the run's tensors."""
    groups = []
    for group in optimizer.param_groups:
        params = []
        for param in group["params"]:
            run = run_tensors.get(id(param))
            if run is None:
                raise ProfileError(f"the optimizer holds a parameter of shape {tuple(param.shape)} that is not one of {model}'s parameters")
            params.append(run)
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
    accepted = inspect.signature(type(optimizer)).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    try:
        copy = type(optimizer)(groups, **defaults)
    except TypeError as error:
        raise ProfileError(f"cannot make a copy of {type(optimizer).__name__} for the run: {error}") from error
    for param, state in optimizer.state.items():
        run = run_tensors.get(id(param))
        if run is not None:
            copy.state[run] = {k: copy_state(v) if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    return copy


def _create_state(optimizer: torch.optim.Optimizer) -> None:
    """Make an optimizer that creates its state lazily hold it, as it does from its second
    step on: one step on zero gradients, before the run and unmetered."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if all(optimizer.state.get(p) for p in params):
        return
    with torch.no_grad():
        for param in params:
            param.grad = torch.zeros_like(param)
        optimizer.step()
        for param in params:
            param.grad = None


def _copy_state(t: torch.Tensor, fake_mode: FakeTensorMode | None, target: torch.device) -> torch.Tensor:
    if fake_mode is None:  # CPU step counters stay on the CPU, as optimizers keep them
        return t.detach().to(t.device if t.dim() == 0 and t.device.type == "cpu" else target, copy=True)
    return _to_fake(t, fake_mode, target)


def _to_fake(t: torch.Tensor, fake_mode: FakeTensorMode, target: torch.device) -> torch.Tensor:
    """``t`` as a fake tensor of ``fake_mode`` claiming ``target`` (meta tensors) or its own device."""
    if isinstance(t, FakeTensor):
        return t.detach()
    if t.device.type == "meta":
        return fake_mode.fake_tensor_converter.from_meta_and_device(fake_mode, t.detach(), target)
    return fake_mode.from_tensor(t.detach())


def _sum_of_outputs(output: Any) -> torch.Tensor:
    tensors = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]
    if not tensors:
        raise ProfileError("the model's output holds no floating-point tensor to sum into a loss; pass loss_fn")
    loss = tensors[0].sum()
    for t in tensors[1:]:
        loss = loss + t.sum()
    return loss.real if loss.is_complex() else loss


def _model_error(model: nn.Module, tracker: ModuleTracker, error: Exception) -> ProfileError:
    where = tracker.innermost()
    if where is None:
        place = f"{type(model).__name__} (the model itself)"
    else:
        path, module = where
        place = f"module {path or '<root>'!r} ({type(module).__name__})"
    return ProfileError(f"{place} raised {type(error).__name__}: {error}")


@contextlib.contextmanager
def _restore_training_flags(flags: dict[nn.Module, bool]) -> Iterator[None]:
    try:
        yield
    finally:
        for module, training in flags.items():
            if module.training is not training:  # Module.__setattr__ is slow on deep models
                module.training = training


def _build_profile(
    model: nn.Module,
    named_modules: list[tuple[str, nn.Module]],
    meter: FlopMeter,
    tracker: ModuleTracker,
    named_params: dict[str, torch.Tensor],
    named_buffers: dict[str, torch.Tensor],
    train: bool,
    target: torch.device,
    analytic: bool,
) -> Profile:
    result = Profile(
        model=type(model).__name__,
        train=train,
        device=str(target),
        analytic=analytic,
        uncounted=dict(sorted(meter.uncounted.items())),
        **model_figures(named_params.values(), named_buffers.values()),
    )
    modules = _module_rows(named_modules, tracker)
    ops: dict[tuple[str, str], OpStats] = {}
    for (phase, key, name), (calls, flops, macs, allocated) in meter.tally.items():
        setattr(result, f"{phase}_flops", getattr(result, f"{phase}_flops") + flops)
        setattr(result, f"{phase}_macs", getattr(result, f"{phase}_macs") + macs)
        row = ops.setdefault((name, phase), OpStats(name, phase))
        row.calls += calls
        row.flops += flops
        row.macs += macs
        row.allocated_bytes += allocated
        if key:
            row.modules.append(key[-1])
            if phase != "loss":
                modules[key[-1]].ops.append(ModuleOp(name, phase, calls, flops, macs))
        _attribute(modules, key, phase, flops, macs)
    for row in ops.values():
        row.modules = sorted(set(row.modules))
    for stats in modules.values():
        stats.ops.sort(key=lambda o: (-o.flops, o.op, o.phase))
    result.ops = sorted(ops.values(), key=lambda r: (-r.flops, r.op, r.phase))
    total = result.flops
    for stats in modules.values():
        stats.share = stats.flops / total if total else 0.0
    result.modules = list(modules.values())
    if meter.memory is not None:
        _add_memory(result, modules, meter.memory, {name for _, _, name in meter.tally}, target)
    roll_up_containers(result.modules, total)
    return result


_SUMMED = ("forward_flops", "backward_flops", "recompute_flops", "forward_macs", "backward_macs", "activation_bytes")
_HIGHEST = ("forward_peak_bytes", "backward_peak_bytes")
_TIMES = ("forward_seconds", "backward_seconds", "forward_device_seconds", "backward_device_seconds")


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


def _cuda_estimates(memory: MemoryMeter, ran: set[str], target: torch.device) -> dict[str, int | None]:
    """What a CUDA process holds beyond the allocated bytes, estimated (see :mod:`.cuda_estimates`)."""
    sm90 = False
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(target)
        sm90 = (major, minor) == (9, 0)
    workspace = cublas_workspace_bytes(sm90) if ran & CUBLAS_OPS else 0
    events = memory.events or []
    # the workspace comes from the allocator at the first matrix product: replayed first
    reserved = reserved_bytes(([(-1, workspace)] if workspace else []) + events)
    return {"reserved_bytes": reserved, "cublas_workspace_bytes": workspace, "cudnn_workspace_bytes": None, "cuda_context_bytes": None}


def _add_memory(result: Profile, modules: dict[str, ModuleStats], memory: MemoryMeter, ran: set[str], target: torch.device) -> None:
    phase, key = memory.peak_where
    result.memory = MemoryReport(
        peak_bytes=memory.peak,
        peak_phase=phase,
        peak_module=key[-1] if key else "",
        peak_breakdown=dict(zip(CATEGORIES, memory.peak_breakdown)),
        category_max=dict(zip(CATEGORIES, memory.category_max)),
        categories=list(CATEGORIES),
        timeline=[(phase, list(row)) for phase, row in memory.timeline],
        block_bytes=memory.round_to,
        parameters=memory.parameters,
        estimates=_cuda_estimates(memory, ran, target) if memory.events is not None else {},
    )
    result.peak_memory_bytes = memory.peak
    if result.train:  # what the backward pass needs kept: the tensors saved for it
        result.peak_activation_bytes = memory.category_max[ACTIVATIONS]
    else:  # nothing is kept for a backward pass: the intermediate tensors alive at once
        result.peak_activation_bytes = max((row[ACTIVATIONS] + row[TEMPORARIES] for _, row in memory.timeline), default=0)
    for path, stats in modules.items():
        stats.activation_bytes = memory.module_activations.get(path, 0)
        stats.forward_peak_bytes = memory.module_peaks.get((path, False), 0)
        stats.backward_peak_bytes = memory.module_peaks.get((path, True), 0)


def _module_rows(named_modules: list[tuple[str, nn.Module]], tracker: ModuleTracker) -> dict[str, ModuleStats]:
    params = _parameters_per_module(named_modules)
    return {
        path: ModuleStats(
            path=path,
            type=type(module).__name__,
            depth=path.count(".") + 1 if path else 0,
            calls=tracker.calls.get(path, 0),
            params=sum(params[id(module)].values()),
        )
        for path, module in named_modules
    }


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

    visit(named_modules[0][1])
    return found


def _attribute(modules: dict[str, ModuleStats], key: StackKey, phase: str, flops: int, macs: int) -> None:
    if not key or phase == "loss":
        return
    innermost = modules[key[-1]]
    if phase == "forward":
        innermost.self_forward_flops += flops
    elif phase == "backward":
        innermost.self_backward_flops += flops
    for path in key:
        stats = modules[path]
        if phase == "forward":
            stats.forward_flops += flops
            stats.forward_macs += macs
        elif phase == "backward":
            stats.backward_flops += flops
            stats.backward_macs += macs
        else:
            stats.recompute_flops += flops
