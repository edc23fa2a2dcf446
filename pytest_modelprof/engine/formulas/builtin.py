"""The built-in formulas' table, and what every formula module shares: :class:`OpCost` and the decorator that registers."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..ops import beneath_the_run

aten = torch.ops.aten


class OpCost(NamedTuple):
    """The cost of one op call: FLOPs, and the MACs among them (``flops >= 2 * macs``).

    ``skipped``: of those FLOPs, the ones the kernel does not do though the dense count
    includes them (causal attention's masked scores); the profile's ``useful_flops``
    leaves them out."""

    flops: int
    macs: int = 0
    skipped: int = 0


Formula = Callable[..., "OpCost | int | None"]

BUILTIN: dict[Any, Formula] = {}  # overload packet -> its formula
NAMED: dict[str, Formula] = {}  # ops of libraries that are not imported (torchvision), by name -> formula


def aten_op(name: str) -> Any:
    """The ATen op ``name``, or None where this torch release has no such op."""
    return getattr(aten, name, None)


def register(*names: str) -> Callable[[Formula], Formula]:
    """Decorator: the formula of the ATen ops ``names`` (those this torch release has)."""

    def wrap(formula: Formula) -> Formula:
        for name in names:
            set_formula(name, formula)
        return formula

    return wrap


def set_formula(name: str, formula: Formula) -> None:
    """``formula`` for the ATen op ``name``, where this torch release has it."""
    packet = aten_op(name)
    if packet is not None:
        BUILTIN[packet] = formula


def first_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    for item in value:
        if isinstance(item, torch.Tensor):
            return item
    raise TypeError("op produced no tensor")


def from_macs(macs: int, added: int = 0) -> OpCost:
    """The cost of a product of ``macs`` multiply-accumulates (2 FLOPs each), plus ``added`` adds."""
    return OpCost(2 * macs + added, macs)


def ceil_log2(n: int) -> int:
    return max(1, math.ceil(math.log2(n))) if n > 1 else 1


def has_values(t: torch.Tensor) -> bool:
    return t.device.type != "meta" and not isinstance(t, FakeTensor)


def from_values(read: Callable[..., Any]) -> Callable[..., Any]:
    """``read(values, ...)`` on the CPU copy of its first argument's values, beneath the run; None
    where the run has no values (meta and fake tensors)."""

    def reading(t: torch.Tensor, *rest: Any, **options: Any) -> Any:
        if not has_values(t):
            return None
        with beneath_the_run():
            return read(t.detach().cpu(), *rest, **options)

    return reading
