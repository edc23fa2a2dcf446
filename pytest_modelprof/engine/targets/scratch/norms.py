"""Kernel scratch of the normalisations.

**Layer and RMS norm's backward pass over many rows** (:func:`norm_backward_scratch`): the
weight's and bias's gradients summed per block of rows first, then over the blocks.
"""

from __future__ import annotations

from typing import Any

import torch

from ...ops import bound_arguments
from ..norm_kernel import column_blocks, normalized_width, rows_split
from .reductions import reduction_scratch


def norm_backward_scratch(name: str, func: Any, args: Any, kwargs: dict[str, Any], sm_count: int, capability: tuple[int, int]) -> list[int]:
    """What layer norm's (and RMS norm's) CUDA backward allocates for the weight's and bias's
    gradients when the rows are many and narrow (aten/src/ATen/native/cuda/layer_norm_kernel.cu,
    ``LaunchGammaBetaBackwardCUDAKernel``): over 65536 rows with fewer 32-column blocks than half
    the SMs, each block of 32 rows (at most 32768 / column blocks of them) writes its partial
    sums, which ``.sum(0)`` then reduces (an ATen reduction inside the op, with its own staging).
    Both partial buffers live until both sums are done; a sum's result replaces the gradient
    allocated before, so at the moment of a sum: the buffers, its result and its staging."""
    bound = bound_arguments(func, args, kwargs)
    source, weight, mask = bound.get("input"), bound.get("weight"), bound.get("output_mask")
    if not isinstance(source, torch.Tensor) or not isinstance(weight, torch.Tensor) or not mask:
        return []
    width = normalized_width(bound.get("normalized_shape"))
    rows = source.numel() // max(width, 1)
    if not rows_split(rows, width, sm_count):
        return []
    gradients = [bool(mask[1])] + ([bool(mask[2]) and bound.get("bias") is not None] if name == "aten.native_layer_norm_backward" else [])
    if not any(gradients):
        return []
    block_rows = min(32 * 1024 // column_blocks(width), -(-rows // 32))
    partial = torch.empty(block_rows, width, dtype=weight.dtype, device="meta")
    result = torch.empty(width, dtype=weight.dtype, device="meta")
    staging = reduction_scratch("aten.sum", torch.ops.aten.sum.dim_IntList, (partial, [0]), {}, result, sm_count, capability)
    buffers = [block_rows * width * weight.element_size()] * sum(gradients)
    return [size for size in (*buffers, width * weight.element_size(), *staging) if size]
