"""Kernel scratch of the attention kernels.

**FlashAttention-2's backward** (:func:`flash_backward_scratch`): its float accumulators.

**cuDNN attention's backward** (:func:`cudnn_attention_backward_scratch`): the part of its
workspace that the cuDNN frontend lays out, its float accumulators.

**Memory-efficient attention** (:func:`efficient_attention_scratch`, the CUTLASS kernels SDPA runs
for fp32, or for half precision with a mask): the backward pass's row sums of ``dO * O`` (for
fp32, computed by ATen ops whose temporaries live to the end of their statement) and the
kernel's float workspace (the query gradient's accumulator tiles, and for head sizes its
registers cannot hold, the keys' and values'); the forward pass's float output accumulator for
half-precision heads over 128.
"""

from __future__ import annotations

from typing import Any

import torch

from ...ops import bound_arguments
from ..gpus import small_shared_memory

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
# the compute capabilities the "sm86" backward kernels below are offered on
SM86_KERNEL_CAPABILITIES = ((8, 6), (8, 9))
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
    small = small_shared_memory(capability)  # too little shared memory for the "large" kernels
    for rows, keys, largest, memory in _BACKWARD_HALF if half else _BACKWARD_FLOAT:
        if (memory == "large" and small) or (memory == "sm86" and (dropout or tuple(capability) not in SM86_KERNEL_CAPABILITIES)):
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
