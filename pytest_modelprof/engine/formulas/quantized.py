"""Quantized matrix products: int8 x int8, weight-only int8 and int4, fp8 with scales: a MAC per multiply-accumulate, as ``mm``.

Dequantising is a conversion, costing 0 as a dtype cast does: the scales (and an int4 weight's zero points) are applied
as the weight is loaded or in the product's epilogue. A bias is an add per output element, as ``addmm``'s.
"""

from __future__ import annotations

from typing import Any

import torch

from .builtin import OpCost, first_tensor, from_macs, register


@register("_int_mm")
def int_mm(a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (M, K) int8 @ (K, N) int8 -> (M, N) int32
    m, k = a.shape
    return from_macs(m * k * b.shape[1])


@register("_weight_int8pack_mm", "_weight_int4pack_mm", "_weight_int4pack_mm_for_cpu")
def weight_only_mm(x: torch.Tensor, weight: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (M, K) activations @ the (N, K) weight, transposed; an int4 weight is packed (two to a byte, or CUDA's tiles
    # of int32), so N is read off the (M, N) output
    m, k = x.shape
    return from_macs(m * k * first_tensor(out_val).shape[-1])


@register("_scaled_mm")
def scaled_mm(
    a: torch.Tensor, b: torch.Tensor, scale_a: Any, scale_b: Any, bias: Any = None, *_: Any, out_val: Any = None, **__: Any
) -> OpCost:
    # (M, K) @ (K, N) of fp8 operands, tensor-wise or row-wise scales
    m, k = a.shape
    n = b.shape[1]
    return from_macs(m * k * n, m * n if bias is not None else 0)


@register("_scaled_mm_v2")
def scaled_mm_v2(a: torch.Tensor, b: torch.Tensor, *rest: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
    # torch.nn.functional.scaled_mm: scales by recipe, the reduction along ``contraction_dim`` (K of ``a`` either way
    # round), bias the ninth argument
    out = first_tensor(out_val)
    m, n = out.shape
    bias = rest[6] if len(rest) > 6 else kwargs.get("bias")
    return from_macs(m * n * (a.numel() // m), m * n if bias is not None else 0)
