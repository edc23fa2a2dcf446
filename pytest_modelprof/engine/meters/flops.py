"""The FLOP meter: FLOPs and MACs of every op with a formula, by phase and module stack.

Formulas come from :mod:`..formulas` (built in), from :func:`register_flop_formula`
(this process's registry) and from the run's own ``formulas=`` (the pytest plugin passes
those of the ``pytest_modelprof_flop_formulas`` hooks visible to the test): a
:class:`FormulaTable` is fixed for one run, so a registration never changes a run under
way, and a run's own formulas never reach another run. An op with no formula is first
decomposed when it has a decomposition, and otherwise listed as uncounted with its call
count: nothing silently costs zero.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch

from ...results import ModuleOp, ModuleStats, OpStats, Phase, Profile
from ..errors import FormulaError
from ..formulas import BUILTIN, COMMUNICATION_NAMESPACES, DATA_MOVEMENT, NAMED, Formula, OpCost
from ..observe.modules import StackKey
from . import Meter, Op

_REGISTERED: dict[Any, Formula] = {}  # register_flop_formula's, for every run of this process
_ZERO = OpCost(0, 0)


def _packet(op: Any) -> Any:
    return getattr(op, "_overloadpacket", op)


def _check(op: Any, formula: Any, where: str) -> None:
    if not isinstance(op, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        raise TypeError(f"{where} expects an op such as torch.ops.aten.mm, got {op!r}")
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
    _REGISTERED[_packet(op)] = formula
    return formula


def unregister_flop_formula(op: Any) -> None:
    """Remove a formula registered with :func:`register_flop_formula`."""
    _REGISTERED.pop(_packet(op), None)


class FormulaTable:
    """The formulas of one run: the run's own, else the registered ones, else the built-in ones."""

    def __init__(self, formulas: Mapping[Any, Formula] | None = None) -> None:
        own = {}
        for op, formula in (formulas or {}).items():
            _check(op, formula, "formulas=")
            own[_packet(op)] = formula
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
        packet = _packet(op)
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


def cost_of(formula: Formula, op: Op) -> OpCost | None:
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


def _accumulate(rows: dict[Any, list[int]], key: Any, calls: int, flops: int, macs: int, skipped: int) -> None:
    row = rows.get(key)
    if row is None:
        rows[key] = [calls, flops, macs, skipped]
    else:
        row[0] += calls
        row[1] += flops
        row[2] += macs
        row[3] += skipped


# op name -> [calls, flops, macs, skipped], and uncounted op name -> calls: what a memo replays
Recording = tuple[dict[str, list[int]], Counter[str]]


class FlopMeter(Meter):
    """FLOPs and MACs of every op, by phase and module stack; uncounted ops by name."""

    replayable = True

    def __init__(self, formulas: FormulaTable | None = None) -> None:
        self.formulas = formulas or FormulaTable()
        self.tally: dict[tuple[Phase, StackKey, str], list[int]] = {}  # (phase, stack, op) -> [calls, flops, macs, skipped]
        self.uncounted: Counter[str] = Counter()
        self._resolved: dict[Any, tuple[Formula | None, bool]] = {}  # func -> (formula, moves data only)
        self._capture: Recording | None = None

    def _resolve(self, func: Any) -> tuple[Formula | None, bool]:
        formula = self.formulas.formula_for(func)
        moves = _packet(func) in DATA_MOVEMENT or getattr(func, "namespace", None) in COMMUNICATION_NAMESPACES
        entry = (formula, formula is None and moves)
        self._resolved[func] = entry
        return entry

    def wants_decomposition(self, func: Any) -> bool:
        formula, data_movement = self._resolved.get(func) or self._resolve(func)
        return formula is None and not data_movement

    def op(self, op: Op) -> None:
        formula, data_movement = self._resolved.get(op.func) or self._resolve(op.func)
        if formula is None:
            if not data_movement:
                self._uncounted(op.name)
                return
            cost = _ZERO
        else:
            counted = cost_of(formula, op)
            if counted is None:
                self._uncounted(op.name)
                return
            cost = counted
        _accumulate(self.tally, (op.phase, op.key, op.name), 1, cost.flops, cost.macs, cost.skipped)
        if self._capture is not None:
            _accumulate(self._capture[0], op.name, 1, cost.flops, cost.macs, cost.skipped)

    def _uncounted(self, name: str) -> None:
        self.uncounted[name] += 1
        if self._capture is not None:
            self._capture[1][name] += 1

    # leaf-module memo ---------------------------------------------------------------

    def start_capture(self) -> None:
        self._capture = ({}, Counter())

    def end_capture(self) -> Recording | None:
        recording, self._capture = self._capture, None
        return recording

    def replay(self, recording: Recording, phase: Phase, key: StackKey) -> None:
        rows, uncounted = recording
        for name, (calls, flops, macs, skipped) in rows.items():
            _accumulate(self.tally, (phase, key, name), calls, flops, macs, skipped)
        self.uncounted.update(uncounted)

    # the profile -------------------------------------------------------------------

    def contribute(self, profile: Profile, modules: dict[str, ModuleStats]) -> None:
        profile.uncounted = dict(sorted(self.uncounted.items()))
        profile.flops_counted = True
        ops: dict[tuple[str, str], OpStats] = {}
        for (phase, key, name), (calls, flops, macs, skipped) in self.tally.items():
            profile.skipped_flops += skipped
            setattr(profile, f"{phase}_flops", getattr(profile, f"{phase}_flops") + flops)
            setattr(profile, f"{phase}_macs", getattr(profile, f"{phase}_macs") + macs)
            row = ops.setdefault((name, phase), OpStats(name, phase))
            row.calls += calls
            row.flops += flops
            row.macs += macs
            if key:
                row.modules.append(key[-1])
                if phase != "loss":
                    modules[key[-1]].ops.append(ModuleOp(name, phase, calls, flops, macs))
            _attribute(modules, key, phase, flops, macs)
        profile.ops = list(ops.values())


def _attribute(modules: dict[str, ModuleStats], key: StackKey, phase: Phase, flops: int, macs: int) -> None:
    if not key or phase == "loss":
        return
    innermost = modules[key[-1]]
    if phase == "forward":
        innermost.self_forward_flops += flops
    elif phase == "backward":
        innermost.self_backward_flops += flops
    for path in key:
        stats = modules[path]
        if phase == "forward":
            stats.forward_flops += flops
            stats.forward_macs += macs
        elif phase == "backward":
            stats.backward_flops += flops
            stats.backward_macs += macs
        else:
            stats.recompute_flops += flops
