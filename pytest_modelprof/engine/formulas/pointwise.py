"""Elementwise kernels: the registry's FLOPs per output element, and GELU's two forms."""

from __future__ import annotations

from typing import Any

from ..ops import ELEMENTWISE_FLOPS, REGISTRY
from .builtin import BUILTIN, Formula, OpCost, first_tensor, set_formula

GELU_TANH_FLOPS = 9
GELU_TANH_BACKWARD_FLOPS = 15


def _elementwise(per_element: int) -> Formula:
    def formula(*_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(per_element * first_tensor(out_val).numel())

    return formula


def _gelu(per_element_erf: int, per_element_tanh: int) -> Formula:
    def formula(*args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
        approximate = kwargs.get("approximate", args[-1] if args and isinstance(args[-1], str) else "none")
        per_element = per_element_tanh if approximate == "tanh" else per_element_erf
        return OpCost(per_element * first_tensor(out_val).numel())

    return formula


BUILTIN.update({packet: _elementwise(info.flops_per_element) for packet, info in REGISTRY.items() if info.family == "elementwise"})
for _name in ("gelu", "gelu_"):
    set_formula(_name, _gelu(ELEMENTWISE_FLOPS["gelu"], GELU_TANH_FLOPS))
set_formula("gelu_backward", _gelu(ELEMENTWISE_FLOPS["gelu_backward"], GELU_TANH_BACKWARD_FLOPS))
