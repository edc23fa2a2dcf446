"""What holds for a call of any ATen op: its arguments by name, and work done beneath the run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes

# ``device`` asked in C++ of a tensor that answers it in Python, a fake tensor: the autograd engine asks it
# of every tensor it records or checks, and each question is dispatched through every mode above the fake
# mode (two in three of the dispatches of an analytic training step): those modes answer it at once
DEVICE_QUERY = torch.ops.prim.device.default


def bound_arguments(func: Any, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments by the names of ``func``'s schema; one the call left out (the dispatcher drops
    trailing arguments equal to their defaults) is its default. Without a schema: none."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return {}
    bound: dict[str, Any] = {}
    for index, argument in enumerate(schema.arguments):
        if index < len(args):
            bound[argument.name] = args[index]
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
        else:
            bound[argument.name] = argument.default_value if argument.has_default_value() else None
    return bound


@contextlib.contextmanager
def beneath_the_run() -> Iterator[None]:
    """Tensor work that is no op of the step: beneath the run's dispatch and function modes, untracked
    by autograd."""
    with _disable_current_modes(), torch._C.DisableTorchFunction(), torch.no_grad():
        yield


# elements: an analytic run works out the values of tensors up to this size (made from constants and real
# inputs; see analytic/values.py), and no larger (a causal mask of 2048 tokens is at it)
VALUES_LIMIT = 1 << 22


def fake_device(tensor: Any) -> torch.device | None:
    """The fake mode's answer to :data:`DEVICE_QUERY` of ``tensor`` (its ``_device_handler``'s), or None where
    ``tensor`` is not a fake tensor."""
    if not isinstance(tensor, FakeTensor):
        return None
    return torch.device("meta") if tensor.fake_mode.in_kernel_invocation else tensor.fake_device
