"""Optimizers: foreach kernels and the fused Adam, Adagrad and SGD steps."""

from __future__ import annotations

from typing import Any

import torch

from ..ops import REGISTRY
from .builtin import BUILTIN, Formula, OpCost, register, set_formula


def _tensor_list_numel(values: Any) -> int:
    return sum(t.numel() for t in values if isinstance(t, torch.Tensor))


def _foreach(per_element: int) -> Formula:
    """``_foreach_<op>`` kernels: the elementwise op over every tensor of the first list."""

    def formula(tensors: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(per_element * _tensor_list_numel(tensors))

    return formula


BUILTIN.update({packet: _foreach(info.flops_per_element) for packet, info in REGISTRY.items() if info.family == "foreach"})

# Per parameter element, the same steps as the for-loop and foreach forms count:
# Adam: m lerp (3), v = v * b2 + (1 - b2) g^2 (1 + 3), sqrt (1), bias correction (1),
# + eps (1), p -= lr * m / denom (3): 13; weight decay, decoupled (AdamW: p *= 1 - lr wd)
# or L2 (Adam: g += wd p), 1; amsgrad max (1).
ADAM_FLOPS = 13


def _fused_adam() -> Formula:
    def formula(params: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
        per_element = ADAM_FLOPS + int(bool(kwargs.get("amsgrad")))
        per_element += int(bool(kwargs.get("weight_decay")))
        return OpCost(per_element * _tensor_list_numel(params))

    return formula


for _name in ("_fused_adam_", "_fused_adam", "_fused_adamw_", "_fused_adamw"):
    set_formula(_name, _fused_adam())


@register("_fused_adagrad_", "_fused_adagrad")
def fused_adagrad(params: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
    # sum += g * g (2); std = sqrt(sum) + eps (2); p -= lr * g / std (3); L2 decay g += wd p (1)
    per_element = 7 + int(bool(kwargs.get("weight_decay")))
    return OpCost(per_element * _tensor_list_numel(params))


@register("_fused_sgd_", "_fused_sgd")
def fused_sgd(params: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
    # p -= lr * g (1); momentum: buf = buf * m + g (2); nesterov: g += m * buf (1); L2 decay g += wd p (1)
    per_element = 1 + 2 * int(bool(kwargs.get("momentum"))) + int(bool(kwargs.get("nesterov"))) + int(bool(kwargs.get("weight_decay")))
    return OpCost(per_element * _tensor_list_numel(params))
