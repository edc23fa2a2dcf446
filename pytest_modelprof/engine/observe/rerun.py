"""The backward pass of a replayed block call (see :mod:`.blocks`), and what a replayed call is made of.

A replayed call is one node of the autograd graph, :class:`Replayed`, whose outputs are empty
fake tensors with the recorded metadata. When the backward pass reaches it, :class:`Backwards`
counts the block's backward pass: it replays a recording of a backward pass like it (the same
recorded call, the same incoming gradients' metadata, the same parameters' ``.grad`` state),
or, the first time, *reruns* the call: its forward pass again on copies of its inputs, with
the meters muted, under the module stack it ran in, with what it read as it was then
(:class:`State`, a config its parent has set again since), and its backward pass counted
and recorded with ``torch.autograd.backward``, so that its parameters' gradients accumulate
where and when the step accumulates them (the copies' own accumulation is hidden from the
meters; their gradients are taken as the block makes them). The engine sums what the node
passes back to an input with what it holds for it; the step does that under the module stack
of the block's first node to pass the input a gradient, so the node is given that stack.
A rerun whose backward recomputes activations (a checkpoint inside the block), reads a
value, or gives gradients a replay could not make again (a gradient passed through, shared
by two inputs, or a view) is not recorded: each such call reruns.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.autograd.graph import get_gradient_edge
from torch.utils._pytree import tree_flatten, tree_unflatten

from .alike import extent, storage_of
from .memo import _NotReplayable, _tensor_signature

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..analytic.modes import Deciders
    from .dispatch import Dispatcher
    from .modules import ModuleTracker, StackKey
    from .stream import Op, Place

MISSING = object()  # an attribute a module does not have


class Meta(NamedTuple):
    """What an output or a gradient is made again from."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    unbounded: bool  # its values may not be finite (see analytic.values): the one made again is marked so too


class Passed(NamedTuple):
    """An output that is one of the call's arguments, handed back as it is: its place among them."""

    argument: int


class Recorded(NamedTuple):
    """One recorded call: what must hold for another to replay it, and what it adds."""

    reads: tuple[tuple[str, str, Any, Any], ...]  # (module's path beneath the block, attribute, value read, its contents)
    recording: tuple[Any, ...]  # each meter's
    path: str  # where it ran, and the module stack it ran under
    key: StackKey
    calls: tuple[tuple[str | None, str], ...]  # each module it called: (its name beneath the block, or None and its path)
    spec: Any  # its output's structure, and each leaf: a Meta for a tensor it made, a Passed argument, else the value
    leaves: tuple[Any, ...]
    differentiable: bool  # whether any output requires grad (its replay then goes through Replayed)


class Backward(NamedTuple):
    """One recorded backward pass of a block: what it adds, the gradients it gives each input, the ``.grad``
    it leaves each parameter that had none, and the module stack the engine sums its inputs' gradients under."""

    recording: tuple[Any, ...]
    path: str
    key: StackKey
    grads: tuple[Meta | None, ...]
    param_grads: tuple[Meta | None, ...]
    delivery: StackKey | None


class Backwards:
    """The backward passes of one run's replayed calls: recorded, replayed, or run again (see the module's notes)."""

    def __init__(self, dispatcher: Dispatcher, tracker: ModuleTracker, deciders: Deciders, fake_mode: FakeTensorMode) -> None:
        self.dispatcher = dispatcher
        self.tracker = tracker
        self.deciders = deciders
        self.fake_mode = fake_mode
        self.recorded: dict[Any, Backward] = {}
        self.rerunning = False  # while a rerun's backward pass runs (its accumulations are the step's)
        self.hidden: set[Any] = set()  # ... and the accumulations into its input copies, which the meters do not see

    def tensor(self, meta: Meta) -> torch.Tensor:
        """An empty fake tensor of the run with ``meta``'s metadata, made beneath every mode (no op is dispatched)."""
        with torch._C._DisableTorchDispatch():
            empty = torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="meta")
        made = self.fake_mode.fake_tensor_converter.from_meta_and_device(self.fake_mode, empty, meta.device)
        if meta.unbounded:
            self.deciders.known.mark_unbounded([made])
        return made

    def backward_of(self, call: Call, grads: tuple[torch.Tensor | None, ...], needs: tuple[bool, ...]) -> list[Any]:
        """The gradients of a replayed call's inputs (None where not needed), its backward pass counted and its
        parameters' gradients accumulated: replayed where one like it was recorded, else run (and recorded)
        on its forward pass run again. Its parameters get their ``.grad`` here, not through the Function."""
        node = torch._C._current_autograd_node()
        try:
            key = (
                id(call.recorded),
                tuple(None if g is None else _tensor_signature(g) for g in grads),
                needs,
                tuple(None if p.grad is None else _tensor_signature(p.grad) for p in call.params),
            )
            hash(key)
        except (_NotReplayable, TypeError, RuntimeError):
            key = None
        hooked = any(hooks_of(p) != (0, 0) for p in call.params)
        recorded = self.recorded.get(key) if key is not None and not hooked else None
        if recorded is None:
            made, recorded = self._rerun(call, grads, needs)
            if recorded is not None and key is not None and not hooked:
                self.recorded[key] = recorded
            return made
        place = placer(recorded.key, recorded.path, call.key, call.path)
        self.dispatcher.replay(recorded.recording, place)
        for p, meta in zip(call.params, recorded.param_grads):  # as AccumulateGrad left them
            if meta is not None:
                p.grad = self.tensor(meta)
        if recorded.delivery is not None and node is not None:
            self.tracker.attribute_node(node, place("backward", recorded.delivery)[1])
        return [None if m is None else self.tensor(m) for m in recorded.grads]

    def _rerun(self, call: Call, grads: tuple[torch.Tensor | None, ...], needs: tuple[bool, ...]) -> tuple[list[Any], Backward | None]:
        """The backward pass of a replayed call, run: its forward pass again with the meters muted (under the
        module stack it ran in), then its backward pass with every op counted and recorded. The parameters'
        gradients accumulate as in the step (``AccumulateGrad`` where and when the engine runs it); the inputs'
        are taken as made, their accumulation into the copies hidden from the meters."""
        tracker, dispatcher = self.tracker, self.dispatcher
        node = torch._C._current_autograd_node()
        frames, stack_key = tracker.frames, tracker.key
        tracker.frames = list(call.frames)
        tracker.key = call.frames[-1][2] if call.frames else ()
        dispatcher.muted = True
        try:
            with torch.enable_grad(), autocast_again(call.autocast), call.state:
                leaves, spec = tree_flatten((call.args, call.kwargs))
                copies = [leaf.detach().requires_grad_(leaf.requires_grad) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
                args, kwargs = tree_unflatten(copies, spec)
                out = call.block(*args, **kwargs)
            inputs = [c for c, leaf in zip(copies, leaves) if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
            edges = [get_gradient_edge(t).node for t in inputs]  # (a view of each, dispatched)
        finally:
            dispatcher.muted = False
            tracker.frames, tracker.key = frames, stack_key
        outputs = [t for t, m in zip(tree_flatten(out)[0], call.recorded.leaves) if isinstance(m, Meta)]  # the Function's
        pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
        made: list[Any] = [None] * len(inputs)
        handles = [t.register_hook(_stash(made, i)) for i, (t, need) in enumerate(zip(inputs, needs)) if need]
        first = _first_consumer([o.grad_fn for o, _ in pairs], edges[0] if edges else None)
        before = [p.grad is None for p in call.params]
        acted = self.deciders.acted()
        recomputed: list[Op] = []
        dispatcher.watch = lambda op: recomputed.append(op) if op.phase == "recompute" else None
        self.hidden = set(edges)
        dispatcher.start_capture()
        self.rerunning = True
        try:
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        finally:
            self.rerunning = False
            dispatcher.watch = None
            self.hidden = set()
            recording = dispatcher.end_capture()[1]
            for handle in handles:
                handle.remove()
            first.remove()
        delivery = tracker.key_of_node(first.node) if first.node is not None else None
        if delivery is not None and node is not None:  # the engine sums what it passes on with what it holds
            tracker.attribute_node(node, delivery)
        tensors = [t for t in made if t is not None]
        storages = {storage_of(g) for g in grads if g is not None}
        # activation checkpointing within the block: where its recomputed ops count depends on the recomputes
        # before it (an early-stopped recompute leaves modules unexited), so each such backward pass runs
        exact = not recomputed and self.deciders.acted() == acted and all(plain(t) for t in tensors)
        for t in tensors:  # a gradient passed on, or shared by two inputs, is not one a replay could make
            exact = exact and storage_of(t) not in storages
            storages.add(storage_of(t))
        param_grads = tuple(
            meta_of(p.grad, False, self.deciders.unbounded(p.grad)) if was_none and p.grad is not None else None
            for p, was_none in zip(call.params, before)
        )
        if not exact or not all(p.grad is None or plain(p.grad) for p in call.params):
            return made, None
        metas = tuple(None if t is None else meta_of(t, False, self.deciders.unbounded(t)) for t in made)
        return made, Backward(recording, call.path, call.key, metas, param_grads, delivery)


class Call(NamedTuple):
    """A replayed call, as its backward pass needs it."""

    backwards: Backwards
    block: nn.Module
    recorded: Recorded
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    frames: list[Any]  # the tracker's frames as the call began (the stack it ran under)
    path: str
    key: StackKey
    autocast: tuple[Any, ...] | None  # the autocast it ran under (see alike.autocast_state)
    inputs: int  # how many of the Function's inputs are the call's tensors (the rest are ``params``)
    params: list[torch.Tensor]  # its block's parameters that require grad
    state: State  # what it read, as it was: its forward pass runs again on it


class Replayed(torch.autograd.Function):
    """A replayed call in the autograd graph: empty outputs, and a backward pass the memo counts."""

    @staticmethod
    def forward(ctx: Any, call: Call, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.call = call
        ctx.set_materialize_grads(False)
        metas = [m for m in call.recorded.leaves if isinstance(m, Meta)]
        made = tuple(call.backwards.tensor(m) for m in metas)
        ctx.mark_non_differentiable(*(t for t, m in zip(made, metas) if not m.requires_grad))
        return made

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        call: Call = ctx.call
        return (
            None,
            *call.backwards.backward_of(call, grads, tuple(ctx.needs_input_grad[1 : 1 + call.inputs])),
            *[None] * len(call.params),
        )


def placer(old_key: StackKey, old_path: str, new_key: StackKey, new_path: str) -> Place:
    """Where a recording made at ``old_path`` (under ``old_key``) goes for a call at ``new_path``: the
    stack of the recorded call becomes the new one's, and the paths beneath it move with it."""
    depth, prefix, cut = len(old_key), old_path + ".", len(old_path)
    placed: dict[StackKey, StackKey] = {}

    def place(phase: Any, key: StackKey) -> tuple[Any, StackKey]:
        moved = placed.get(key)
        if moved is None:
            inner = key[depth:] if key[:depth] == old_key else key
            base = new_key if key[:depth] == old_key else ()
            moved = placed[key] = (*base, *(new_path + p[cut:] if p.startswith(prefix) else p for p in inner))
        return phase, moved

    return place


def autocast_again(state: tuple[Any, ...] | None) -> contextlib.ExitStack:
    """The autocast of :func:`.alike.autocast_state`, entered again (a replayed call's forward pass, run for its backward)."""
    stack = contextlib.ExitStack()
    for kind, enabled, dtype in state[:-1] if state is not None else ():
        if enabled:
            stack.enter_context(torch.autocast(kind, dtype=dtype, cache_enabled=state[-1]))  # type: ignore[index]
    return stack


def meta_of(t: torch.Tensor, requires_grad: bool, unbounded: bool) -> Meta:
    return Meta(tuple(t.shape), t.stride(), t.dtype, t.device, requires_grad, unbounded)


def plain(t: torch.Tensor) -> bool:
    """Whether ``t`` is a fake tensor a replay can make again: strided, on a storage of its own size."""
    return bool(
        type(t) is FakeTensor and t.layout is torch.strided and t.storage_offset() == 0 and t.untyped_storage().nbytes() == extent(t)
    )


def hooks_of(t: torch.Tensor) -> tuple[int, int]:
    """How many hooks a tensor has: on its gradient, and after its gradient accumulates."""
    return len(t._backward_hooks or ()), len(getattr(t, "_post_accumulate_grad_hooks", None) or ())


def _stash(made: list[Any], index: int) -> Any:
    def keep(grad: torch.Tensor) -> None:
        made[index] = grad

    return keep


class _First:
    """The first of some autograd nodes to run (pre-hooks on each, removed by :meth:`remove`)."""

    def __init__(self, nodes: list[Any]) -> None:
        self.node: Any = None
        self._handles = [node.register_prehook(self._ran(node)) for node in nodes]

    def _ran(self, node: Any) -> Any:
        def ran(grad_outputs: Any) -> None:
            if self.node is None:
                self.node = node

        return ran

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _first_consumer(roots: list[Any], accumulation: Any) -> _First:
    """Which of the nodes that pass a gradient to ``accumulation`` (an input's) runs first: the node under whose
    module stack the engine sums that input's gradient with the one the step holds for it (see ``_rerun``)."""
    consumers, seen, stack = [], set(), [r for r in roots if r is not None]
    while accumulation is not None and stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        following = [n for n, _ in node.next_functions if n is not None]
        if accumulation in following:
            consumers.append(node)
        stack.extend(n for n in following if n is not accumulation)
    return _First(consumers)


class State:
    """What a replayed call read, as it was when it ran (shallowly: a module's attribute, what an object,
    list or dict it read held), put back while its forward pass runs again for its backward pass (a parent
    that sets a shared config before each block's call has set it for the last block by then)."""

    def __init__(self, attributes: list[tuple[Any, str, Any]], held: list[tuple[Any, Any]]) -> None:
        self.attributes = attributes  # (module, name, value)
        self.held = held  # (object, a shallow copy of what it held)
        self._undo: list[Any] = []

    @classmethod
    def of(cls, subtree: dict[str, nn.Module], reads: tuple[tuple[str, str, Any, Any], ...]) -> State:
        attributes, held = [], []
        for path, name, value, contents in reads:
            attributes.append((subtree[path], name, value))
            if contents is not None:
                held.append((value, _shallow(value)))
        return cls(attributes, held)

    def __enter__(self) -> None:
        for module, name, value in self.attributes:
            now = module.__dict__.get(name, MISSING)
            if now is not value:
                self._undo.append((module.__dict__, name, now))
                module.__dict__[name] = value
        for value, then in self.held:
            now = _shallow(value)
            if now != then:
                self._undo.append((value, None, now))
                _put_back(value, then)

    def __exit__(self, *exc: object) -> None:
        for target, name, before in reversed(self._undo):
            if name is None:
                _put_back(target, before)
            elif before is MISSING:
                del target[name]
            else:
                target[name] = before
        self._undo = []


def _shallow(value: Any) -> Any:
    if isinstance(value, (list, set)):
        return type(value)(value)
    if isinstance(value, dict):
        return dict(value)
    state = getattr(value, "__dict__", None)
    return dict(state) if type(state) is dict else None


def _put_back(value: Any, held: Any) -> None:
    target = value if isinstance(value, (list, set, dict)) else value.__dict__
    if isinstance(target, list):
        target[:] = held
    else:
        target.clear()
        target.update(held)
