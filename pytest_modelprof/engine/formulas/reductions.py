"""Reductions and softmax: FLOPs per input element."""

from __future__ import annotations

from typing import Any

import torch

from ..ops import REGISTRY
from .builtin import BUILTIN, Formula, OpCost, register, set_formula

SOFTMAX_FLOPS = 5  # max, subtract, exp, sum, divide
SOFTMAX_BACKWARD_FLOPS = 4  # y * (g - sum(g * y))


def reduction(per_element: int) -> Formula:
    def formula(x: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(per_element * x.numel() if isinstance(x, torch.Tensor) else 0)

    return formula


BUILTIN.update({packet: reduction(info.flops_per_element) for packet, info in REGISTRY.items() if info.family == "reduction"})

for _name in ("_softmax", "_log_softmax", "_safe_softmax"):
    set_formula(_name, reduction(SOFTMAX_FLOPS))
for _name in ("_softmax_backward_data", "_log_softmax_backward_data"):
    set_formula(_name, reduction(SOFTMAX_BACKWARD_FLOPS))


@register("_masked_softmax")
def masked_softmax(x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost((SOFTMAX_FLOPS + 1) * x.numel())  # the mask's select, then the softmax


@register("_transform_bias_rescale_qkv")
def transform_bias_rescale_qkv(qkv: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # the packed projection's bias added to q, k and v, and q scaled by 1/sqrt(head size)
    return OpCost(qkv.numel() + qkv.numel() // 3)
