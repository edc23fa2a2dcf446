"""Kernel scratch: memory a CUDA kernel takes from the caching allocator inside one op call.

Some of PyTorch's CUDA kernels allocate through the caching allocator while they run and
free before the op returns. No ATen op shows these allocations (they are made below the
dispatcher, and fake tensors run no kernel), yet ``torch.cuda.max_memory_allocated``
counts them: the memory meter adds them to the op's moment (:mod:`...meters.memory`).

One module per kind of op: :mod:`.reductions` (ATen's reduction kernels, also run inside other
ops), :mod:`.convolutions` (a convolution's bias gradient, cuDNN's workspaces), :mod:`.attention`
(FlashAttention-2's, cuDNN attention's and the memory-efficient kernels'), :mod:`.norms` (layer and
RMS norm's backward pass), :mod:`.losses` (reduced losses, CTC), :mod:`.sampling` (an embedding's
backward pass, cuDNN's grid sampler), :mod:`.rnn` (the copies around cuDNN's recurrent calls, and their workspace).
:func:`kernel_scratch` asks the one an op belongs to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ...ops import op_info
from .attention import cudnn_attention_backward_scratch, efficient_attention_scratch, flash_backward_scratch
from .convolutions import convolution_bias_scratch, convolution_workspaces
from .losses import ctc_scratch, loss_scratch
from .norms import norm_backward_scratch
from .reductions import reduction_scratch
from .rnn import rnn_scratch
from .sampling import embedding_backward_scratch, grid_sampler_scratch

__all__ = ["convolution_workspaces", "kernel_scratch"]


class Call(NamedTuple):
    """One op call on a GPU of ``sm_count`` SMs and compute ``capability``."""

    name: str
    func: Any
    args: Any
    kwargs: dict[str, Any]
    out: Any
    sm_count: int
    capability: tuple[int, int]


# each kind of kernel (the op registry's :attr:`~...ops.OpInfo.scratch`) and what it allocates
_BY_KIND: dict[str, Callable[[Call], list[int]]] = {
    "reduction": lambda c: reduction_scratch(*c),
    "reduced_loss": lambda c: loss_scratch(*c),
    "convolution_bias": lambda c: convolution_bias_scratch(c.func, c.args, c.kwargs, c.out, c.sm_count, c.capability),
    "flash_backward": lambda c: flash_backward_scratch(c.name, c.func, c.args, c.kwargs, c.sm_count),
    "cudnn_attention_backward": lambda c: cudnn_attention_backward_scratch(c.func, c.args, c.kwargs),
    "efficient_attention": lambda c: efficient_attention_scratch(c.name, c.func, c.args, c.kwargs, c.capability),
    "norm_backward": lambda c: norm_backward_scratch(c.name, c.func, c.args, c.kwargs, c.sm_count, c.capability),
    "embedding_backward": lambda c: embedding_backward_scratch(c.func, c.args, c.kwargs),
    "grid_sampler": lambda c: grid_sampler_scratch(c.func, c.args, c.kwargs),
    "ctc": lambda c: ctc_scratch(c.name, c.func, c.args, c.kwargs),
    "rnn": lambda c: rnn_scratch(c.name, c.func, c.args, c.kwargs),
}


def kernel_scratch(
    name: str, func: Any, args: Any, kwargs: dict[str, Any], out: Any, sm_count: int, capability: tuple[int, int]
) -> list[int]:
    """The allocations (bytes) an op makes inside its call on a GPU of ``sm_count`` SMs and ``capability``:
    those of the kind of kernel the op registry says it runs, none where it names none."""
    info = op_info(func)
    if info is None or info.scratch is None:
        return []
    return _BY_KIND[info.scratch](Call(name, func, args, kwargs, out, sm_count, capability))
