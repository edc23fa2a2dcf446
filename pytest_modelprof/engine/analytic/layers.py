"""The dispatch modes of an analytic run, run as one mode (see :mod:`.modes` for the stack and its order).

Each mode an op passes through costs it a round trip from C++ into Python: the dispatcher hands the op to
the mode, and the mode's call of the op goes back into C++ to find the next mode. Three modes that only pass
an op on add about 22 us to a fake ``add`` of about 80 us; stacked, the same three add 5 us. So the known
values, the kernels' outputs, CUDA's ops and a router's masks are each a :class:`Layer`, whose work is :meth:`~Layer.handle`: it
passes an op on with :attr:`~Layer.below`, and :class:`Stacked` runs the layers as one mode, each passing
on to the next in Python and the last to the modes beneath (the fake mode). A layer can still run as a mode
of its own (its ``below`` then calls the op).

Stacked, a layer's own work is not seen by the layers beneath it: the ops it makes itself go straight to the
fake mode, where entered one by one they would pass through the modes beneath. Those ops are the empty outputs a
layer shapes (``empty``, ``new_empty``, ``empty_like``, ``empty_strided``), ``resize_`` and ``as_strided_`` (the
known values, the kernels' outputs, CUDA's ops), and the slices and views of a fresh contiguous buffer CUDA's
recurrent backward cuts its weights' gradients from. No layer beneath acts on those: the kernels' outputs and
routing act on views only of tensors they lay out or follow, and routing on no creation op but ``arange``.
A layer that comes to act on another's own ops must keep it so.

The meters' dispatcher (:class:`~..observe.dispatch.Dispatcher`) is a layer too. Entered right above a stacked
mode, with no mode between, it joins it as its top layer (:meth:`Stacked.topped`) for as long as it is
entered, and so sees every op first, as it would as a mode of its own above it, one round trip sooner. The
last layer of an analytic run hands an op to the fake mode the same way, in Python (:func:`into_fake_mode`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._library.simple_registry import find_torch_dispatch_rule
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..ops import DEVICE_QUERY, MARKERS, fake_device

Below = Callable[[Any, Any, Any, Any], Any]  # (func, types, args, kwargs) -> the op's outputs


def called(func: Any, types: Any, args: Any, kwargs: Any) -> Any:
    """The op, run by the modes beneath: what a mode on its own passes an op on to."""
    return func(*args, **(kwargs or {}))


_FAKE = torch._C._TorchDispatchModeKey.FAKE


def fake_mode_beneath() -> FakeTensorMode | None:
    """The fake mode set beneath the dispatch modes (the infra mode an analytic run's ops reach last), or None."""
    return torch._C._get_dispatch_mode(_FAKE)  # type: ignore[no-any-return]


def _no_mode_beneath_but_fake() -> bool:
    """Whether the only mode beneath the one dispatching now is a fake mode, or none: no mode of the caller's (one
    entered before the run) or of another tool's waits to see the op."""
    depth = torch._C._len_torch_dispatch_stack()
    return depth == 0 or (depth == 1 and fake_mode_beneath() is not None)


def into_fake_mode(fake_mode: FakeTensorMode) -> Below:
    """What passes an op on to ``fake_mode`` where it is the next mode (the bottom of an analytic run's stack): its
    dispatch called from Python, without the round trip through C++ (the op's arguments made C++ values and Python
    objects again), with the mode unset while it runs as the dispatcher unsets it, and the outputs in the containers
    the dispatcher would hand back. The rest goes through the dispatcher: an op with a rule of its own for fake modes
    (``torch.library.register_torch_dispatch``, which the dispatcher calls in the mode's place), a higher-order
    operator, and any op while another mode is beneath the stacked one (a mode entered before the run's, another
    infra mode). The fake mode runs under the dispatch keys the layers above it run under: an op autograd
    dispatches from C++ (its detach of a tensor it saves) is not sent through autograd again on its way down,
    which changes none of its outputs."""
    rules: dict[OpOverload, bool] = {}  # op -> whether it has a rule for fake modes (for this run)

    def below(func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if type(func) is not OpOverload or torch._C._len_torch_dispatch_stack() != 1 or torch._C._get_dispatch_mode(_FAKE) is not fake_mode:
            return called(func, types, args, kwargs)
        ruled = rules.get(func)
        if ruled is None:
            ruled = rules[func] = find_torch_dispatch_rule(func, type(fake_mode)) is not None
        if ruled:
            return called(func, types, args, kwargs)
        torch._C._unset_dispatch_mode(_FAKE)
        try:
            out = fake_mode.__torch_dispatch__(func, types, args, kwargs or {})
        finally:
            torch._C._set_dispatch_mode(fake_mode)
        if out is NotImplemented:
            return called(func, types, args, kwargs)
        return _as_from_cpp(func, out) if isinstance(out, (tuple, list)) else out

    return below


def _as_from_cpp(func: OpOverload, out: tuple[Any, ...] | list[Any]) -> tuple[Any, ...] | list[Any]:
    """Several outputs as the dispatcher hands them back to Python: a list for a schema's one list (``split``'s
    ``Tensor[]``), else a tuple (not a meta kernel's named tuple)."""
    one_list = _ONE_LIST.get(func)
    if one_list is None:
        returns = func._schema.returns
        one_list = _ONE_LIST[func] = len(returns) == 1 and isinstance(returns[0].type, torch.ListType)
    if one_list:
        return out if type(out) is list else list(out)
    return out if type(out) is tuple else tuple(out)


_ONE_LIST: dict[OpOverload, bool] = {}  # op -> whether its schema returns one list


class Layer(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """A dispatch mode whose work is :meth:`handle`, which passes an op on with :attr:`below`."""

    supports_higher_order_operators = True  # and passes them on (see observe/hops.py)

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.below: Below = called

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is DEVICE_QUERY and (device := fake_device(args[0])) is not None:
            return device  # (see ops.DEVICE_QUERY)
        if func in MARKERS and _no_mode_beneath_but_fake():  # a range of record_function (see ops.MARKERS): what the
            with torch._C._DisableTorchDispatch():  # engine's layers and a fake mode would end by doing with it
                return func(*args, **(kwargs or {}))
        return self.handle(func, types, args, kwargs)

    def handle(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        raise NotImplementedError

    def started(self) -> None:
        """What the layer sets up as it is entered (as a mode, or in a stack), before any op reaches it."""

    def stopped(self) -> None:
        """What it undoes as it leaves, after the last op."""

    def __enter__(self) -> Layer:
        self.started()
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        self.stopped()

    @contextlib.contextmanager
    def reentered(self) -> Iterator[None]:
        """The mode pushed again from within its own dispatch, for the ops of what it runs there to come back to it
        (a decomposition, a higher-order operator's kernel): not started or stopped again."""
        TorchDispatchMode.__enter__(self)  # type: ignore[no-untyped-call]
        try:
            yield
        finally:
            TorchDispatchMode.__exit__(self, None, None, None)  # type: ignore[no-untyped-call]


class Stacked(Layer):  # type: ignore[no-untyped-call]
    """``layers`` as one dispatch mode, the first on top: what each passes on goes to the next, and the last's
    to the modes beneath; entered, it starts each layer, and stops each as it leaves."""

    def __init__(self, *layers: Layer, bottom: Below = called) -> None:
        super().__init__()
        if not layers:
            raise ValueError("Stacked needs at least one layer")
        self.bottom = bottom  # what the last layer passes an op on to
        self.layers = list(layers)
        self._own = layers  # (started and stopped by the stack; a layer put on top sets itself up)
        self._link()

    def _link(self) -> None:
        for upper, lower in zip(self.layers, self.layers[1:]):
            upper.below = lower.handle
        self.layers[-1].below = self.bottom
        self._top = self.layers[0].handle

    def handle(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return self._top(func, types, args, kwargs)

    @contextlib.contextmanager
    def topped(self, layer: Layer) -> Iterator[None]:
        """``layer`` the top layer while the context lasts (a layer joining a stack already entered, which it
        neither starts nor stops: it sets itself up)."""
        self.put(layer)
        try:
            yield
        finally:
            if layer in self.layers:
                self.lift(layer)

    def put(self, layer: Layer) -> None:
        """``layer`` on top of the others."""
        self.layers.insert(0, layer)
        self._link()

    def lift(self, layer: Layer) -> None:
        """``layer`` out of the stack: the op it would have seen goes to the layer beneath it (one put on top)."""
        if layer in self._own or self.layers[0] is not layer:
            raise ValueError("only a layer put on top of others can be lifted")
        self.layers.remove(layer)
        self._link()

    def started(self) -> None:
        for layer in self._own:
            layer.started()

    def stopped(self) -> None:
        for layer in reversed(self._own):
            layer.stopped()
