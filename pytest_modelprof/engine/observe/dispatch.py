"""One dispatch mode that feeds every meter the same stream of ops, with where each ran.

Where an op ran is worked out once, here, for all meters: its *phase* and the *module
stack* it ran under (:mod:`.modules` tracks both passes).

- ``"forward"``: while the model runs; the stack is the modules running.
- ``"loss"``: the loss, and the backward of the loss itself (nodes made outside the model).
- ``"backward"``: the backward pass; the stack is the one that made the op's autograd node.
- ``"recompute"``: forward work that activation checkpointing repeats in the backward pass
  (ops that run there with grad mode on).
- ``"optimizer"``: the optimizer step and ``zero_grad``.

Ops that only read metadata (sizes, strides, contiguity) are not passed on. An op a meter
wants decomposed (the FLOP meter, for an op it has no formula for) reaches every meter as
the ops of its decomposition, where it has one.

On an analytic run the dispatcher is the top layer of the analytic modes' stacked mode
(:mod:`..analytic.layers`): it joins it as it is entered, right above it, and passes an op on to
the layers beneath in Python.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils._pytree import tree_flatten

from ...results import Phase
from ..analytic.backward import SavedTensors, current_node, in_backward
from ..analytic.layers import Layer, Stacked, called
from ..ops import METADATA, packet_of
from .hops import eager_higher_order, hop_name, is_hop, one_op, run_eagerly
from .modules import ROOT, ModuleTracker, StackKey
from .stream import Meter, Op, Place, overrides


def op_name(func: Any) -> str:
    """The name ops are reported by: the overload packet (``"aten.mm"``)."""
    return str(packet_of(func))


class Dispatcher(Layer):  # type: ignore[no-untyped-call]
    """Passes every op to each meter's :meth:`~.stream.Meter.op`, in the order the meters were given.

    ``region`` is set by the step (:meth:`enter_region`): ``"forward"`` while the model
    runs, ``"loss"`` while the loss is computed, ``"optimizer"`` during the optimizer step.
    """

    def __init__(self, tracker: ModuleTracker, meters: Sequence[Meter], transparent: tuple[type, ...] = (), fake_mode: Any = None) -> None:
        super().__init__()
        self.tracker = tracker
        # tensor subclasses whose ops reach the meters as the ops they run on their inner tensors
        # (a sharded step's DTensors: one rank's work is its shards' ops), and the run's fake mode
        self._transparent = transparent
        self._fake_mode = fake_mode
        self.meters = list(meters)
        self.region: str = "forward"
        self._op_handlers = tuple(m.op for m in self.meters if overrides(m, "op"))
        self._decomposers = [m for m in self.meters if overrides(m, "wants_decomposition")]
        self._names: dict[Any, tuple[str, bool, object]] = {}  # func -> (name, decompose it, kind): see _resolve
        # a leaf-module memo (see memo.py) records what the meters add while capturing, and takes the dispatcher
        # off the mode stack (or out of the stacked mode it tops) while a recorded call replays
        self.capturing = False
        self.captured_ops = 0
        self.suspended = False
        # a block memo (see blocks.py) watches the ops of a call it records, and mutes the meters while
        # it recomputes a replayed block's forward pass to record its backward pass
        self.watch: Callable[[Op], None] | None = None
        self.muted = False
        # told of the autograd node of each op of the backward pass; True: the meters do not see the op
        self.guard: Callable[[Any], bool] | None = None
        self.pack: Any = None  # the run's own saved-tensors pack hook, where it has one
        self._carrier: Stacked | None = None  # the stacked mode it is the top layer of, while it is (see layers.py)
        self._beneath: _Beneath | None = None  # then, the layers beneath it as a mode of their own

    @property
    def replayable(self) -> bool:
        """Whether every meter can record and replay what an op call contributes."""
        return all(m.replayable for m in self.meters)

    @contextlib.contextmanager
    def attached(self, saved: SavedTensors | None = None) -> Iterator[None]:
        """The dispatch mode, the module tracker and saved-tensor hooks, for the run: for the meters
        that want to see saved tensors, and ``saved``'s (a run whose backward pass runs in Python)."""
        savers = [m for m in self.meters if overrides(m, "saved")]
        with contextlib.ExitStack() as stack:
            if savers or saved is not None:
                unpack = saved.unpack if saved is not None else _identity
                self.pack = self._saver(savers, saved)
                stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self.pack, unpack))
                if saved is not None:
                    stack.enter_context(saved.nested())
            stack.enter_context(eager_higher_order())
            stack.enter_context(self.tracker)
            top = _get_current_dispatch_mode()
            if isinstance(top, Stacked):  # an analytic run's modes, right beneath: their top layer (see layers.py)
                stack.enter_context(top.topped(self))
                self._carrier, self._beneath = top, _Beneath(self)
                stack.callback(self._dropped)
            else:
                stack.enter_context(self)
            stack.callback(self._settle)
            yield

    def _saver(self, savers: list[Meter], saved: SavedTensors | None) -> Any:
        tracker = self.tracker
        keep = saved.pack if saved is not None else _identity

        def pack(tensor: torch.Tensor) -> Any:
            key = tracker.key or ROOT
            for meter in savers:
                meter.saved(tensor, key)
            return keep(tensor)

        return pack

    def enter_region(self, name: str) -> None:
        """The step moves on to ``name`` (``"loss"``, ``"optimizer"``, ``"end"``); the meters hear of it."""
        self.region = name
        for meter in self.meters:
            meter.region(name)

    def where(self) -> tuple[Phase, StackKey, Any]:
        """The phase, module stack and autograd node (None outside the backward pass) of the op under way."""
        if in_backward():
            if torch.is_grad_enabled():
                return "recompute", self.tracker.key or ROOT, None
            node = current_node()
            key = self.tracker.key_of_node(node)
            return ("backward", key, node) if key else ("loss", (), node)
        if self.region != "forward":
            return self.region, (), None  # type: ignore[return-value]
        return "forward", self.tracker.key or ROOT, None

    supports_higher_order_operators = True  # see hops.py

    def handle(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        kwargs = kwargs or {}
        name, decompose, kind = self._names.get(func) or self._resolve(func)
        if kind is not _OP:
            return self.below(func, types, args, kwargs) if kind is _METADATA else self._higher_order(func, types, args, kwargs)
        if self._transparent and any(issubclass(t, self._transparent) for t in types):
            return NotImplemented  # the subclass runs its inner ops, which come back here
        if decompose:
            with self.entered():
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = self.below(func, types, args, kwargs)
        if self._transparent and _shape_propagation(out, self._fake_mode):
            return out  # DTensor working out an output's shape: no work of the rank
        return self._ran(func, name, args, kwargs, out)

    def _ran(self, func: Any, name: str, args: Any, kwargs: dict[str, Any], out: Any) -> Any:
        """Hand the op that ran to the meters; its output."""
        if self.muted:
            return out
        if self._beneath is None:
            return self._metered(func, name, args, kwargs, out)
        # the ops a meter runs itself (a formula working out a mask's blocks from the run's known values) go to
        # the layers beneath, as they would with the dispatcher a mode of its own above them
        torch._C._push_on_torch_dispatch_stack(self._beneath)
        try:
            return self._metered(func, name, args, kwargs, out)
        finally:
            torch._C._pop_torch_dispatch_stack(None)

    def _metered(self, func: Any, name: str, args: Any, kwargs: dict[str, Any], out: Any) -> Any:
        phase, key, node = self.where()
        if node is not None and self.guard is not None and self.guard(node):
            return out
        op = Op(func, name, args, kwargs, out, phase, key, node)
        for handle in self._op_handlers:
            handle(op)
        if self.capturing:
            self.captured_ops += 1
            if self.watch is not None:
                self.watch(op)
        return out

    def _higher_order(self, hop: Any, types: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """A higher-order operator: one op where it is a kernel (or the run has a formula for it), else
        its eager kernel with its ops dispatched here (see hops.py)."""
        name, decompose, _ = self._names.get(hop) or self._resolve(hop)
        if one_op(hop, args, kwargs, has_formula=bool(self._decomposers) and not decompose):
            return self._ran(hop, name, args, kwargs, self.below(hop, types, args, kwargs))
        return run_eagerly(self.entered(), hop, args, kwargs)

    def _dropped(self) -> None:
        self._carrier = self._beneath = None
        self.below = called  # (not the run's layers, gone with it)

    def entered(self) -> contextlib.AbstractContextManager[None]:
        """The dispatcher entered again from within its dispatch, for the ops of what it runs there to come
        back to it: its own mode, or the stacked mode it is the top layer of."""
        return (self._carrier or self).reentered()

    def on_top(self) -> bool:
        """Whether the dispatcher is the first to see an op: the top of the mode stack, or the top layer of
        the stacked mode there."""
        top = _get_current_dispatch_mode()
        return top is self or (top is not None and top is self._carrier and self._carrier.layers[0] is self)

    def _resolve(self, func: Any) -> tuple[str, bool, object]:
        """What the dispatcher does with ``func``, worked out once: its name, whether a meter wants it decomposed, and
        its kind (an op; a metadata query, passed on; a higher-order operator)."""
        if func in METADATA:
            entry: tuple[str, bool, object] = ("", False, _METADATA)
        else:
            hop = is_hop(func)
            entry = (
                hop_name(func) if hop else op_name(func),
                any(m.wants_decomposition(func) for m in self._decomposers),
                _HOP if hop else _OP,
            )
        self._names[func] = entry
        return entry

    # leaf-module memo -----------------------------------------------------------

    def start_capture(self) -> None:
        self.capturing = True
        self.captured_ops = 0
        for meter in self.meters:
            meter.start_capture()

    def end_capture(self) -> tuple[int, tuple[Any, ...]]:
        """How many ops the capture saw, and each meter's recording."""
        self.capturing = False
        return self.captured_ops, tuple(meter.end_capture() for meter in self.meters)

    def replay(self, recordings: tuple[Any, ...], place: Place) -> None:
        """Each meter's recording added again, its ops under the phases and stacks ``place`` gives."""
        for meter, recording in zip(self.meters, recordings):
            meter.replay(recording, place)

    def suspend(self) -> None:
        """Take the dispatcher off the top of the mode stack, or out of the stacked mode it tops (ops then run unseen)."""
        if self._carrier is not None:
            self._carrier.lift(self)
        else:
            popped = torch._C._pop_torch_dispatch_stack(None)
            assert popped is self
        self.suspended = True

    def resume(self) -> None:
        """Put the dispatcher back on top of the mode stack, or of the stacked mode."""
        if self._carrier is not None:
            self._carrier.put(self)
        else:
            torch._C._push_on_torch_dispatch_stack(self)
        self.suspended = False

    def _settle(self) -> None:
        """End any memo call left under way by an error, before the mode exits."""
        if self.suspended:
            self.resume()
        if self.capturing:
            self.end_capture()


_OP, _METADATA, _HOP = object(), object(), object()  # the kinds of what reaches the dispatcher


class _Beneath(Layer):  # type: ignore[no-untyped-call]
    """The layers beneath a dispatcher that tops a stacked mode, as a mode: what they would be to it as a mode of its own."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        super().__init__()
        self._dispatcher = dispatcher

    def handle(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return self._dispatcher.below(func, types, args, kwargs)


def _shape_propagation(out: Any, fake_mode: Any) -> bool:
    """Whether an op of a sharded step made only tensors that are not the run's: meta tensors, or fake
    tensors of another fake mode than the run's (``fake_mode``, None for a real run). DTensor works out
    its outputs' shapes on such tensors (see :func:`..distributed.shape_propagation_apart`)."""
    tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.device.type == "meta" or (isinstance(t, FakeTensor) and t.fake_mode is not fake_mode) for t in tensors)


def _identity(tensor: Any) -> Any:
    return tensor
