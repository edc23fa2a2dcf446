"""Ops an analytic run makes above its fake mode, as the mode would make them, where the mode costs many times more.

A fake mode makes a view's output by its meta kernel and wraps it; the known-values layer (:mod:`.values`) does the
same, without the way down, for three kinds of op that reach the mode in the thousands: autograd's detach of each
tensor it saves, ``_unsafe_view`` (a linear layer of a 3-d input folds its product back with it: the mode's cache
leaves it out), and an optimizer's in-place foreach ops (the mode runs their meta kernel tensor by tensor). Each
answer is the one the mode gives, or none: where the mode would do more (work out a constant's value, raise an
error, resize an output), or where another mode beneath the run's (a caller's) waits to see the op, the op goes
down as before.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, in_kernel_invocation_manager

from .layers import fake_mode_beneath


def fake_mode_alone() -> FakeTensorMode | None:
    """The fake mode beneath the run's modes where it is the only mode beneath (no mode of the caller's, entered before
    the run, nor another infra mode waits to see an op), else None."""
    return fake_mode_beneath() if torch._C._len_torch_dispatch_stack() == 1 else None


def of_the_fake_mode_alone(t: Any) -> bool:
    """Whether ``t`` is a fake tensor of the fake mode beneath, the only mode beneath (:func:`fake_mode_alone`)."""
    return type(t) is FakeTensor and t.fake_mode is fake_mode_alone()


def detached(t: FakeTensor) -> FakeTensor:
    """``t.detach()``: a fake tensor of ``t``'s mode on the same storage (a constant's value detached too), made
    as that mode makes a view's output (its meta kernel, then the output wrapped) but without dispatching
    ``detach`` through the mode, which costs five times as much, and a constant's forty (copying a 7B model's
    parameters and optimizer state for a run spent a tenth of a step on it). A symbolic shape, or dispatch keys
    the mode keeps for the output, go through the mode."""
    if t.fake_mode.shape_env is not None or getattr(t, "dispatch_keys", None) is not None:
        return torch.ops.aten.detach.default(t)  # type: ignore[no-any-return]
    made = _as_the_mode_makes(t, torch.ops.aten.detach.default)
    if t.constant is not None:
        made.constant = t.constant.detach()
    return made


def unsafe_viewed(t: FakeTensor, size: Any) -> FakeTensor | None:
    """``aten._unsafe_view(t, size)`` (a matmul's output folded back to its batch dimensions, on every linear layer
    of a 3-d input) made as :func:`detached` makes a detach: a fake tensor of ``t``'s mode on the same storage. The
    mode makes it on its uncached path, a view that autograd does not see as one, for some twenty times the cost.
    None (the mode's way, with its errors) for the rest: a tensor not contiguous, a constant, a symbolic shape,
    dispatch keys the mode keeps, or a size that does not fit."""
    mode = t.fake_mode
    if mode.shape_env is not None or t.constant is not None or getattr(t, "dispatch_keys", None) is not None or not t.is_contiguous():
        return None
    try:
        return _as_the_mode_makes(t, torch.ops.aten._unsafe_view.default, size)
    except RuntimeError:
        return None


def _as_the_mode_makes(t: FakeTensor, view: Any, *args: Any) -> FakeTensor:
    """``view(t, *args)`` as ``t``'s mode makes a view's output: its meta kernel, the output wrapped on ``t``'s device."""
    mode = t.fake_mode
    with in_kernel_invocation_manager(mode):
        meta = view(t, *args)
    return mode.fake_tensor_converter.from_meta_and_device(mode, meta, t.fake_device)


def in_place_foreach(func: Any) -> bool:
    """Whether ``func`` is an in-place foreach op (``_foreach_add_``, ``_foreach_addcdiv_``, ...: an optimizer's step),
    which writes its first list, and nothing else, and returns nothing (not an ``out=`` overload, whose outputs
    the op may resize: ``_foreach_norm``'s are 0-dim)."""
    schema = func._schema
    if not schema.name.startswith("aten::_foreach_") or schema.returns or not schema.arguments:
        return False
    written = [argument.alias_info is not None and argument.alias_info.is_write for argument in schema.arguments]
    return written[0] and not any(written[1:])


def writes_in_place_alone(mode: FakeTensorMode, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether an in-place foreach op (:func:`in_place_foreach`) of these operands changes nothing a fake run sees:
    lists of fake tensors of ``mode`` (the mode the op would reach) and numbers, every list as long as the first,
    the tensors at each place alike (shape, dtype, device; contiguous, floating point, none a constant). Its meta
    kernel then checks nothing that can fail and changes no tensor's metadata; the mode runs that kernel tensor by
    tensor, a tenth of an AdamW step of a 7B model on fake tensors. Any doubt: False (the mode's way)."""
    if mode.shape_env is not None:
        return False
    lists: list[Any] = []
    length = -1
    for argument in (*args, *kwargs.values()):
        if isinstance(argument, (list, tuple)):
            if length < 0:
                length = len(argument)
            if len(argument) != length:
                return False
            if argument and isinstance(argument[0], torch.Tensor):
                lists.append(argument)
            elif not all(type(x) in (bool, int, float) for x in argument):
                return False
        elif argument is not None and type(argument) not in (bool, int, float):
            return False  # a tensor of scalars, a complex number
    if not lists or length <= 0:
        return False
    for place in zip(*lists):
        first = place[0]
        for t in place:
            if (
                type(t) is not FakeTensor
                or t.fake_mode is not mode
                or t.constant is not None
                or getattr(t, "dispatch_keys", None) is not None
                or t.shape != first.shape
                or t.dtype != first.dtype
                or t.fake_device != first.fake_device
                or not t.is_floating_point()
                or not t.is_contiguous()
            ):
                return False
    return True
