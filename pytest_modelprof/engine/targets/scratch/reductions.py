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
the launch configuration: TensorIterator's ordering and coalescing of the dimensions
(output-reduced dimensions first, then by stride), then ``setReduceConfig`` for the
GPU's SM count and threads per SM; a reduction too large for 32-bit indexing is split
in halves as ATen splits it, each half's buffer freed before the next.

The bias gradient of a convolution is such a reduction, made inside ``convolution_backward``
(:mod:`.convolutions`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...ops import bound_arguments, op_info, reorder_dimensions
from ..gpus import threads_per_sm

INT32_MAX = 2**31 - 1
# one kernel launch's dimensions, as TensorIterator orders them: sizes, (output, input) byte
# strides per dimension, and how many of the first dimensions are reduced
Part = tuple[list[int], list[tuple[int, int]], int]
WARP = 32
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256


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
    info = op_info(func)
    accumulator = ACCUMULATOR_BYTES[info.accumulator] if info is not None and info.accumulator is not None else None
    if accumulator is None or not args or not isinstance(args[0], torch.Tensor):
        return []
    source: torch.Tensor = args[0]
    bound = bound_arguments(func, args, kwargs)
    if source.numel() <= 1 or source.is_sparse or source.is_nested or bound.get("other") is not None:
        return []  # (max.other, min.other: elementwise)
    reduced = _reduced_dims(bound.get("dim"), source.dim())
    result = next((t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)), None)
    if (name in ("aten.max", "aten.min")) and isinstance(bound.get("dim"), int):
        arg_bytes = _with_index(source.dtype)  # max.dim / min.dim: values and indices
    elif accumulator is _opmath and result is not None and result.is_floating_point():
        arg_bytes = max(_opmath(source.dtype), _opmath(result.dtype))  # sum(dtype=torch.float64) accumulates in double
    else:
        arg_bytes = accumulator(source.dtype)
    out_bytes = result.element_size() if result is not None else source.element_size()
    geometry = _iterator(source, reduced, out_bytes)
    if geometry is None:
        return []
    parts, outputs, split = geometry
    sm_threads = threads_per_sm(capability)
    buffer, semaphores = (max(sizes) for sizes in zip(*(_launch_bytes(*part, source, arg_bytes, sm_count, sm_threads) for part in parts)))
    # gpu_reduce_kernel's AccumulationBuffer, held across the parts: where the output is narrower
    # than the running value (16-bit in and out, indices with values), else the output accumulates
    allocations = [outputs * arg_bytes] if split and arg_bytes > out_bytes else []
    return allocations + [size for size in (buffer, semaphores) if size]


def _reduced_dims(dims: Any, ndim: int) -> set[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return set(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return {d % ndim for d in dims} if ndim else set()


# TensorIterator's view of a reduction ---------------------------------------------------------


def _iterator(
    source: torch.Tensor, reduced: set[int], out_bytes: int
) -> tuple[list[tuple[list[int], list[tuple[int, int]], int]], int, bool] | None:
    """The reduction's dimensions as TensorIterator orders and coalesces them: (shape, (output,
    input) byte strides per dimension, number of reduced dimensions) of each 32-bit-indexable
    part it launches one kernel for (the distinct ones); the number of outputs; whether it was split."""
    shape = list(source.shape)
    itemsize = source.element_size()
    out_shape = [1 if d in reduced else size for d, size in enumerate(shape)]
    out_strides, running = [0] * len(shape), 1
    for d in reversed(range(len(shape))):
        out_strides[d] = running
        running *= out_shape[d]
    # a reduced dimension broadcasts the output (stride 0)
    dims = [
        (shape[d], (0 if d in reduced or shape[d] == 1 else out_strides[d] * out_bytes), source.stride(d) * itemsize)
        for d in range(len(shape))
    ]

    def should_swap(a: int, b: int) -> int:
        (size0, out0, in0), (size1, out1, in1) = dims[a], dims[b]
        if (out0 == 0) != (out1 == 0):
            return 1 if out1 == 0 else -1
        for s0, s1 in ((out0, out1), (in0, in1)):
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if size0 > size1:
                return 1
        return 0

    order = reorder_dimensions(len(dims), should_swap)
    sizes = [dims[d][0] for d in order]
    strides = [(dims[d][1], dims[d][2]) for d in order]
    sizes, strides = _coalesced(sizes, strides)
    if not sizes:
        return None
    reductions = sum(1 for out, _ in strides if out == 0)
    outputs = 1
    for size, (out, _) in zip(sizes, strides):
        outputs *= size if out else 1
    parts = _halves(sizes, strides, reductions)
    return parts, outputs, parts[0][0] != sizes


def _coalesced(sizes: list[int], strides: list[tuple[int, int]]) -> tuple[list[int], list[tuple[int, int]]]:
    if not sizes:
        return sizes, strides
    sizes, strides = list(sizes), list(strides)
    previous = 0
    for dim in range(1, len(sizes)):
        s0, s1 = sizes[previous], sizes[dim]
        if s0 == 1 or s1 == 1 or all(s0 * strides[previous][i] == strides[dim][i] for i in range(2)):
            if s0 == 1:
                strides[previous] = strides[dim]
            sizes[previous] *= s1
        else:
            previous += 1
            sizes[previous], strides[previous] = sizes[dim], strides[dim]
    return sizes[: previous + 1], strides[: previous + 1]


def _halves(sizes: list[int], strides: list[tuple[int, int]], reductions: int) -> list[Part]:
    """``with_32bit_indexing``: the distinct parts of an iterator too large for 32-bit offsets,
    each the half of its widest dimension, until every part fits."""
    parts: list[Part] = []
    pending = [sizes]
    seen: set[tuple[int, ...]] = set()
    while pending:
        part = pending.pop()
        if tuple(part) in seen:
            continue
        seen.add(tuple(part))
        extents = [(size - 1) * abs(stride[i]) for size, stride in zip(part, strides) for i in range(2)]
        numel = 1
        for size in part:
            numel *= size
        if numel <= INT32_MAX and all(
            1 + sum((size - 1) * stride[i] for size, stride in zip(part, strides)) <= INT32_MAX for i in range(2)
        ):
            parts.append((part, strides, reductions))
            continue
        widest, most = -1, -1
        for dim in reversed(range(len(part))):  # ATen's get_dim_to_split: the largest extent, the last dimension on ties
            for i in range(2):
                if extents[2 * dim + i] > most:
                    widest, most = dim, extents[2 * dim + i]
        first = list(part)
        first[widest] = part[widest] // 2
        second = list(part)
        second[widest] = part[widest] - first[widest]
        pending.extend([first, second])
    return parts


# setReduceConfig --------------------------------------------------------------------------------


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(n, 1).bit_length() - 1))


def _launch_bytes(
    sizes: list[int], strides: list[tuple[int, int]], reductions: int, source: torch.Tensor, arg_bytes: int, sm_count: int, sm_threads: int
) -> tuple[int, int]:
    """(staging buffer, semaphores) of one reduction kernel's launch."""
    ndim = len(sizes)
    itemsize = source.element_size()
    outputs = 1
    for size, (out, _) in zip(sizes, strides):
        if out != 0:
            outputs *= size
    numel = 1
    for size in sizes:
        numel *= size
    per_output = numel // max(outputs, 1)
    fastest = reductions == ndim or strides[0][1] < strides[reductions][1]
    if fastest:
        dim0, dim1, moving = per_output, outputs, strides[0][1]
    else:
        dim0, dim1, moving = outputs, per_output, strides[reductions][1]
    vector = 1
    if moving == itemsize and not fastest:
        vector = 4
        offset = source.storage_offset()
        for n in (offset, sizes[reductions], *(stride[1] // itemsize for k, stride in enumerate(strides) if k != reductions)):
            while n % vector:
                vector //= 2
        dim0 //= vector
    elif moving == itemsize and fastest and dim0 > 128 and reductions == 1 and itemsize > 2:
        dim0 //= 4  # vectorised loads along the reduced dimension (4 per thread; not for 16-bit sums)
    most = (256 if source.dtype == torch.complex128 else 512) // vector
    dim0_pow2 = _last_pow2(dim0) if dim0 < most else most
    dim1_pow2 = _last_pow2(dim1) if dim1 < most else most
    width = min(dim0_pow2, WARP)
    height = min(dim1_pow2, most // width)
    width = min(dim0_pow2, most // height)
    threads = width * height
    step_input = step_output = 1
    block_x_reduce = fastest
    if fastest:
        step_input *= width
    else:
        step_output *= width
    values = -(-per_output // step_input)
    split_warps = values >= min(height * 16, MAX_VALUES_PER_THREAD)
    if split_warps:
        step_input *= height
    else:
        step_output *= height
    values = -(-per_output // step_input)
    grid = -(-(outputs // vector) // step_output)
    target = sm_count * (sm_threads // threads)
    if not (split_warps and values >= MAX_VALUES_PER_THREAD and grid <= target):
        return (0, 0)
    ctas = max(min(-(-target // grid), -(-values // MIN_VALUES_PER_THREAD)), -(-values // MAX_VALUES_PER_THREAD))
    if ctas <= 1:
        return (0, 0)
    buffer = arg_bytes * outputs * ctas
    if not block_x_reduce:
        buffer *= width * vector
    return (buffer, 4 * grid)
