"""Flex attention as one fused kernel (``torch.nn.attention.flex_attention`` on a CUDA target).

The fused kernel walks the ``BlockMask``'s blocks: for each query block it computes the key blocks the
mask lists (partial blocks, where ``mask_mod`` is evaluated per score, and full blocks, where it is not)
and skips the rest. Its work is therefore attention's over the *computed* scores: the two products
(``Q K^T`` and ``P V``, ``d_qk + d_v`` MACs per score), the scaling and online softmax, ``score_mod``'s
elementwise work on every computed score and ``mask_mod``'s on the scores of partial blocks. A block at
the edge of the sequence holds only the rows and columns that exist. Without a mask every block is
computed: the count is dense attention's.

The blocks come from the mask's block counts and indices where the run has their values (a mask made on
real tensors); otherwise they are worked out from ``mask_mod`` itself, evaluated over every (query, key)
position a query-block strip at a time: on the CPU beneath the run, or, where it reads the model's tensors
(a padding mask, a cache's positions), within the run, whose known values answer it. A ``mask_mod`` that
reads values the run does not have leaves the call uncounted, never zero. The
backward kernel recomputes the scores from the saved log-sum-exp and forms ``dV``, ``dP``, ``dQ`` and
``dK`` over the same blocks (:func:`.attention._attention_backward`'s count per score).

On a CPU, flex attention runs its eager dense path, which the run counts op by op (see
``observe/hops.py``); these formulas are the fused kernel's only.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch._higher_order_ops.flex_attention import flex_attention as _FLEX
from torch._higher_order_ops.flex_attention import flex_attention_backward as _FLEX_BACKWARD
from torch.utils._python_dispatch import TorchDispatchMode

from ..ops import VALUES_LIMIT, beneath_the_run
from .attention import _attention_backward, _attention_forward
from .builtin import BUILTIN, OpCost, has_values
from .registry import cost_of

_STRIP = 1 << 24  # (query, key) positions of mask_mod evaluated at once


class _Blocks:
    """The scores the kernel computes: in all, and in partial blocks (where ``mask_mod`` runs)."""

    def __init__(self, computed: int, partial: int) -> None:
        self.computed = computed
        self.partial = partial


def _extents(indices: range, block: int, length: int, device: torch.device | None = None) -> torch.Tensor:
    """How many of each block's ``block`` positions exist in a sequence of ``length`` (the last block may hold fewer)."""
    return torch.tensor([max(0, min(block, length - index * block)) for index in indices], device=device)


def _from_values(block_mask: tuple[Any, ...], s_q: int, s_kv: int) -> _Blocks:
    """The computed scores from the mask's block counts and indices (real tensors)."""
    q_block, kv_block = block_mask[-3], block_mask[-2]
    totals = []
    with beneath_the_run():
        for counts, indices in ((block_mask[2], block_mask[3]), (block_mask[4], block_mask[5])):
            if counts is None:
                totals.append(0)
                continue
            counts, indices = counts.cpu().long(), indices.cpu().long()
            rows = _extents(range(counts.shape[-1]), q_block, s_q)
            columns = _extents(range(indices.shape[-1]), kv_block, s_kv)
            listed = torch.arange(indices.shape[-1]) < counts.unsqueeze(-1)  # the first `count` indices of each row
            areas = rows.unsqueeze(-1) * columns[indices.clamp(0, indices.shape[-1] - 1)]
            totals.append(int((areas * listed).sum()))
    return _Blocks(totals[0] + totals[1], totals[0])


def _from_mask_mod(
    mask_mod: Callable[..., Any],
    heads: tuple[int, int],
    blocks: tuple[int, int],
    lengths: tuple[int, int],
    device: torch.device,
    limit: int,
) -> _Blocks:
    """The computed scores from ``mask_mod`` evaluated over every position on ``device``, at most ``limit``
    positions at once (see the module's notes)."""
    (batch, head), (q_block, kv_block), (s_q, s_kv) = heads, blocks, lengths
    q_blocks, kv_blocks = -(-s_q // q_block), -(-s_kv // kv_block)
    strip = max(1, limit // max(1, batch * head * q_block * kv_blocks * kv_block))  # query blocks per evaluation
    computed = partial = 0
    b = torch.arange(batch, device=device).view(-1, 1, 1, 1)
    h = torch.arange(head, device=device).view(1, -1, 1, 1)
    kv = torch.arange(s_kv, device=device).view(1, 1, 1, -1)
    columns = _extents(range(kv_blocks), kv_block, s_kv, device).view(1, -1)
    for first in range(0, q_blocks, strip):
        last = min(q_blocks, first + strip)
        q = torch.arange(first * q_block, min(last * q_block, s_q), device=device).view(1, 1, -1, 1)
        # the positions that exist only, as torch's create_block_mask evaluates them (a mask_mod may index a
        # tensor of the sequence's length), then padded to whole blocks with positions that are none
        allowed = torch.broadcast_to(mask_mod(b, h, q, kv), (batch, head, q.shape[2], s_kv))
        allowed = torch.nn.functional.pad(allowed, (0, kv_blocks * kv_block - s_kv, 0, (last - first) * q_block - q.shape[2]))
        kept = allowed.reshape(batch, head, last - first, q_block, kv_blocks, kv_block).sum((3, 5))  # scores each block keeps
        area = _extents(range(first, last), q_block, s_q, device).view(-1, 1) * columns
        computed += int((area * (kept > 0)).sum())
        partial += int((area * ((kept > 0) & (kept < area))).sum())
    return _Blocks(computed, partial)


def _evaluated(
    mask_mod: Callable[..., Any], heads: tuple[int, int], blocks: tuple[int, int], lengths: tuple[int, int], like: torch.Tensor
) -> _Blocks | None:
    """The computed scores from ``mask_mod``: on the CPU beneath the run (a mask of indices alone, the common
    case, at any length), else within the run, on ``like``'s device, where the values ``mask_mod`` reads (a padding
    mask, a cache's positions, document ids) are the run's known values; None where neither can tell."""
    try:
        with beneath_the_run():
            return _from_mask_mod(mask_mod, heads, blocks, lengths, torch.device("cpu"), _STRIP)
    except Exception:
        pass
    try:
        with torch.no_grad():  # the run's own modes work the values out; no meter sees these ops
            return _from_mask_mod(mask_mod, heads, blocks, lengths, like.device, VALUES_LIMIT)
    except Exception:  # a mask_mod that reads values the run does not have
        return None


def _blocks(query: torch.Tensor, key: torch.Tensor, block_mask: tuple[Any, ...]) -> _Blocks | None:
    """The scores the kernel computes for every query head (None: the run cannot tell)."""
    counts = block_mask[2]
    s_q, s_kv = query.shape[-2], key.shape[-2]
    mask_batch, mask_heads = counts.shape[0], counts.shape[1]
    if has_values(counts):
        blocks = _from_values(block_mask, s_q, s_kv)
    else:
        sizes = (min(block_mask[-3], s_q), min(block_mask[-2], s_kv))
        evaluated = _evaluated(block_mask[-1], (mask_batch, mask_heads), sizes, (s_q, s_kv), query)
        if evaluated is None:
            return None
        blocks = evaluated
    repeat = (query.shape[0] // mask_batch) * (query.shape[1] // mask_heads)
    return _Blocks(blocks.computed * repeat, blocks.partial * repeat)


def _mod_flops(mod: Callable[..., Any] | None, score: bool, like: torch.Tensor) -> int | None:
    """FLOPs of one evaluation of ``score_mod`` (``score``) or ``mask_mod`` on single values beneath the run: of
    ``like``'s kind (fake tensors of its fake mode, where it is one: a mod may read the run's tensors it closes
    over), else real CPU values (a mod that closes over real tensors); None where neither can be evaluated."""
    if mod is None:
        return 0
    fake_mode = getattr(like, "fake_mode", None)
    kinds = [(fake_mode, like.device)] if fake_mode is not None else []
    for mode, device in (*kinds, (None, torch.device("cpu"))):
        counter = _Counter()
        try:
            with beneath_the_run(), mode if mode is not None else contextlib.nullcontext():
                # one element, not a 0-d tensor: a mod indexes with its arguments (a bias table's [h]), as vmap has it
                index = torch.zeros(1, dtype=torch.int32, device=device)
                operands = (torch.zeros(1, dtype=like.dtype, device=device), index, index, index, index) if score else (index,) * 4
                with counter:
                    mod(*operands)
        except Exception:
            continue
        return counter.flops
    return None


class _Counter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Sums the built-in formulas' FLOPs of the ops run under it."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.flops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = BUILTIN.get(func.overloadpacket)
        cost = cost_of(formula, _Call(func, args, kwargs, out)) if formula is not None else None
        self.flops += cost.flops if cost is not None else 0
        return out


class _Call(NamedTuple):
    """An op call as :func:`.registry.cost_of` reads it."""

    func: Any
    args: Any
    kwargs: dict[str, Any]
    out: Any


def _flex_forward(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod: Any, block_mask: tuple[Any, ...], *_: Any, **__: Any
) -> OpCost | None:
    blocks = _blocks(query, key, block_mask)
    if blocks is None:
        return None
    cost = _attention_forward(blocks.computed, query.shape[-1], value.shape[-1], masked=False)
    per_score, per_masked = _mod_flops(score_mod, True, query), _mod_flops(block_mask[-1], False, query)
    if per_score is None or per_masked is None:
        return None  # a mod whose work the run cannot see: the call is uncounted, not counted short
    return cost._replace(flops=cost.flops + blocks.computed * per_score + blocks.partial * per_masked)


def _flex_backward(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, out: torch.Tensor, *args: Any, **kwargs: Any
) -> OpCost | None:
    block_mask = args[5] if len(args) > 5 else kwargs["block_mask"]
    blocks = _blocks(query, key, block_mask)
    if blocks is None:
        return None
    outputs = math.prod(out.shape)
    return _attention_backward(blocks.computed, outputs, query.shape[-1], value.shape[-1])


BUILTIN[_FLEX] = _flex_forward
BUILTIN[_FLEX_BACKWARD] = _flex_backward
