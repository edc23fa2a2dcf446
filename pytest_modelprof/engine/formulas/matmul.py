"""Matrix products: a MAC per multiply-accumulate, plus the bias's and accumulator's adds."""

from __future__ import annotations

from typing import Any

import torch

from ..ops import ELEMENTWISE_FLOPS
from .builtin import OpCost, first_tensor, from_macs, register
from .pointwise import GELU_TANH_FLOPS


@register("mm")
def mm(a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    m, k = a.shape
    return from_macs(m * k * b.shape[1])


@register("addmm", "addmm_")
def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    m, k = a.shape
    n = b.shape[1]
    return from_macs(m * k * n, m * n)


@register("_addmm_activation")
def addmm_activation(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
    # addmm with its activation in the matrix product's epilogue (cuBLASLt): GELU (tanh form) or ReLU per output
    m, k = a.shape
    n = b.shape[1]
    activation = GELU_TANH_FLOPS if kwargs.get("use_gelu", False) else ELEMENTWISE_FLOPS["relu"]
    return from_macs(m * k * n, m * n * (1 + activation))


@register("bmm")
def bmm(a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, m, k = a.shape
    return from_macs(batch * m * k * b.shape[2])


@register("baddbmm", "baddbmm_")
def baddbmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, m, k = a.shape
    n = b.shape[2]
    return from_macs(batch * m * k * n, batch * m * n)


@register("addbmm", "addbmm_")
def addbmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # sum over the batch of a[i] @ b[i], then + bias: batch * m * n adds in all
    batch, m, k = a.shape
    n = b.shape[2]
    return from_macs(batch * m * k * n, batch * m * n)


@register("addr", "addr_")
def addr(bias: torch.Tensor, u: torch.Tensor, v: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # bias + outer(u, v): a product of contraction length 1 (one MAC per element), plus the add
    m, n = u.shape[0], v.shape[0]
    return from_macs(m * n, m * n)


@register("_grouped_mm")
def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: Any = None, bias: Any = None, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # groups of products (mixture-of-experts layers), by the operands' ranks:
    #   2d x 3d: tokens (M_total, K) split by offs over experts (G, K, N) -> (M_total, N): M_total K N
    #   3d x 3d: (G, M, K) x (G, K, N) -> (G, M, N): G M K N
    #   3d x 2d: (G, M, K) x (K, N_total) split by offs -> (M, N_total): M K N_total
    #   2d x 2d: (M, K_total) x (K_total, N), K split by offs -> (G, M, N): M K_total N (weight gradients)
    if a.dim() == 2 and b.dim() == 2:
        macs = a.shape[0] * a.shape[1] * b.shape[1]
    else:
        macs = first_tensor(out_val).numel() * a.shape[-1]
    return from_macs(macs, first_tensor(out_val).numel() if bias is not None else 0)


@register("mv")
def mv(a: torch.Tensor, v: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return from_macs(a.shape[0] * a.shape[1])


@register("addmv", "addmv_")
def addmv(bias: torch.Tensor, a: torch.Tensor, v: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return from_macs(a.shape[0] * a.shape[1], a.shape[0])


@register("dot", "vdot")
def dot(a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return from_macs(a.numel())
