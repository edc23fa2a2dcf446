"""Kernel scratch: memory a CUDA kernel takes from the caching allocator inside one op call.

Some of PyTorch's CUDA kernels allocate through the caching allocator while they run and
free before the op returns. No ATen op shows these allocations (they are made below the
dispatcher, and fake tensors run no kernel), yet ``torch.cuda.max_memory_allocated``
counts them: the memory meter adds them to the op's moment (:mod:`...meters.memory`).

One module per kind of op: :mod:`.reductions` (ATen's reduction kernels, also run inside other
ops), :mod:`.convolutions` (a convolution's bias gradient, cuDNN's workspaces), :mod:`.attention`
(FlashAttention-2's, cuDNN attention's and the memory-efficient kernels'), :mod:`.norms` (layer and
RMS norm's backward pass), :mod:`.losses` (reduced losses, CTC), :mod:`.sampling` (an embedding's
backward pass, cuDNN's grid sampler), :mod:`.rnn` (the copies around cuDNN's recurrent calls).
:func:`kernel_scratch` asks the one an op belongs to.
"""

from __future__ import annotations

from typing import Any

from .attention import (
    CUDNN_ATTENTION_BACKWARD,
    EFFICIENT_BACKWARD,
    EFFICIENT_FORWARD,
    FLASH_BACKWARD,
    cudnn_attention_backward_scratch,
    efficient_attention_scratch,
    flash_backward_scratch,
)
from .convolutions import convolution_bias_scratch, convolution_workspaces
from .losses import LOSSES, ctc_scratch, loss_scratch
from .norms import norm_backward_scratch
from .reductions import REDUCTIONS, reduction_scratch
from .rnn import rnn_scratch
from .sampling import embedding_backward_scratch, grid_sampler_scratch

__all__ = [
    "convolution_bias_scratch",
    "convolution_workspaces",
    "ctc_scratch",
    "cudnn_attention_backward_scratch",
    "efficient_attention_scratch",
    "embedding_backward_scratch",
    "flash_backward_scratch",
    "grid_sampler_scratch",
    "kernel_scratch",
    "loss_scratch",
    "norm_backward_scratch",
    "reduction_scratch",
    "rnn_scratch",
]


def kernel_scratch(
    name: str, func: Any, args: Any, kwargs: dict[str, Any], out: Any, sm_count: int, capability: tuple[int, int]
) -> list[int]:
    """The allocations (bytes) an op makes inside its call on a GPU of ``sm_count`` SMs and ``capability``."""
    if name in REDUCTIONS:
        return reduction_scratch(name, func, args, kwargs, out, sm_count, capability)
    if name == "aten.convolution_backward":
        return convolution_bias_scratch(func, args, kwargs, out, sm_count, capability)
    if name in FLASH_BACKWARD:
        return flash_backward_scratch(name, func, args, kwargs, sm_count)
    if name in CUDNN_ATTENTION_BACKWARD:
        return cudnn_attention_backward_scratch(func, args, kwargs)
    if name in EFFICIENT_FORWARD or name in EFFICIENT_BACKWARD:
        return efficient_attention_scratch(name, func, args, kwargs, capability)
    if name == "aten.embedding_dense_backward":
        return embedding_backward_scratch(func, args, kwargs)
    if name in ("aten.native_layer_norm_backward", "aten._fused_rms_norm_backward"):
        return norm_backward_scratch(name, func, args, kwargs, sm_count, capability)
    if name in ("aten.cudnn_grid_sampler", "aten.cudnn_grid_sampler_backward"):
        return grid_sampler_scratch(func, args, kwargs)
    if name in ("aten._ctc_loss", "aten._ctc_loss_backward", "aten._cudnn_ctc_loss"):
        return ctc_scratch(name, func, args, kwargs)
    if name in LOSSES:
        return loss_scratch(name, func, args, kwargs, out, sm_count, capability)
    return rnn_scratch(name, func, args, kwargs)
