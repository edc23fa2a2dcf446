"""The FLOP meter: FLOPs and MACs of every op with a formula, by phase and module stack.

The run's formulas are a :class:`~..formulas.FormulaTable` (built-in, registered, and the
run's own: see :mod:`..formulas.registry`). An op with no formula is first
decomposed when it has a decomposition, and otherwise listed as uncounted with its call
count: nothing silently costs zero.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ...results import ModuleOp, ModuleStats, OpStats, Phase, Profile
from ..formulas import Formula, FormulaTable, OpCost, cost_of
from ..observe.modules import StackKey
from ..ops import op_info
from . import Meter, Op, Place

__all__ = ["FlopMeter", "Recording"]

_ZERO = OpCost(0, 0)


def _accumulate(rows: dict[Any, list[int]], key: Any, calls: int, flops: int, macs: int, skipped: int) -> None:
    row = rows.get(key)
    if row is None:
        rows[key] = [calls, flops, macs, skipped]
    else:
        row[0] += calls
        row[1] += flops
        row[2] += macs
        row[3] += skipped


# (phase, module stack, op name) -> [calls, flops, macs, skipped], and uncounted op name -> calls: what a memo replays
Recording = tuple[dict[tuple[Phase, StackKey, str], list[int]], Counter[str]]


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
        info = op_info(func)
        entry = (formula, formula is None and info is not None and info.moves_data)
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
        where = (op.phase, op.key, op.name)
        _accumulate(self.tally, where, 1, cost.flops, cost.macs, cost.skipped)
        if self._capture is not None:
            _accumulate(self._capture[0], where, 1, cost.flops, cost.macs, cost.skipped)

    def _uncounted(self, name: str) -> None:
        self.uncounted[name] += 1
        if self._capture is not None:
            self._capture[1][name] += 1

    # the memos (observe/memo.py, observe/blocks.py) -----------------------------------

    def start_capture(self) -> None:
        self._capture = ({}, Counter())

    def end_capture(self) -> Recording | None:
        recording, self._capture = self._capture, None
        return recording

    def replay(self, recording: Recording, place: Place) -> None:
        rows, uncounted = recording
        for (phase, key, name), (calls, flops, macs, skipped) in rows.items():
            _accumulate(self.tally, (*place(phase, key), name), calls, flops, macs, skipped)
        self.uncounted.update(uncounted)

    # the profile -------------------------------------------------------------------

    def contribute(self, profile: Profile, modules: dict[str, ModuleStats]) -> None:
        profile.uncounted = dict(sorted(self.uncounted.items()))
        profile.flops_counted = True
        ops: dict[tuple[str, str], OpStats] = {}
        phases: dict[Phase, list[int]] = {}  # phase -> [flops, macs], set on the profile once each
        for (phase, key, name), (calls, flops, macs, skipped) in self.tally.items():
            profile.skipped_flops += skipped
            totals = phases.get(phase)
            if totals is None:
                phases[phase] = [flops, macs]
            else:
                totals[0] += flops
                totals[1] += macs
            row = ops.get((name, phase))
            if row is None:
                row = ops[(name, phase)] = OpStats(name, phase)
            row.calls += calls
            row.flops += flops
            row.macs += macs
            if key:
                row.modules.append(key[-1])
                if phase != "loss":
                    modules[key[-1]].ops.append(ModuleOp(name, phase, calls, flops, macs))
            _attribute(modules, key, phase, flops, macs)
        for phase, (flops, macs) in phases.items():
            setattr(profile, f"{phase}_flops", getattr(profile, f"{phase}_flops") + flops)
            setattr(profile, f"{phase}_macs", getattr(profile, f"{phase}_macs") + macs)
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
