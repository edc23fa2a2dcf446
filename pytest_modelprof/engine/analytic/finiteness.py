"""Finite numbers as an analytic run assumes them: the values it does not know are taken to be finite unless a
non-finite number or value reaches them (see :mod:`.values`), and a test of finiteness on them then has a known answer."""

from __future__ import annotations

import math
from typing import Any

import torch

aten = torch.ops.aten

# tests of finiteness, and what they give on finite numbers: each element's, or (eq/ne of a tensor with itself
# or with a non-finite number) the comparison's
FINITENESS_TESTS = {aten.isinf.default: False, aten.isnan.default: False, aten.isposinf.default: False, aten.isneginf.default: False}
EQUALITY = {aten.eq.Tensor: True, aten.ne.Tensor: False, aten.eq.Scalar: False, aten.ne.Scalar: True}


def on_finite_numbers(func: Any, flat: list[Any]) -> bool | None:
    """What ``func``, a test of finiteness, gives on a tensor of finite numbers (None: it is not one)."""
    if func in FINITENESS_TESTS:
        return FINITENESS_TESTS[func]
    if func in EQUALITY and len(flat) == 2:
        if func in (aten.eq.Tensor, aten.ne.Tensor):
            return EQUALITY[func] if flat[0] is flat[1] else None  # x == x: false only for NaN
        if isinstance(flat[1], (float, complex)) and not is_finite_number(flat[1]):
            return EQUALITY[func]  # x == inf (or nan): never, for a finite number
    return None


def is_finite_number(x: float | complex) -> bool:
    """Whether a Python number is finite."""
    return math.isfinite(x.real) and math.isfinite(x.imag) if isinstance(x, complex) else math.isfinite(x)
