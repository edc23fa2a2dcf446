"""Kernel scratch of the ops that gather by index or by coordinate.

**An embedding's backward pass** (:func:`embedding_backward_scratch`): sorting the indices and
the float partial sums of the rows they pick, one row per index.

**cuDNN's grid sampler** (:func:`grid_sampler_scratch`): contiguous copies of its arguments.
"""

from __future__ import annotations

from typing import Any

import torch

from ...ops import bound_arguments


def embedding_backward_scratch(func: Any, args: Any, kwargs: dict[str, Any]) -> list[int]:
    """What ``embedding_dense_backward`` allocates on CUDA beside the weight's gradient
    (aten/src/ATen/native/cuda/Embedding.cu and EmbeddingBackwardKernel.cu): the gradient and the
    indices made contiguous where they are not; up to 3072 indices (without
    ``scale_grad_by_freq``) nothing else. Beyond: the indices sorted and their original
    positions (and with ``scale_grad_by_freq`` each index's count), then, while the rows are
    summed, four index arrays of the indices' length (segment offsets, partial segments per
    segment, their offsets, partial-segment offsets), two counters, and the partial sums: one
    row of the weight's width per index, in float for half-precision gradients. The sort's own
    buffers (freed before the sums begin, a few KiB beyond two index arrays) are the smaller
    moment and not counted."""
    bound = bound_arguments(func, args, kwargs)
    grad, indices = bound.get("grad_output"), bound.get("indices")
    if not isinstance(grad, torch.Tensor) or not isinstance(indices, torch.Tensor) or grad.dim() < 1:
        return []
    copies = [t.numel() * t.element_size() for t in (grad, indices) if not t.is_contiguous()]
    count, index_bytes = indices.numel(), indices.numel() * indices.element_size()
    scaled = bool(bound.get("scale_grad_by_freq"))
    if count <= 3072 and not scaled:
        return [size for size in copies if size]
    width = grad.shape[-1]
    partial = 4 if grad.dtype in (torch.float16, torch.bfloat16) else grad.element_size()
    sorting = [index_bytes, index_bytes] + ([index_bytes] if scaled else [])
    summing = [index_bytes, 8, index_bytes, index_bytes, 8, index_bytes, count * width * partial]
    return [size for size in (*copies, *sorting, *summing) if size]


def grid_sampler_scratch(func: Any, args: Any, kwargs: dict[str, Any]) -> list[int]:
    """The copies cuDNN's grid sampler makes of its arguments (aten/src/ATen/native/cudnn/GridSampler.cpp):
    the grid made contiguous, the input (and in the backward pass the output's gradient) made
    contiguous where a stride is 0 (``contiguousIfZeroInStrides``: an expanded tensor)."""
    bound = bound_arguments(func, args, kwargs)
    copies = []
    for argument in ("self", "grid", "grad_output"):
        tensor = bound.get(argument)
        if not isinstance(tensor, torch.Tensor):
            continue
        copied = not tensor.is_contiguous() and (argument == "grid" or 0 in tensor.stride())
        if copied:
            copies.append(tensor.numel() * tensor.element_size())
    return copies
