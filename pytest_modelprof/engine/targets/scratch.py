"""Kernel scratch: memory a CUDA kernel takes from the caching allocator inside one op call.

Some of PyTorch's CUDA kernels allocate through the caching allocator while they run and
free before the op returns. No ATen op shows these allocations (they are made below the
dispatcher, and fake tensors run no kernel), yet ``torch.cuda.max_memory_allocated``
counts them: the memory meter adds them to the op's moment (:mod:`..meters.memory`).

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

The bias gradient of a convolution is such a reduction, made inside ``convolution_backward``.

**FlashAttention-2's backward** (:func:`flash_backward_scratch`): its float accumulators.

**cuDNN attention's backward** (:func:`cudnn_attention_backward_scratch`): the part of its
workspace that the cuDNN frontend lays out, its float accumulators.

**Memory-efficient attention** (:func:`efficient_attention_scratch`, the CUTLASS kernels SDPA runs
for fp32, or for half precision with a mask): the backward pass's row sums of ``dO * O`` (for
fp32, computed by ATen ops whose temporaries live to the end of their statement) and the
kernel's float workspace (the query gradient's accumulator tiles, and for head sizes its
registers cannot hold, the keys' and values'); the forward pass's float output accumulator for
half-precision heads over 128.

**Layer and RMS norm's backward pass over many rows** (:func:`norm_backward_scratch`): the
weight's and bias's gradients summed per block of rows first, then over the blocks.

**An embedding's backward pass** (:func:`embedding_backward_scratch`): sorting the indices and
the float partial sums of the rows they pick, one row per index.

**cuDNN's grid sampler** (:func:`grid_sampler_scratch`): contiguous copies of its arguments.

**CTC** (:func:`ctc_scratch`): the backward pass's backward variables, and per-sequence offsets.

**Reduced losses** (:func:`loss_scratch`): the elementwise loss that ``mse_loss``, ``smooth_l1_loss`` and
``soft_margin_loss`` compute before reducing it, and the reduction's own staging.

**Recurrent layers** (:func:`rnn_scratch`): the layout copies and zeros ATen makes around
cuDNN's calls. cuDNN's own RNN workspace is sized by cuDNN at run time and not included.

**cuDNN's convolution workspaces** (:func:`convolution_workspaces`): one per cuDNN operation a
convolution runs (the forward pass; the input's and the weight's gradients, one after the other),
each held alone, as cuDNN sizes it for the target GPU (:mod:`.cudnn`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..analytic.kernel_outputs import REDUCED_LOSSES, reorder_dimensions
from ..formulas import bound_arguments
from . import cudnn

INT32_MAX = 2**31 - 1
# one kernel launch's dimensions, as TensorIterator orders them: sizes, (output, input) byte
# strides per dimension, and how many of the first dimensions are reduced
Part = tuple[list[int], list[tuple[int, int]], int]
WARP = 32
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256

# threads an SM can hold, by compute capability (CUDA C Programming Guide, table of
# technical specifications); 2048 elsewhere
THREADS_PER_SM = {(7, 5): 1024, (8, 6): 1536, (8, 9): 1536, (12, 0): 1536}


def threads_per_sm(capability: tuple[int, int]) -> int:
    return THREADS_PER_SM.get((capability[0], capability[1]), 2048)


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


# a reduction op (overload packet) -> the accumulator's bytes for an input of a dtype; the
# dimensions it reduces are its ``dim`` argument (none given: all of them)
REDUCTIONS: dict[str, Callable[[torch.dtype], int]] = {
    "aten.sum": _opmath,
    "aten.nansum": _opmath,
    "aten.mean": _opmath,
    "aten.prod": _opmath,
    "aten.linalg_vector_norm": _opmath,
    "aten.norm": _opmath,
    "aten.amax": _same,
    "aten.amin": _same,
    "aten.max": _same,
    "aten.min": _same,
    "aten.argmax": _with_index,
    "aten.argmin": _with_index,
    "aten.var": _welford,
    "aten.std": _welford,
    "aten.var_mean": _welford,
    "aten.std_mean": _welford,
    "aten.any": _boolean,
    "aten.all": _boolean,
}


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


# losses that compute the elementwise loss inside their call and then reduce it
LOSSES = frozenset(str(op.overloadpacket) for op in REDUCED_LOSSES)


def loss_scratch(
    name: str, func: Any, args: Any, kwargs: dict[str, Any], out: Any, sm_count: int, capability: tuple[int, int]
) -> list[int]:
    """What a reduced loss allocates inside its call (aten/src/ATen/native/Loss.cpp, cuda/Loss.cu), beside
    its output (which is made for the elementwise loss and resized to the scalar, see
    :mod:`...kernel_outputs`): ``mse_loss`` and ``smooth_l1_loss`` compute the elementwise loss into a
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


CONVOLUTIONS = frozenset({"aten.convolution", "aten.convolution_backward"})


def convolution_workspaces(name: str, func: Any, args: Any, kwargs: dict[str, Any], out: Any, gpu: cudnn.Device) -> list[int] | None:
    """The workspaces (bytes) that cuDNN's operations for a convolution take on ``gpu``, in the order
    they run, each freed before the next (none where cuDNN does not run the op); ``None`` where
    cuDNN runs it but its workspaces cannot be known here (:func:`.cudnn.workspace_bytes`)."""
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


# FlashAttention-2's backward, as ATen calls it (heads before the sequence, as SDPA's op takes
# them: True; the kernel's own layout, sequence first: False)
FLASH_BACKWARD = {"aten._scaled_dot_product_flash_attention_backward": True, "aten._flash_attention_backward": False}


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def flash_backward_scratch(name: str, func: Any, args: Any, kwargs: dict[str, Any], sm_count: int) -> list[int]:
    """What FlashAttention-2's backward allocates beside its gradients (flash_api.cpp's ``mha_bwd``
    and ``mha_varlen_bwd``): the output and its gradient made contiguous where they are not; the
    softmax's row sums (``softmax_d``) and the query gradient's float accumulator (``dq_accum``,
    the query's sequence rounded up to 128 and its head size to 32, or 64 above 128; one per
    split of the SMs in deterministic mode); for grouped-query attention, the keys' and values'
    gradients for every query head before they are summed into their group."""
    bound = bound_arguments(func, args, kwargs)
    tensors: list[Any] = [bound.get(n) for n in ("grad_out", "query", "key", "out")]
    if not all(isinstance(t, torch.Tensor) and not t.is_nested for t in tensors):
        return []
    grad_out, query, key, out = tensors
    cumulative = bound.get("cum_seq_q")
    if FLASH_BACKWARD[name]:  # (batch, heads, sequence, head) -> the kernel's (batch, sequence, heads, head)
        grad_out, query, key, out = (t.transpose(1, 2) for t in (grad_out, query, key, out))
    copies = [t.numel() * t.element_size() for t in (grad_out, out) if not t.is_contiguous()]
    heads, head = query.shape[-2], query.shape[-1]
    head_rounded = _round_up(head, 32 if head <= 128 else 64)
    if isinstance(cumulative, torch.Tensor) and cumulative.dim() == 1 and query.dim() == 3:  # packed sequences
        batch = cumulative.numel() - 1
        rows = query.shape[0] + 128 * batch
        softmax_d, accumulators, keys = heads * rows * 4, rows * heads * head_rounded * 4, key.shape[0]
    else:
        batch, sequence = query.shape[0], query.shape[1]
        rows = batch * _round_up(sequence, 128)
        softmax_d, accumulators, keys = rows * heads * 4, rows * heads * head_rounded * 4, batch * key.shape[1]
    if torch.are_deterministic_algorithms_enabled():
        accumulators *= -(-sm_count // (batch * heads))
    expanded = [keys * heads * head * query.element_size()] * 2 if key.shape[-2] != heads else []
    return [size for size in (*copies, softmax_d, accumulators, *expanded) if size]


# cuDNN attention's backward as ATen calls it: SDPA's op, and the op it runs
CUDNN_ATTENTION_BACKWARD = frozenset({"aten._scaled_dot_product_cudnn_attention_backward", "aten._cudnn_attention_backward"})


def cudnn_attention_backward_scratch(func: Any, args: Any, kwargs: dict[str, Any]) -> list[int]:
    """The workspace cuDNN attention's backward takes, as far as the cuDNN frontend sizes it
    (cudnn/MHA.cpp's ``run_cudnn_SDP_bprop`` allocates ``mha_graph.get_workspace_size()`` through
    the caching allocator: the execution plan's workspace plus the frontend's). The frontend's
    SDPA backward node keeps two float tensors in the workspace (``get_fe_workspace_size_node``):
    the row sums of ``dO * O`` (``softmax_sum``, one per query row and head) and the query
    gradient's accumulator (``dQ_accum``, batch x query heads x query rows x head size), which
    it leaves out only for a gradient of the bias or a deterministic algorithm, neither of which
    PyTorch asks for. What the execution plan itself needs is cuDNN's answer on the device and
    is not included."""
    bound = bound_arguments(func, args, kwargs)
    query = bound.get("query")
    if not isinstance(query, torch.Tensor) or query.dim() != 4:  # packed sequences: laid out otherwise
        return []
    batch, heads, rows, head = query.shape
    sums = batch * heads * rows * 4
    return [sums + sums * head] if sums else []


# memory-efficient attention as ATen calls it: heads before the sequence, as SDPA's ops take them
# (True), or the kernel's own layout, sequence first (False)
EFFICIENT_FORWARD = {"aten._scaled_dot_product_efficient_attention": True, "aten._efficient_attention_forward": False}
EFFICIENT_BACKWARD = {"aten._scaled_dot_product_efficient_attention_backward": True, "aten._efficient_attention_backward": False}
# GPUs whose blocks can opt in to about 100 KiB of shared memory, not 164-228 KiB
_SMALL_SHARED_MEMORY = {(7, 5), (8, 6), (8, 7), (8, 9), (12, 0), (12, 1)}
# the backward kernels ATen tries in turn for sm_80 and later (mem_eff_attention/kernels/cutlassB.h),
# the first that takes the head size wins: query rows per block, keys per block, largest head
# size, and "large" (needs more shared memory than an sm_86/sm_89 block has) or "sm86" (offered
# only on compute capability 8.6 and 8.9, and not with dropout)
_BACKWARD_HALF = [
    (64, 64, 32, ""),
    (64, 64, 64, ""),
    (128, 64, 96, "sm86"),
    (128, 128, 128, "large"),
    (64, 64, 128, ""),
    (128, 64, 65536, "large"),
    (64, 64, 65536, ""),
]
_BACKWARD_FLOAT = [
    (64, 64, 32, ""),
    (64, 64, 64, ""),
    (128, 64, 128, "large"),
    (64, 64, 128, ""),
    (128, 64, 65536, "large"),
    (64, 64, 65536, ""),
]


def _efficient_backward_kernel(half: bool, head: int, capability: tuple[int, int], dropout: bool) -> tuple[int, int, int]:
    """(query rows, keys, largest head size) of the backward kernel ATen launches."""
    small = tuple(capability) in _SMALL_SHARED_MEMORY
    for rows, keys, largest, memory in _BACKWARD_HALF if half else _BACKWARD_FLOAT:
        if (memory == "large" and small) or (memory == "sm86" and (dropout or tuple(capability) not in ((8, 6), (8, 9)))):
            continue
        if largest >= head:
            return rows, keys, largest
    return 64, 64, 65536


def efficient_attention_scratch(name: str, func: Any, args: Any, kwargs: dict[str, Any], capability: tuple[int, int]) -> list[int]:
    """What the memory-efficient attention kernels allocate beside their outputs
    (transformers/cuda/attention.cu and attention_backward.cu, ``_efficient_attention_forward``
    and ``_efficient_attention_backward``; the kernels' ``Params`` in mem_eff_attention/).

    Forward: a half-precision kernel whose head is over 128 (it iterates over the value's
    columns) accumulates its output in a float buffer of the output's shape.

    Backward: the output's gradient copied to the kernel's layout where it is not in it; ``delta``,
    the rows' sums of ``dO * O`` (float, batch x heads x queries): fp32 kernels get it from
    ``(dO * O).sum(-1).transpose(-2, -1).contiguous()``, whose product and sum are freed only at
    the end of that statement, half-precision kernels make it themselves; then the kernel's
    float workspace, per batch and head: the query gradient's accumulator tiles (a 16-byte lock
    and a query-block x key-block tile each) and, where a half kernel cannot hold the keys' and
    values' gradients in registers (heads over its query block), one tile row per key split."""
    layout_swap = EFFICIENT_FORWARD.get(name, EFFICIENT_BACKWARD.get(name))
    forward = name in EFFICIENT_FORWARD
    bound = bound_arguments(func, args, kwargs)
    query, key, value = bound.get("query"), bound.get("key"), bound.get("value")
    grad_out, out = bound.get("grad_out_"), bound.get("out")
    tensors = (query, key, value) if forward else (grad_out, query, key, value, out)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 and not t.is_nested for t in tensors):
        return []
    assert isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor)
    if layout_swap:  # (batch, heads, sequence, head) -> the kernel's (batch, sequence, heads, head)
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))
    if query.numel() == 0 or key.numel() == 0 or value.numel() == 0:
        return []  # (the kernels return before they run)
    half = query.dtype in (torch.float16, torch.bfloat16)
    batch, queries, heads, head = query.shape
    keys_count, value_head = key.shape[1], value.shape[3]
    if isinstance(bound.get("cu_seqlens_q"), torch.Tensor):  # packed sequences: one batch row, offsets per sequence
        batch = bound["cu_seqlens_q"].numel() - 1
        queries, keys_count = int(bound["max_seqlen_q"] or queries), int(bound["max_seqlen_k"] or keys_count)
    if forward:
        return [batch * queries * heads * value_head * 4] if half and max(head, value_head) > 128 else []
    assert isinstance(grad_out, torch.Tensor)
    if layout_swap:
        grad_out = grad_out.transpose(1, 2)
    copy = [grad_out.numel() * grad_out.element_size()] if not grad_out.is_contiguous() else []
    rows, keys, largest = _efficient_backward_kernel(half, max(head, value_head), capability, bool(bound.get("dropout_p")))
    row_sums = batch * heads * queries * 4
    if half:
        computing_delta: list[int] = []
    else:
        # the product and its sum over the head, then the sum laid out heads first (a copy unless
        # one of the two dimensions is 1)
        computing_delta = [batch * queries * heads * value_head * 4, row_sums] + ([row_sums] if heads > 1 and queries > 1 else [])
    needs_kv = half and largest > rows  # the keys' and values' gradients accumulate in the workspace
    splits = -(-keys_count // keys)
    if batch * heads >= 256 and keys_count <= 2 * keys:
        splits = 1
    if needs_kv:
        splits = min(splits, 200 // (batch * heads))
    if isinstance(bound.get("num_splits_key"), int):
        splits = min(splits, bound["num_splits_key"])
    if splits < 1 or torch.are_deterministic_algorithms_enabled():
        splits = 1
    key_tiles = splits * keys * (_round_up(head, rows) + _round_up(value_head, rows)) if needs_kv else 0
    query_tiles = -(-queries // rows) * -(-head // keys) * (4 + rows * keys)
    workspace = batch * heads * _round_up(key_tiles + query_tiles, 4) * 4
    running = [row_sums, workspace]
    held = computing_delta if sum(computing_delta) > sum(running) else running
    return [size for size in (*copy, *held) if size]


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
    width = 1
    for size in bound.get("normalized_shape") or ():
        width *= int(size)
    rows = source.numel() // max(width, 1)
    column_blocks = -(-width // 32)
    if not (rows > 64 * 1024 and width // 32 < sm_count // 2):
        return []
    gradients = [bool(mask[1])] + ([bool(mask[2]) and bound.get("bias") is not None] if name == "aten.native_layer_norm_backward" else [])
    if not any(gradients):
        return []
    block_rows = min(32 * 1024 // column_blocks, -(-rows // 32))
    partial = torch.empty(block_rows, width, dtype=weight.dtype, device="meta")
    result = torch.empty(width, dtype=weight.dtype, device="meta")
    staging = reduction_scratch("aten.sum", torch.ops.aten.sum.dim_IntList, (partial, [0]), {}, result, sm_count, capability)
    buffers = [block_rows * width * weight.element_size()] * sum(gradients)
    return [size for size in (*buffers, width * weight.element_size(), *staging) if size]


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


def reduction_scratch(
    name: str, func: Any, args: Any, kwargs: dict[str, Any], out: Any, sm_count: int, capability: tuple[int, int]
) -> list[int]:
    """The allocations (bytes, in order) a CUDA reduction op makes while it runs: its staging
    buffer and semaphores where its blocks meet (none where each output's inputs fit one block);
    for one too large for 32-bit indexing that cannot accumulate in its output, an accumulator
    of its outputs first, held across its parts."""
    accumulator = REDUCTIONS.get(name)
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


def rnn_scratch(name: str, func: Any, args: Any, kwargs: dict[str, Any]) -> list[int]:
    """What cuDNN's recurrent ops allocate around the cuDNN calls (aten/src/ATen/native/cudnn/RNN.cpp),
    beyond their outputs: the input in sequence-first layout (a batch-first input is transposed
    and copied); in the backward pass, zeros for the gradients it was not given (the final states'),
    that copy again for each of its two calls, and the output's gradient copied to sequence-first
    for the first; the weights' gradient buffer is made only for the second. cuDNN's own
    workspace is not included: its size comes from cuDNN at run time."""
    if name not in ("aten._cudnn_rnn", "aten._cudnn_rnn_backward"):
        return []
    bound = bound_arguments(func, args, kwargs)
    source, batch_first, packed = bound["input"], bound["batch_first"], bool(bound["batch_sizes"])

    def relaid(tensor: torch.Tensor, contiguous: bool = False) -> int:
        """Bytes of the copy ``tensor.transpose(0, 1).contiguous()`` (batch first) or ``.contiguous()``
        makes (``contiguous``: of a contiguous tensor of ``tensor``'s shape)."""
        if batch_first and not packed and tensor.dim() == 3:
            copies = tensor.shape[0] > 1 and tensor.shape[1] > 1 if contiguous else not tensor.transpose(0, 1).is_contiguous()
        else:
            copies = not contiguous and not tensor.is_contiguous()
        return tensor.numel() * tensor.element_size() if copies else 0

    if name == "aten._cudnn_rnn":
        return [size for size in (relaid(source),) if size]
    output, hx, cx, grad_output = bound["output"], bound["hx"], bound["cx"], bound["grad_output"]
    states = ((hx, bound["grad_hy"]), (cx, bound["grad_cy"]))
    zeros = [t.numel() * t.element_size() for t, given in states if t is not None and given is None]
    if grad_output is None:  # zeros_like(output), contiguous in the output's shape
        zeros.append(output.numel() * output.element_size())
    dy = relaid(grad_output) if grad_output is not None else relaid(output, contiguous=True)
    weights = sum(w.numel() * w.element_size() for w in bound["weight"]) if bound["output_mask"][3] else 0
    # backward-data phase: the zeros, the input's and the output gradient's copies; backward-weights
    # phase: the zeros, the input's copy, and the weights' gradient (an output, counted as one)
    held = [size for size in (*zeros, relaid(source)) if size]
    return held + ([dy - weights] if dy > weights else [])


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
