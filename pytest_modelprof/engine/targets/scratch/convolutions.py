"""Kernel scratch of convolutions.

**A convolution's bias gradient** (:func:`convolution_bias_scratch`): a reduction (:mod:`.reductions`) that ATen
makes inside ``convolution_backward``.

**cuDNN's convolution workspaces** (:func:`convolution_workspaces`): one per cuDNN operation a
convolution runs (the forward pass; the input's and the weight's gradients, one after the other),
each held alone, as cuDNN sizes it for the target GPU (:mod:`..cudnn`).
"""

from __future__ import annotations

from typing import Any

import torch

from ...ops import bound_arguments
from .. import cudnn
from .reductions import reduction_scratch

CONVOLUTIONS = frozenset({"aten.convolution", "aten.convolution_backward"})


def convolution_workspaces(name: str, func: Any, args: Any, kwargs: dict[str, Any], out: Any, gpu: cudnn.Device) -> list[int] | None:
    """The workspaces (bytes) that cuDNN's operations for a convolution take on ``gpu``, in the order
    they run, each freed before the next (none where cuDNN does not run the op); ``None`` where
    cuDNN runs it but its workspaces cannot be known here (:func:`..cudnn.workspace_bytes`)."""
    if name not in CONVOLUTIONS:
        return []
    sizes = [cudnn.workspace_bytes(operation, gpu) for operation in cudnn.convolutions(name, bound_arguments(func, args, kwargs), out)]
    if any(size is None for size in sizes):
        return None
    return [size for size in sizes if size]


def convolution_bias_scratch(
    func: Any, args: Any, kwargs: dict[str, Any], out: Any, sm_count: int, capability: tuple[int, int]
) -> list[int]:
    """A convolution's bias gradient, summed by ATen inside ``convolution_backward`` after the
    backend's kernels (cuDNN's do not make it): ``grad_output`` over every dimension but the channels."""
    bound = bound_arguments(func, args, kwargs)
    grad_output, mask = bound.get("grad_output"), bound.get("output_mask")
    if not isinstance(grad_output, torch.Tensor) or not mask or not mask[2] or not isinstance(out, (tuple, list)):
        return []
    dims = [d for d in range(grad_output.dim()) if d != 1]
    return reduction_scratch("aten.sum", torch.ops.aten.sum.dim_IntList, (grad_output, dims), {}, out[2], sm_count, capability)
