"""Attention: scaled dot-product kernels (fused, flash, memory-efficient, cuDNN), multi-head attention and the fused encoder layer."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import flop_counter as _torch_flop_counter

from ..ops import ELEMENTWISE_FLOPS, bound_arguments
from .builtin import BUILTIN, Formula, OpCost, aten_op, from_macs, has_values, register, set_formula
from .reductions import SOFTMAX_BACKWARD_FLOPS, SOFTMAX_FLOPS


def attention_cost(query_shape: Sequence[int], key_shape: Sequence[int], value_shape: Sequence[int], masked: bool) -> OpCost:
    """Forward attention over ``(..., heads, seq, dim)`` tensors, GQA included.

    MACs: scores ``Q K^T`` and output ``P V`` for every query head. FLOPs add, per
    score, the scaling, the softmax and (with a mask) the mask add.
    """
    *batch, heads, s_q, d_qk = query_shape
    scores = math.prod(batch) * heads * s_q * key_shape[-2]
    return _attention_forward(scores, d_qk, value_shape[-1], masked)


def _attention_forward(scores: int, d_qk: int, d_v: int, masked: bool) -> OpCost:
    macs = scores * (d_qk + d_v)
    return OpCost(2 * macs + scores * (1 + SOFTMAX_FLOPS + int(masked)), macs)


def attention_backward_cost(query_shape: Sequence[int], key_shape: Sequence[int], value_shape: Sequence[int]) -> OpCost:
    """Backward of fused attention: recomputed scores, then dV, dP, dQ and dK.

    MACs per score: ``d_qk`` (recompute) + ``d_v`` (dV) + ``d_v`` (dP) + ``2 d_qk``
    (dQ, dK). FLOPs add the softmax recompute from the saved log-sum-exp (2 per
    score), its backward, and the row sums ``D = rowsum(dO * O)`` (2 per output).
    """
    *batch, heads, s_q, d_qk = query_shape
    d_v = value_shape[-1]
    scores = math.prod(batch) * heads * s_q * key_shape[-2]
    return _attention_backward(scores, math.prod(batch) * heads * s_q * d_v, d_qk, d_v)


def _attention_backward(scores: int, outputs: int, d_qk: int, d_v: int) -> OpCost:
    macs = scores * (3 * d_qk + 2 * d_v)
    return OpCost(2 * macs + scores * (2 + SOFTMAX_BACKWARD_FLOPS) + 2 * outputs, macs)


def causal_scores(s_q: int, s_k: int) -> int:
    """Scores a causal mask keeps of an ``s_q x s_k`` matrix: query ``i`` sees keys ``0..i``
    (``torch.ones(s_q, s_k).tril()``, as ``scaled_dot_product_attention(is_causal=True)``)."""
    if s_q <= s_k:
        return s_q * (s_q + 1) // 2
    return s_k * (s_k + 1) // 2 + (s_q - s_k) * s_k


def _is_causal(packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The call's ``is_causal`` argument, found by the op's schema (its position differs per kernel)."""
    return bool(bound_arguments(packet.default, args, kwargs).get("is_causal"))


def _sdpa(packet: Any) -> Formula:
    def formula(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
        masked = kwargs.get("attn_mask") is not None or kwargs.get("attn_bias") is not None
        masked = masked or any(isinstance(a, torch.Tensor) for a in args)
        cost = attention_cost(q.shape, k.shape, v.shape, masked)
        if not _is_causal(packet, (q, k, v, *args), kwargs):
            return cost
        s_q, s_k = q.shape[-2], k.shape[-2]
        per_score = cost.flops // (math.prod(q.shape[:-2]) * s_q * s_k)
        return cost._replace(skipped=per_score * math.prod(q.shape[:-2]) * (s_q * s_k - causal_scores(s_q, s_k)))

    return formula


def _sdpa_backward(packet: Any) -> Formula:
    def formula(
        grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any
    ) -> OpCost:
        cost = attention_backward_cost(q.shape, k.shape, v.shape)
        if not _is_causal(packet, (grad_out, q, k, v, *args), kwargs):
            return cost
        s_q, s_k, d_qk, d_v = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
        rows = math.prod(q.shape[:-2])
        per_score = 2 * (3 * d_qk + 2 * d_v) + 2 + SOFTMAX_BACKWARD_FLOPS
        return cost._replace(skipped=per_score * rows * (s_q * s_k - causal_scores(s_q, s_k)))

    return formula


for _name in (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
):
    if aten_op(_name) is not None:
        set_formula(_name, _sdpa(aten_op(_name)))
        if aten_op(f"{_name}_backward") is not None:
            set_formula(f"{_name}_backward", _sdpa_backward(aten_op(f"{_name}_backward")))


def _kernel_attention(name: str, backward: bool, offsets_at: int) -> None:
    """Register the low-level CUDA attention kernel ``name``.

    These take ``(batch, seq, heads, dim)`` tensors, or packed variable-length
    batches described by cumulative offsets (``args[offsets_at]``). Dense inputs are
    counted from their shapes. Packed batches are counted per sequence by
    torch.utils.flop_counter's own formula, read from its registry (never registered
    into it); it counts the matmuls only, so the scores are recovered from its MACs
    and the softmax work is added as for every other attention kernel. (Its formulas
    for the dense efficient-attention kernels read the layout as (batch, heads, seq,
    dim) and count heads squared instead of sequence squared, so they are not used.)
    """
    packet = aten_op(name)
    if packet is None:
        return
    by_torch = _torch_flop_counter.flop_registry.get(packet)

    def formula(*args: Any, out_val: Any = None, **kwargs: Any) -> OpCost | None:
        q, k, v = args[1:4] if backward else args[:3]
        d_qk, d_v = q.shape[-1], v.shape[-1]
        if args[offsets_at] is None:
            swap = (q.shape[0], q.shape[2], q.shape[1], d_qk), (k.shape[0], k.shape[2], k.shape[1], d_qk)
            v_shape = (v.shape[0], v.shape[2], v.shape[1], d_v)
            if backward:
                return attention_backward_cost(swap[0], swap[1], v_shape)
            return attention_cost(swap[0], swap[1], v_shape, masked=not name.startswith("_flash") and args[3] is not None)
        if by_torch is None or not has_values(args[offsets_at]):
            return None  # sequence lengths unknown (analytic run): listed as uncounted
        macs = int(by_torch(*args, out_val=out_val, **kwargs)) // 2
        if backward:
            return _attention_backward(macs // (3 * d_qk + 2 * d_v), q.numel() // d_qk * d_v, d_qk, d_v)
        return _attention_forward(macs // (d_qk + d_v), d_qk, d_v, masked=False)

    BUILTIN[packet] = formula


_kernel_attention("_flash_attention_forward", backward=False, offsets_at=3)
_kernel_attention("_flash_attention_backward", backward=True, offsets_at=6)
_kernel_attention("_efficient_attention_forward", backward=False, offsets_at=4)
_kernel_attention("_efficient_attention_backward", backward=True, offsets_at=6)


def _total(*costs: OpCost) -> OpCost:
    """The cost of several parts of one op, added."""
    return OpCost(sum(c.flops for c in costs), sum(c.macs for c in costs), sum(c.skipped for c in costs))


def _projections(tokens: int, in_features: int, out_features: int, bias: bool) -> OpCost:
    macs = tokens * in_features * out_features
    return from_macs(macs, tokens * out_features if bias else 0)


def _multi_head_attention(batch: int, s_q: int, s_k: int, embed: int, heads: int, self_attention: bool, masked: bool) -> OpCost:
    """Input projections, attention and output projection of ``nn.MultiheadAttention``."""
    if self_attention:
        in_proj = _projections(batch * s_q, embed, 3 * embed, bias=True)
    else:
        q_proj = _projections(batch * s_q, embed, embed, bias=True)
        kv_proj = _projections(batch * s_k, embed, 2 * embed, bias=True)
        in_proj = _total(q_proj, kv_proj)
    head_dim = embed // heads
    attention = attention_cost((batch, heads, s_q, head_dim), (batch, heads, s_k, head_dim), (batch, heads, s_k, head_dim), masked)
    out_proj = _projections(batch * s_q, embed, embed, bias=True)
    return _total(in_proj, attention, out_proj)


@register("_native_multi_head_attention")
def native_multi_head_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim: int,
    num_head: int,
    *args: Any,
    out_val: Any = None,
    **kwargs: Any,
) -> OpCost | None:
    if query.is_nested:  # each sequence on its own (self-attention of a nested batch)
        lengths = _nested_lengths(query)
        if lengths is None or not (query is key and key is value):
            return None
        return _total(*(_multi_head_attention(1, n, n, embed_dim, num_head, True, False) for n in lengths))
    batch, s_q, _ = query.shape
    mask = kwargs.get("mask", args[4] if len(args) > 4 else None)
    self_attention = query is key and key is value
    return _multi_head_attention(batch, s_q, key.shape[1], embed_dim, num_head, self_attention, mask is not None)


LAYER_NORM_FLOPS = 8  # statistics 4, normalise 2, weight 1, bias 1


def _nested_lengths(t: torch.Tensor) -> list[int] | None:
    """The sequence lengths of a nested tensor's components (what ``nn.TransformerEncoder`` packs a padded
    batch into, in eval with a padding mask); None where they are not known (a fake nested tensor)."""
    try:
        sizes = t._nested_tensor_size()
    except (RuntimeError, NotImplementedError, AttributeError):
        return None
    if isinstance(sizes, FakeTensor) or sizes.device.type == "meta" or sizes.dim() != 2:
        return None
    return [int(row[0]) for row in sizes.tolist()]


@register("_transformer_encoder_layer_fwd")
def transformer_encoder_layer(
    src: torch.Tensor, embed_dim: int, num_heads: int, *args: Any, out_val: Any = None, **kwargs: Any
) -> OpCost | None:
    if src.is_nested:  # each sequence on its own, its padding left out
        lengths = _nested_lengths(src)
        if lengths is None:
            return None
        return _total(*(_encoder_layer(1, n, embed_dim, num_heads, args, kwargs) for n in lengths))
    batch, seq, _ = src.shape
    return _encoder_layer(batch, seq, embed_dim, num_heads, args, kwargs)


def _encoder_layer(batch: int, seq: int, embed_dim: int, num_heads: int, args: Sequence[Any], kwargs: dict[str, Any]) -> OpCost:
    use_gelu = args[4]
    ffn_weight_1 = args[11]
    hidden = ffn_weight_1.shape[0]
    mask = kwargs.get("mask", args[15] if len(args) > 15 else None)
    tokens = batch * seq
    attention = _multi_head_attention(batch, seq, seq, embed_dim, num_heads, True, mask is not None)
    ffn_1 = _projections(tokens, embed_dim, hidden, bias=True)
    ffn_2 = _projections(tokens, hidden, embed_dim, bias=True)
    activation = tokens * hidden * (ELEMENTWISE_FLOPS["gelu"] if use_gelu else ELEMENTWISE_FLOPS["relu"])
    norms_and_residuals = tokens * embed_dim * 2 * (LAYER_NORM_FLOPS + 1)
    return OpCost(
        attention.flops + ffn_1.flops + ffn_2.flops + activation + norms_and_residuals,
        attention.macs + ffn_1.macs + ffn_2.macs,
    )
