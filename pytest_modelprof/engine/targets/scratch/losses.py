"""Kernel scratch of losses.

**CTC** (:func:`ctc_scratch`): the backward pass's backward variables, and per-sequence offsets.

**Reduced losses** (:func:`loss_scratch`): the elementwise loss that ``mse_loss``, ``smooth_l1_loss`` and
``soft_margin_loss`` compute before reducing it, and the reduction's own staging.
"""

from __future__ import annotations

from typing import Any

import torch

from ...ops import bound_arguments
from .reductions import reduction_scratch

# losses that compute the elementwise loss inside their call and then reduce it


def loss_scratch(
    name: str, func: Any, args: Any, kwargs: dict[str, Any], out: Any, sm_count: int, capability: tuple[int, int]
) -> list[int]:
    """What a reduced loss allocates inside its call (aten/src/ATen/native/Loss.cpp, cuda/Loss.cu), beside
    its output (which is made for the elementwise loss and resized to the scalar, see
    :mod:`...analytic.kernel_outputs`): ``mse_loss`` and ``smooth_l1_loss`` compute the elementwise loss into a
    tensor of their own and reduce it into the output; ``soft_margin_loss`` makes ``input * target``
    first; ``binary_cross_entropy`` reduces its output into a new scalar and copies it back. Each
    reduction stages as :func:`reduction_scratch` works out."""
    bound = bound_arguments(func, args, kwargs)
    source, target, reduction = bound["self"], bound["target"], bound["reduction"]
    if not isinstance(out, torch.Tensor) or not reduction or not isinstance(source, torch.Tensor):
        return []
    elementwise = torch.empty(torch.broadcast_shapes(source.shape, target.shape), dtype=out.dtype, device="meta")  # type: ignore[no-untyped-call]
    packet, overload = ("aten.mean", torch.ops.aten.mean.default) if reduction == 1 else ("aten.sum", torch.ops.aten.sum.default)
    staging = reduction_scratch(packet, overload, (elementwise,), {}, out, sm_count, capability)
    first = out.element_size() if name == "aten.binary_cross_entropy" else elementwise.numel() * elementwise.element_size()
    return [first, *staging]


def ctc_scratch(name: str, func: Any, args: Any, kwargs: dict[str, Any]) -> list[int]:
    """What CTC's CUDA kernels allocate beside their outputs (aten/src/ATen/native/cuda/LossCTC.cu): each
    sequence's target offset, target length and input length (int64); the backward pass's backward
    variables, ``log_alpha``'s shape. cuDNN's (cudnn/LossCTC.cpp): the targets and lengths copied to
    the GPU where they are on the CPU; its workspace is sized by cuDNN at run time and not included."""
    bound = bound_arguments(func, args, kwargs)
    log_probs = bound["log_probs"]
    if name == "aten._cudnn_ctc_loss":
        targets, inputs, lengths = bound["targets"], bound["input_lengths"], bound["target_lengths"]
        if not isinstance(inputs, torch.Tensor):
            return []  # lengths as lists: cuDNN reads the targets where they are, on the CPU
        # as written there: the target lengths are copied where the input lengths are on the CPU
        copied = [t for t, cpu in ((targets, targets), (inputs, inputs), (lengths, inputs)) if cpu.device.type == "cpu"]
        return [t.numel() * t.element_size() for t in copied if t.numel()]
    per_sequence = [8 * log_probs.shape[1]] * 3
    if name == "aten._ctc_loss":
        return per_sequence
    log_alpha = bound["log_alpha"]
    return [*per_sequence, log_alpha.numel() * log_alpha.element_size()]
