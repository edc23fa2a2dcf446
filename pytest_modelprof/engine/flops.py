"""The FLOP meter: a dispatch mode that costs every ATen op with a formula.

The registry maps an op (its overload packet, e.g. ``torch.ops.aten.mm``) to a
formula from :mod:`.formulas` or one a user registered. An op with no formula
is first decomposed when it has a decomposition, and otherwise listed as
uncounted with its call count: nothing silently costs zero.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .errors import FormulaError
from .formulas import BUILTIN, DATA_MOVEMENT, METADATA, Formula, OpCost
from .memory import GRADIENTS, TEMPORARIES, MemoryMeter
from .modules import ACCUMULATE_GRAD_SEQUENCE_NR, ROOT, ModuleTracker, StackKey

_current_graph_task_id = torch._C._current_graph_task_id
_current_autograd_node = torch._C._current_autograd_node

_USER_FORMULAS: dict[Any, Formula] = {}

_ZERO = OpCost(0, 0)


def _packet(op: Any) -> Any:
    return getattr(op, "_overloadpacket", op)


def register_flop_formula(op: Any, formula: Formula | None = None) -> Any:
    """Register the FLOP formula of ``op`` (e.g. ``torch.ops.mylib.fused_gelu``).

    The formula is called as ``formula(*args, out_val=output, **kwargs)`` with the
    op's own arguments and its output, and returns the op's FLOPs (an ``int``), an
    :class:`OpCost` ``(flops, macs)``, or ``None`` when the call cannot be counted.
    It must not read tensor values (analytic runs have none). A user formula takes
    precedence over the built-in one. Usable as a decorator::

        @register_flop_formula(torch.ops.mylib.fused_gelu)
        def fused_gelu_flops(x, *, out_val):
            return 5 * x.numel()
    """
    if formula is None:
        return lambda f: register_flop_formula(op, f)
    if not isinstance(op, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        raise TypeError(f"register_flop_formula expects an op such as torch.ops.aten.mm, got {op!r}")
    if not callable(formula):
        raise TypeError(f"the FLOP formula for {op} must be callable, got {formula!r}")
    _USER_FORMULAS[_packet(op)] = formula
    return formula


def unregister_flop_formula(op: Any) -> None:
    """Remove a formula registered with :func:`register_flop_formula`."""
    _USER_FORMULAS.pop(_packet(op), None)


def formula_for(op: Any) -> Formula | None:
    """The formula that would cost ``op``: the user's, else the built-in one."""
    packet = _packet(op)
    formula = _USER_FORMULAS.get(packet) or BUILTIN.get(packet)
    if formula is None and str(packet).endswith("_"):
        # in-place variants (aten.add_) cost what their functional op (aten.add) costs
        functional = getattr(torch.ops.aten, packet.__name__[:-1], None)
        if functional is not None:
            formula = _USER_FORMULAS.get(functional) or BUILTIN.get(functional)
    return formula


def _as_cost(value: Any, op: Any) -> OpCost | None:
    if value is None or isinstance(value, OpCost):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return OpCost(int(value[0]), int(value[1]))
    if isinstance(value, (int, torch.SymInt)):
        return OpCost(int(value), 0)
    raise FormulaError(f"the FLOP formula for {op} returned {value!r}; expected an int, OpCost(flops, macs) or None")


def _accumulate(rows: dict[Any, list[int]], key: Any, *figures: int) -> None:
    """Add ``figures`` (calls, flops, macs[, bytes]) to the row of ``key``, made on first use."""
    row = rows.get(key)
    if row is None:
        rows[key] = list(figures)
    else:
        for i, value in enumerate(figures):
            row[i] += value


# (phase, stack key, op name) -> [calls, flops, macs, bytes allocated]
Tally = dict[tuple[str, StackKey, str], list[int]]


class FlopMeter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts FLOPs and MACs of every op, by phase and module stack; with a
    :class:`MemoryMeter` in ``memory``, feeds it every op's outputs too (one pass).

    ``region`` is set by the runner: ``"forward"`` while the model runs, ``"loss"``
    while the loss is computed, ``"optimizer"`` during the optimizer step. In the backward pass the phase is ``"backward"``
    (``"loss"`` for the loss's own backward), or ``"recompute"`` for forward work
    that activation checkpointing repeats (ops that run with grad mode on).
    """

    def __init__(self, tracker: ModuleTracker) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.tracker = tracker
        self.region = "forward"
        self.tally: Tally = {}
        self.uncounted: Counter[str] = Counter()
        self.memory: MemoryMeter | None = None
        self._resolved: dict[Any, tuple[str, Formula | None, bool]] = {}
        # set by a LeafMemo: the rows of the leaf-module call being recorded, and
        # whether the meter is off the mode stack while a recorded call replays
        self.capture: tuple[dict[str, list[int]], Counter[str]] | None = None
        self.suspended = False

    def suspend(self) -> None:
        """Take the meter off the top of the mode stack (ops then run unseen)."""
        popped = torch._C._pop_torch_dispatch_stack(None)
        assert popped is self
        self.suspended = True

    def resume(self) -> None:
        """Put the meter back on top of the mode stack."""
        torch._C._push_on_torch_dispatch_stack(self)
        self.suspended = False

    def settle(self) -> None:
        """End any memo call left under way by an error, before the meter exits."""
        if self.suspended:
            self.resume()
        self.capture = None

    def add_rows(self, phase: str, key: StackKey, rows: dict[str, list[int]], uncounted: Counter[str]) -> None:
        """Add recorded rows (op name -> [calls, flops, macs]) and uncounted calls under ``phase`` and ``key``."""
        for name, (calls, flops, macs) in rows.items():
            _accumulate(self.tally, (phase, key, name), calls, flops, macs, 0)
        self.uncounted.update(uncounted)

    def _resolve(self, func: Any) -> tuple[str, Formula | None, bool]:
        packet = _packet(func)
        formula = formula_for(packet)
        data_movement = formula is None and packet in DATA_MOVEMENT
        entry = (str(packet), formula, data_movement)
        self._resolved[func] = entry
        return entry

    def _where(self) -> tuple[str, StackKey, Any]:
        """The op's phase, its module stack, and the autograd node it runs for (None outside backward)."""
        if _current_graph_task_id() != -1:  # inside the backward pass
            if torch.is_grad_enabled():
                return "recompute", self.tracker.key or ROOT, None
            node = _current_autograd_node()
            key = self.tracker.key_of_node(node)
            return ("backward", key, node) if key else ("loss", (), node)
        if self.region != "forward":
            return self.region, (), None
        return "forward", self.tracker.key or ROOT, None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in METADATA:
            return func(*args, **kwargs)
        name, formula, data_movement = self._resolved.get(func) or self._resolve(func)
        if formula is None and not data_movement:
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        phase, key, node = self._where()
        allocated = self._measure(out, phase, key, node) if self.memory is not None else 0
        if formula is None:
            if not data_movement:
                self._uncounted(name)
                return out
            cost = _ZERO
        else:
            try:
                value = formula(*args, out_val=out, **kwargs)
            except Exception as error:
                raise FormulaError(f"the FLOP formula for {func} raised {type(error).__name__}: {error}") from error
            counted = value if type(value) is OpCost else _as_cost(value, func)
            if counted is None:
                self._uncounted(name)
                return out
            cost = counted
        _accumulate(self.tally, (phase, key, name), 1, cost.flops, cost.macs, allocated)
        if self.capture is not None:
            _accumulate(self.capture[0], name, 1, cost.flops, cost.macs)
        return out

    def _uncounted(self, name: str) -> None:
        self.uncounted[name] += 1
        if self.capture is not None:
            self.capture[1][name] += 1

    def _measure(self, out: Any, phase: str, key: StackKey, node: Any) -> int:
        """Feed the op's outputs to the memory meter; the bytes it newly allocated."""
        memory = self.memory
        assert memory is not None
        before = memory.allocated
        if node is not None and node._sequence_nr() == ACCUMULATE_GRAD_SEQUENCE_NR:
            memory.track_all(out, GRADIENTS)  # what AccumulateGrad stores in .grad
        else:
            memory.track_all(out, TEMPORARIES)
        memory.sample(phase, key)
        return memory.allocated - before
