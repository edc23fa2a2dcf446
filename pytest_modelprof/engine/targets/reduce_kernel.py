"""How ATen's CUDA reductions launch, and the two costs that launch has beside the bytes.

Every reduction on a GPU (``sum``, ``mean``, ``amax``, ``var``, ``argmax``, ``linalg_vector_norm``...)
runs ATen's ``gpu_reduce_kernel`` (aten/src/ATen/native/cuda/Reduce.cuh). TensorIterator orders and
coalesces the input's dimensions, the reduced ones first (:func:`iterator`); ``setReduceConfig`` lays out a
block of threads over them (:func:`launch`) and, on a GPU of a given size, splits each output's inputs
across blocks where the outputs are too few to fill the SMs (:func:`blocks_per_output`). The kernel
scratch of those split reductions (their staging buffer and semaphores) is :mod:`.scratch.reductions`'.
Their time (:func:`launch_seconds`) has two parts that are not the bytes':

- **Staging.** Blocks that split an output's inputs meet in a staging buffer: the last block of each column
  of blocks reads every other block's partial result, its threads stepping through them together (all of
  them where the lanes of a block reduce one output, along the input's fastest dimension; else its rows,
  the lanes holding distinct outputs), and a memset of the semaphores runs before, a kernel of its own.
  Measured on an H100 (data/gpu-truth/h100-layout.json), a sum down the rows of a 174762 x 96 bfloat16
  tensor (the bias gradient of a linear layer over 174762 tokens) splits each output across 1056 blocks
  of 8 rows: 132 steps, 65 us in all, where its 34 MB take 10 us at the memory's peak. The steps are one
  block's, one after another, each the calibration's ``reduction_cycles["staging"]`` SM cycles. The staging
  and the memset follow the work: the cost model adds them to the kernel's fixed time (its bound "launch"
  where they outlast its work).
- **Offsets.** A reduction over dimensions TensorIterator cannot coalesce into one (the batch and the pixels of
  an NCHW tensor, its channels kept) works out each input's offset dimension by dimension, element by
  element, and is bound by that work, not its bytes: bfloat16 and float32 sums of 32 x 3072 x 341 took 65 and
  70 us on that H100. Its elements go through the SMs its blocks occupy (all of them, or as many as it has
  blocks) at ``efficiency["reduction_rate"]`` per SM and cycle.

Both are priced at the boost clock (a power-capped card is taken to hold it for this work, as for the
memory-bound kernels), and each is 0 for a calibration without its constant or a GPU whose clock is not known
(a split launch's memset is a kernel all the same). Fitted on sums, the constants price every reduction alike:
``var`` and ``std`` (whose partial results are Welford's, larger), ``argmax``, ``amax``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from ..ops import bound_arguments, op_info, reorder_dimensions
from .gpus import Calibration, GPUSpec, threads_per_sm

INT32_MAX = 2**31 - 1
WARP = 32
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256
# one kernel launch's dimensions, as TensorIterator orders them: sizes, (output, input) byte
# strides per dimension, and how many of the first dimensions are reduced
Part = tuple[list[int], list[tuple[int, int]], int]


class Launch(NamedTuple):
    """One reduction kernel's blocks, as ``setReduceConfig`` lays them out before it knows the GPU's size."""

    elements: int  # inputs it reduces
    outputs: int
    width: int  # a block's lanes (threadIdx.x) ...
    height: int  # ... and rows (threadIdx.y)
    vector: int  # outputs each lane holds (loads vectorised along the outputs)
    lanes_reduce: bool  # a block's lanes reduce one output together (the reduced dimension is the fastest)
    rows_split: bool  # a block's rows split the inputs, so that blocks may split them too
    values: int  # inputs per thread before blocks split them
    grid: int  # blocks across the outputs
    offsets: bool  # each input's offset worked out dimension by dimension (more than one reduced dimension)

    @property
    def threads(self) -> int:
        return self.width * self.height

    @property
    def stepping(self) -> int:
        """The last block's threads that step together through the other blocks' partial results."""
        return self.threads if self.lanes_reduce else self.height


class Reduction(NamedTuple):
    """What a reduction op reduces: its input, the dimensions, its result (where it has one), its arguments by name
    and its accumulator (the op registry's :attr:`~..ops.OpInfo.accumulator`)."""

    source: torch.Tensor
    reduced: set[int]
    result: torch.Tensor | None
    bound: dict[str, Any]
    accumulator: str


def reduction_of(func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> Reduction | None:
    """The reduction an op runs on a GPU, for an op of ATen's reductions (the op registry's ones with an
    :attr:`~..ops.OpInfo.accumulator`): its input, the dimensions it reduces (its ``dim`` argument; none given,
    all of them), its result. None for another op, and where no reduction kernel runs: over one element, on a
    sparse or nested input, or ``max``/``min`` of two tensors (elementwise)."""
    info = op_info(func)
    if info is None or info.accumulator is None or not args or not isinstance(args[0], torch.Tensor):
        return None
    source: torch.Tensor = args[0]
    bound = bound_arguments(func, args, kwargs)
    if source.numel() <= 1 or source.is_sparse or source.is_nested or bound.get("other") is not None:
        return None
    reduced = _reduced_dims(bound.get("dim"), source.dim())
    result = next((t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)), None)
    return Reduction(source, reduced, result, bound, info.accumulator)


def _reduced_dims(dims: Any, ndim: int) -> set[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return set(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return {d % ndim for d in dims} if ndim else set()


def iterator(source: torch.Tensor, reduced: set[int], out_bytes: int) -> tuple[list[Part], int, bool] | None:
    """The reduction's dimensions as TensorIterator orders and coalesces them: (shape, (output,
    input) byte strides per dimension, number of reduced dimensions) of each 32-bit-indexable
    part it launches one kernel for, in order; the number of outputs; whether it was split."""
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
    """``with_32bit_indexing``: the parts of an iterator too large for 32-bit offsets, each the half of
    its widest dimension, until every part fits; in the order ATen launches them."""
    parts: list[Part] = []
    pending = [sizes]
    while pending:
        part = pending.pop(0)
        extents = [(size - 1) * abs(stride[i]) for size, stride in zip(part, strides) for i in range(2)]
        if math.prod(part) <= INT32_MAX and all(
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
        pending[:0] = [first, second]
    return parts


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(n, 1).bit_length() - 1))


def launch(part: Part, source: torch.Tensor) -> Launch:
    """``setReduceConfig``'s block for one part of a reduction of ``source``, before the GPU's size splits
    each output's inputs across blocks."""
    sizes, strides, reductions = part
    ndim = len(sizes)
    itemsize = source.element_size()
    outputs = math.prod(size for size, (out, _) in zip(sizes, strides) if out != 0)
    elements = math.prod(sizes)
    per_output = elements // max(outputs, 1)
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
    step_input = width if fastest else 1
    step_output = 1 if fastest else width
    rows_split = -(-per_output // step_input) >= min(height * 16, MAX_VALUES_PER_THREAD)
    if rows_split:
        step_input *= height
    else:
        step_output *= height
    values = -(-per_output // step_input)
    grid = -(-(outputs // vector) // step_output)
    offsets = reductions > 1  # (the input calculator has a dimension per reduced one; vectorised loads take one)
    return Launch(elements, outputs, width, height, vector, fastest, rows_split, values, grid, offsets)


def blocks_per_output(launch: Launch, sm_count: int, sm_threads: int) -> int:
    """The blocks across which ``setReduceConfig`` splits each output's inputs on a GPU of ``sm_count`` SMs
    of ``sm_threads`` threads (``ctas_per_output``): 1 where the outputs' blocks fill the GPU or each thread's
    inputs are few."""
    target = sm_count * (sm_threads // launch.threads)
    if not (launch.rows_split and launch.values >= MAX_VALUES_PER_THREAD and launch.grid <= target):
        return 1
    return max(
        min(-(-target // launch.grid), -(-launch.values // MIN_VALUES_PER_THREAD)),
        -(-launch.values // MAX_VALUES_PER_THREAD),
    )


def launches(func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> tuple[Launch, ...]:
    """The reduction kernels an op launches, in order (one per 32-bit-indexable part); none for an op that runs
    none (:func:`reduction_of`)."""
    reduction = reduction_of(func, args, kwargs, out)
    if reduction is None:
        return ()
    source, reduced, result, _, _ = reduction
    geometry = iterator(source, reduced, (result if result is not None else source).element_size())
    return () if geometry is None else tuple(launch(part, source) for part in geometry[0])


def launch_seconds(gpu: GPUSpec, calibration: Calibration, kernels: Sequence[Launch]) -> tuple[float, float]:
    """A reduction's time beside its bytes on ``gpu`` (see the module's notes): the SMs' time over the inputs
    whose offsets they work out dimension by dimension (which bounds the kernel where its bytes do not), and
    the time its split launches add after their work: each one's staging steps and its semaphores' memset."""
    rate = calibration.efficiency.get("reduction_rate")
    step_cycles = calibration.reduction_cycles.get("staging", 0.0)
    sm_threads = threads_per_sm(gpu.compute_capability)
    work = staging = 0.0
    for kernel in kernels:
        blocks = blocks_per_output(kernel, gpu.sm_count, sm_threads)
        if kernel.offsets and rate and gpu.boost_clock:  # on the SMs its blocks occupy
            work += kernel.elements / (rate * min(gpu.sm_count, kernel.grid * blocks) * gpu.boost_clock)
        if blocks > 1:
            staging += calibration.kernel_seconds  # the semaphores' memset
            if step_cycles and gpu.boost_clock:
                staging += -(-blocks // kernel.stepping) * step_cycles / gpu.boost_clock
    return work, staging
