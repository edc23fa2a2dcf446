"""Kernel scratch of CUDA reductions: the staging buffer and semaphores where a reduction's blocks meet.

**Reductions** (``sum``, ``mean``, ``amax``, ``var``, ``argmax``, ``linalg_vector_norm``...,
ATen's ``gpu_reduce_kernel`` in aten/src/ATen/native/cuda/Reduce.cuh). A reduction whose
outputs are few and inputs per output many splits each output's inputs across thread
blocks, which meet in a staging buffer plus one semaphore per block column. The buffer
is sized ``sizeof(accumulator) x outputs x blocks per output``, times the block's width
and output vector when the reduced dimension is not the fastest-moving one: the
gradient of a linear layer's bias (``grad.sum(0)`` of a ``[tokens, features]`` gradient)
takes hundreds of times the bytes it reads. On an H100 the bias-gradient sum of an
8192 x 4096 bf16 gradient stages 132 MiB: the measured peak of an 8-layer bf16 MLP's
training step (pytest_modelprof/data/gpu-truth, torch 2.11) exceeds the tensors alive at that sum by
exactly that and its semaphores. :func:`reduction_scratch` reproduces
the launch configuration (:mod:`..reduce_kernel`: TensorIterator's ordering and coalescing of the
dimensions, output-reduced dimensions first, then by stride; then ``setReduceConfig`` for the GPU's SM
count and threads per SM); a reduction too large for 32-bit indexing is split in halves as ATen splits
it, each half's buffer freed before the next.

The bias gradient of a convolution is such a reduction, made inside ``convolution_backward``
(:mod:`.convolutions`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..gpus import threads_per_sm
from ..reduce_kernel import Launch, blocks_per_output, iterator, launch, reduction_of


def _opmath(dtype: torch.dtype) -> int:
    """Bytes of the type a reduction accumulates ``dtype`` in (``at::opmath_type``)."""
    if dtype in (torch.float16, torch.bfloat16):
        return 4
    if dtype == torch.complex32:
        return 8
    if dtype == torch.bool or not (dtype.is_floating_point or dtype.is_complex):
        return 8  # integers sum in int64
    return dtype.itemsize


def _same(dtype: torch.dtype) -> int:
    return dtype.itemsize


def _welford(dtype: torch.dtype) -> int:
    """``WelfordData<acc, int32>``: mean, m2, a 32-bit count (padded) and a float count."""
    return 4 * (8 if dtype == torch.float64 else 4)


def _with_index(dtype: torch.dtype) -> int:
    return 16  # thrust::pair<value, int64_t>, aligned to 8


def _boolean(dtype: torch.dtype) -> int:
    return 1


# a reduction's accumulator (the op registry's :attr:`~...ops.OpInfo.accumulator`) -> its bytes per
# element for an input of a dtype; the dimensions it reduces are its ``dim`` argument (none given: all of them)
ACCUMULATOR_BYTES: dict[str, Callable[[torch.dtype], int]] = {
    "opmath": _opmath,
    "same": _same,
    "welford": _welford,
    "index": _with_index,
    "boolean": _boolean,
}


def reduction_scratch(
    name: str, func: Any, args: Any, kwargs: dict[str, Any], out: Any, sm_count: int, capability: tuple[int, int]
) -> list[int]:
    """The allocations (bytes, in order) a CUDA reduction op makes while it runs: its staging
    buffer and semaphores where its blocks meet (none where each output's inputs fit one block);
    for one too large for 32-bit indexing that cannot accumulate in its output, an accumulator
    of its outputs first, held across its parts."""
    reduction = reduction_of(func, args, kwargs, out)
    if reduction is None:
        return []
    source, reduced, result, bound, kind = reduction
    accumulator = ACCUMULATOR_BYTES[kind]
    if (name in ("aten.max", "aten.min")) and isinstance(bound.get("dim"), int):
        arg_bytes = _with_index(source.dtype)  # max.dim / min.dim: values and indices
    elif accumulator is _opmath and result is not None and result.is_floating_point():
        arg_bytes = max(_opmath(source.dtype), _opmath(result.dtype))  # sum(dtype=torch.float64) accumulates in double
    else:
        arg_bytes = accumulator(source.dtype)
    out_bytes = result.element_size() if result is not None else source.element_size()
    geometry = iterator(source, reduced, out_bytes)
    if geometry is None:
        return []
    parts, outputs, split = geometry
    sm_threads = threads_per_sm(capability)
    sizes = (_launch_bytes(launch(part, source), arg_bytes, sm_count, sm_threads) for part in parts)
    buffer, semaphores = (max(column) for column in zip(*sizes))
    # gpu_reduce_kernel's AccumulationBuffer, held across the parts: where the output is narrower
    # than the running value (16-bit in and out, indices with values), else the output accumulates
    allocations = [outputs * arg_bytes] if split and arg_bytes > out_bytes else []
    return allocations + [size for size in (buffer, semaphores) if size]


def _launch_bytes(kernel: Launch, arg_bytes: int, sm_count: int, sm_threads: int) -> tuple[int, int]:
    """(staging buffer, semaphores) of one reduction kernel's launch (:mod:`..reduce_kernel`)."""
    blocks = blocks_per_output(kernel, sm_count, sm_threads)
    if blocks <= 1:
        return (0, 0)
    buffer = arg_bytes * kernel.outputs * blocks
    if not kernel.lanes_reduce:
        buffer *= kernel.width * kernel.vector
    return (buffer, 4 * kernel.grid)
