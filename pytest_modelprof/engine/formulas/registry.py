"""The formulas of a run: the built-in ones, those registered in this process, and the run's own.

Formulas come from the built-in table (this package's modules), from :func:`register_flop_formula`
(this process's registry) and from the run's own ``formulas=`` (the pytest plugin passes
those of the ``pytest_modelprof_flop_formulas`` hooks visible to the test): a
:class:`FormulaTable` is fixed for one run, so a registration never changes a run under
way, and a run's own formulas never reach another run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch

from ..errors import FormulaError
from ..ops import packet_of
from .builtin import BUILTIN, NAMED, Formula, OpCost

_REGISTERED: dict[Any, Formula] = {}  # register_flop_formula's, for every run of this process


class Call(Protocol):
    """One op call as a formula sees it (the meters' ``Op``)."""

    @property
    def func(self) -> Any: ...
    @property
    def args(self) -> tuple[Any, ...]: ...
    @property
    def kwargs(self) -> dict[str, Any]: ...
    @property
    def out(self) -> Any: ...


def _check(op: Any, formula: Any, where: str) -> None:
    if not isinstance(op, (torch._ops.OpOverloadPacket, torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
        raise TypeError(f"{where} expects an op such as torch.ops.aten.mm (or a higher-order operator), got {op!r}")
    if not callable(formula):
        raise TypeError(f"the FLOP formula for {op} must be callable, got {formula!r}")


def register_flop_formula(op: Any, formula: Formula | None = None) -> Any:
    """Register the FLOP formula of ``op`` (e.g. ``torch.ops.mylib.fused_gelu``) for every later run.

    The formula is called as ``formula(*args, out_val=output, **kwargs)`` with the
    op's own arguments and its output, and returns the op's FLOPs (an ``int``), an
    :class:`OpCost` ``(flops, macs)``, or ``None`` when the call cannot be counted.
    It must not read tensor values (analytic runs have none). A registered formula takes
    precedence over the built-in one; one given to a run (``profile(formulas={op: f})``)
    over both. Usable as a decorator::

        @register_flop_formula(torch.ops.mylib.fused_gelu)
        def fused_gelu_flops(x, *, out_val):
            return 5 * x.numel()
    """
    if formula is None:
        return lambda f: register_flop_formula(op, f)
    _check(op, formula, "register_flop_formula")
    _REGISTERED[packet_of(op)] = formula
    return formula


def unregister_flop_formula(op: Any) -> None:
    """Remove a formula registered with :func:`register_flop_formula`."""
    _REGISTERED.pop(packet_of(op), None)


class FormulaTable:
    """The formulas of one run: the run's own, else the registered ones, else the built-in ones."""

    def __init__(self, formulas: Mapping[Any, Formula] | None = None) -> None:
        own = {}
        for op, formula in (formulas or {}).items():
            _check(op, formula, "formulas=")
            own[packet_of(op)] = formula
        self._user = {**_REGISTERED, **own}
        self._found: dict[Any, Formula | None] = {}  # op -> its formula: the table is fixed once made

    def formula_for(self, op: Any) -> Formula | None:
        """The formula that costs ``op``."""
        if op in self._found:
            return self._found[op]
        formula = self._find(op)
        self._found[op] = formula
        return formula

    def _find(self, op: Any) -> Formula | None:
        packet = packet_of(op)
        formula = self._user.get(packet) or BUILTIN.get(packet) or NAMED.get(str(packet))
        if formula is None and str(packet).endswith("_"):
            # in-place variants (aten.add_) cost what their functional op (aten.add) costs
            functional = getattr(torch.ops.aten, packet.__name__[:-1], None)
            if functional is not None:
                formula = self._user.get(functional) or BUILTIN.get(functional)
        return formula


def formula_for(op: Any) -> Formula | None:
    """The formula a run without formulas of its own would cost ``op`` with."""
    return FormulaTable().formula_for(op)


def cost_of(formula: Formula, op: Call) -> OpCost | None:
    """``formula``'s cost of one op call (None: this call cannot be counted); a formula that
    raises or returns something else is a :class:`FormulaError` naming the op."""
    try:
        value = formula(*op.args, out_val=op.out, **op.kwargs)
    except Exception as error:
        raise FormulaError(f"the FLOP formula for {op.func} raised {type(error).__name__}: {error}") from error
    return value if type(value) is OpCost else _as_cost(value, op.func)


def _as_cost(value: Any, op: Any) -> OpCost | None:
    if value is None or isinstance(value, OpCost):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return OpCost(int(value[0]), int(value[1]))
    if isinstance(value, (int, torch.SymInt)):
        return OpCost(int(value), 0)
    raise FormulaError(f"the FLOP formula for {op} returned {value!r}; expected an int, OpCost(flops, macs) or None")
