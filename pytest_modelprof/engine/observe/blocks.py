"""Replays the repeated blocks of an analytic FLOP count instead of running them.

A deep model is a few kinds of block repeated: the 32 decoder layers of a Llama, the
bottlenecks of a ResNet stage. On fake tensors each block's ops run only to be counted,
and two calls that are sure to run the same ops count the same: so the first call of a
block is run and its counts recorded, and a later call of a block *like it* adds the
recording again under its own module paths, without running. Its outputs are made
empty with the recorded metadata, through an ``autograd.Function`` (:class:`_Replayed`)
whose backward does the same for the block's backward pass: the first replayed block
that reaches it runs its forward again with the meters muted and its backward counted
and recorded (as activation checkpointing would); later ones replay that recording.
The figures are those of running every block, bit for bit; what is saved is the time.

Two calls are alike when everything their ops can depend on is the same:

- the block's *signature*: its type, the type of every module beneath it and the
  metadata of their parameters and buffers (type, dtype, device, shape, strides,
  requires_grad), the metadata of each tensor among the call's arguments and the value of
  each other argument (the arguments must be tensors, numbers, strings and None, in
  tuples, lists and dicts), and the grad, inference and autocast modes;
- the value of every attribute of those modules that the recorded call *read*: its
  modules' classes are swapped for subclasses that log the reads of their attributes
  while it runs (a layer's index, read only for a cache the call did not get, does not
  tell the layers apart; a sliding window it reads does).

A call is recorded only where replaying it is sure to be exact; otherwise it runs, and
later calls of its signature too. It must read and decide no value (the known values
and the router masks of :class:`~..analytic.modes.Deciders`), change no tensor it did not
make, set no attribute, return tensors of its own (no view of an input, none the run knows
a value of) and build a graph that reaches no tensor but its arguments and parameters. Its
module and the modules beneath it must have no hooks and no ``forward`` of their own, and
the call must run under no functorch transform, tracing, global hook but the tracker's, or
other memo. Only analytic runs whose meters all record and replay (a FLOP count: not memory,
whose figures need every op's tensors; not a predicted time, whose clock follows the ops in
order) use the memo, on the modules that repeat another's type and structure and share no
parameter with a module outside them (:func:`.alike.repeated_blocks`); it lives for one run.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.modules import module as _module_globals
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..analytic.backward import in_backward
from .alike import EQUAL, Reads, Writes, autocast_state, closed_graph, extent, leaf_signature, repeated_blocks, same_value, storage_of
from .memo import _NotReplayable, _tensor_signature

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..analytic.modes import Deciders
    from .dispatch import Dispatcher
    from .modules import ModuleTracker, StackKey
    from .stream import Op, Place

_MISSING = object()
_TRIES = 2  # recordings of one signature whose reads differ, after which its calls just run


class _Meta(NamedTuple):
    """What an output or a gradient is made again from."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool


class _Block(NamedTuple):
    """One recorded call: what must hold for another to replay it, and what it adds."""

    reads: tuple[tuple[str, str, Any], ...]  # (module's path beneath the block, attribute, value read)
    recording: tuple[Any, ...]  # each meter's
    path: str  # where it ran, and the module stack it ran under
    key: StackKey
    calls: tuple[tuple[str | None, str], ...]  # each module it called: (its name beneath the block, or None and its path)
    spec: Any  # its output's structure, and each leaf: a _Meta for a tensor, else the value
    leaves: tuple[Any, ...]
    differentiable: bool  # whether any output requires grad (its replay then goes through _Replayed)


class _Backward(NamedTuple):
    """One recorded backward pass of a block: what it adds, and the gradients it gives each input."""

    recording: tuple[Any, ...]
    path: str
    key: StackKey
    grads: tuple[_Meta | None, ...]


class BlockMemo:
    """Records and replays what the meters make of repeated blocks, for one analytic run (see the module's notes)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        tracker: ModuleTracker,
        deciders: Deciders,
        fake_mode: FakeTensorMode,
        model: nn.Module,
        hooks: int,
    ) -> None:
        """``hooks``: how many global forward pre-hooks (and as many forward hooks) are the tracker's own."""
        self.dispatcher = dispatcher
        self.tracker = tracker
        self.deciders = deciders
        self.fake_mode = fake_mode
        self.blocks = repeated_blocks(model)
        self._hooks = hooks
        self._ours: set[int] = set()
        self._subtrees: dict[int, tuple[tuple[str, nn.Module], ...]] = {}
        self.recorded: dict[Any, list[_Block]] = {}
        self.refused: set[Any] = set()
        self.backward: dict[Any, _Backward] = {}
        self.replays = 0
        self._recording = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Every call of a repeated block goes through the memo while this is entered."""
        for block in self.blocks:
            if block.__dict__.get("_compiled_call_impl") is None:  # not a module the caller compiled
                block.__dict__["_compiled_call_impl"] = functools.partial(self._call, block)
                self._ours.add(id(block))
        try:
            yield
        finally:
            for block in self.blocks:
                if id(block) in self._ours:
                    del block.__dict__["_compiled_call_impl"]
            self._ours.clear()

    def _subtree(self, block: nn.Module) -> tuple[tuple[str, nn.Module], ...]:
        subtree = self._subtrees.get(id(block))
        if subtree is None:
            subtree = self._subtrees[id(block)] = tuple(block.named_modules(remove_duplicate=False))
        return subtree

    # a call ------------------------------------------------------------------------

    def _call(self, block: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if self._recording or self.dispatcher.capturing or self.dispatcher.region != "forward" or in_backward():
            return _run(block, args, kwargs)
        signature = self._signature(block, args, kwargs)
        if signature is None or signature in self.refused or self.tracker.frame_for(block) is None:
            return _run(block, args, kwargs)
        subtree = dict(self._subtree(block))
        tried = self.recorded.get(signature, ())
        for recorded in tried:
            if all(same_value(subtree[path].__dict__.get(name, _MISSING), value) for path, name, value in recorded.reads):
                return self._replay(block, recorded, args, kwargs)
        if len(tried) >= _TRIES:
            self.refused.add(signature)
            return _run(block, args, kwargs)
        return self._record(block, signature, args, kwargs)

    def _signature(self, block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """What a call's ops depend on beyond the attributes it reads (see the module's notes); None where it
        cannot be replayed."""
        if (
            len(_module_globals._global_forward_pre_hooks) != self._hooks
            or len(_module_globals._global_forward_hooks) != self._hooks
            or _module_globals._global_backward_hooks
            or _module_globals._global_backward_pre_hooks
            or torch._C._functorch.peek_interpreter_stack() is not None
            or torch._C._get_tracing_state() is not None
        ):
            return None
        leaves, spec = tree_flatten((args, kwargs))
        try:
            inputs = tuple(leaf_signature(leaf) for leaf in leaves)
            state = []
            for _, module in self._subtree(block):
                if (
                    module._forward_hooks
                    or module._forward_pre_hooks
                    or module._backward_hooks
                    or module._backward_pre_hooks
                    or "forward" in module.__dict__
                    or (module.__dict__.get("_compiled_call_impl") is not None and id(module) not in self._ours)
                ):
                    return None
                state.append(
                    (
                        type(module),
                        tuple(None if p is None else _tensor_signature(p) for p in module._parameters.values()),
                        tuple(None if b is None else _tensor_signature(b) for b in module._buffers.values()),
                    )
                )
            modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), autocast_state())
            signature = (type(block), spec, inputs, tuple(state), modes)
            hash(signature)
        except (_NotReplayable, TypeError, RuntimeError):
            return None
        return signature

    # recording ----------------------------------------------------------------------

    def _record(self, block: nn.Module, signature: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the call with every op watched and every attribute read logged; keep its recording where a
        replay of it is exact (else its signature's calls just run from now on)."""
        tracker, dispatcher = self.tracker, self.dispatcher
        path, key = tracker.frame_for(block)  # type: ignore[misc]
        subtree = self._subtree(block)
        inputs = [leaf for leaf in tree_flatten((args, kwargs))[0] if isinstance(leaf, torch.Tensor)]
        params = _unique(p for _, m in subtree for p in m._parameters.values() if p is not None)
        buffers = _unique(b for _, m in subtree for b in m._buffers.values() if b is not None)
        given = {storage_of(t) for t in (*inputs, *params, *buffers)}
        watch = Writes(given)
        reads = Reads(subtree)
        calls_before = Counter(tracker.calls)
        acted = self.deciders.acted()
        first_node = torch.autograd._get_sequence_nr()  # type: ignore[attr-defined]
        self._recording = True
        dispatcher.watch = watch
        dispatcher.start_capture()
        try:
            with reads:
                out = _run(block, args, kwargs)
        finally:
            self._recording = False
            dispatcher.watch = None
            recording = dispatcher.end_capture()[1]
        recorded = None
        if not watch.wrote and not reads.wrote and not reads.changed() and self.deciders.acted() == acted:
            recorded = self._recorded(block, path, key, out, recording, reads, calls_before, given)
        if recorded is not None and recorded.differentiable and not closed_graph(out, inputs, params, first_node):
            recorded = None
        if recorded is None:
            self.refused.add(signature)
        else:
            self.recorded.setdefault(signature, []).append(recorded)
        return out

    def _recorded(
        self,
        block: nn.Module,
        path: str,
        key: StackKey,
        out: Any,
        recording: tuple[Any, ...],
        reads: Reads,
        calls_before: Counter[str],
        given: set[int],
    ) -> _Block | None:
        """The recording of a call that ran, or None where its output cannot be made again exactly."""
        leaves, spec = tree_flatten(out)
        kept: list[Any] = []
        storages = set(given)
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                if (
                    type(leaf) is not FakeTensor
                    or leaf.layout is not torch.strided
                    or leaf.storage_offset() != 0
                    or leaf.is_conj()
                    or leaf.is_neg()
                    or storage_of(leaf) in storages
                    or leaf.untyped_storage().nbytes() != extent(leaf)
                    or self.deciders.follow(leaf)
                ):
                    return None
                storages.add(storage_of(leaf))
                kept.append(_Meta(tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device, leaf.requires_grad))
            elif type(leaf) in EQUAL:
                kept.append(leaf)
            else:
                return None
        beneath = {id(module): name for name, module in self._subtree(block)}
        calls: list[tuple[str | None, str]] = []
        for called, count in self.tracker.calls.items():
            extra = count - calls_before.get(called, 0) - (called == path)
            if extra < 0:
                return None
            name = beneath.get(id(self.tracker.ran[called]))
            if name is not None and called != (f"{path}.{name}" if name else path):
                return None  # a module beneath it that ran at a path of its own: where would a replay's run?
            calls.extend([(name, called)] * extra)
        differentiable = any(isinstance(m, _Meta) and m.requires_grad for m in kept)
        return _Block(tuple(reads.log()), recording, path, key, tuple(calls), spec, tuple(kept), differentiable)

    # replaying ----------------------------------------------------------------------

    def _replay(self, block: nn.Module, recorded: _Block, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """What the call adds, added again under its own paths; its output made with the recorded metadata."""
        tracker = self.tracker
        frames = list(tracker.frames)
        tracker._enter(block, args)  # as the tracker's hook would: the call is one of the model's
        path, _, key = tracker.frames[-1]
        self.dispatcher.replay(recorded.recording, _placer(recorded.key, recorded.path, key, path))
        subtree = dict(self._subtree(block))
        ran = tracker.ran
        for name, called in recorded.calls:  # the modules it called, beneath it at their paths, or elsewhere at theirs
            if name is not None:
                called = f"{path}.{name}" if name else path
            tracker.calls[called] += 1
            if name is not None and called not in ran:  # one elsewhere ran where it ran for the recorded call
                ran[called] = subtree[name]
        if recorded.differentiable:
            inputs = [leaf for leaf in tree_flatten((args, kwargs))[0] if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
            params = [p for p in _params(self._subtree(block)) if p.requires_grad]
            call = _Call(self, block, recorded, args, kwargs, frames, path, key, autocast_state())
            made = iter(_Replayed.apply(call, *inputs, *params))
        else:
            made = iter([self._tensor(m) for m in recorded.leaves if isinstance(m, _Meta)])
        out = tree_unflatten([next(made) if isinstance(m, _Meta) else m for m in recorded.leaves], recorded.spec)
        tracker._exit(block, args, out)
        self.replays += 1
        return out

    def _tensor(self, meta: _Meta) -> torch.Tensor:
        """An empty fake tensor of the run with ``meta``'s metadata, made beneath every mode (no op is dispatched)."""
        with torch._C._DisableTorchDispatch():
            empty = torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="meta")
        return self.fake_mode.fake_tensor_converter.from_meta_and_device(self.fake_mode, empty, meta.device)

    def backward_of(self, call: _Call, grads: tuple[torch.Tensor | None, ...], needs: tuple[bool, ...]) -> list[Any]:
        """The gradients of a replayed call's inputs and parameters (None where not needed), its backward pass
        counted: replayed where one like it was recorded, else run (and recorded) on its forward pass run again."""
        try:
            key = (id(call.recorded), tuple(None if g is None else _tensor_signature(g) for g in grads), needs)
            hash(key)
        except (_NotReplayable, TypeError, RuntimeError):
            key = None
        recorded = self.backward.get(key) if key is not None else None
        if recorded is not None:
            self.dispatcher.replay(recorded.recording, _placer(recorded.key, recorded.path, call.key, call.path))
            return [None if m is None else self._tensor(m) for m in recorded.grads]
        made, recorded = self._rerun(call, grads, needs)
        if recorded is not None and key is not None:
            self.backward[key] = recorded
        return made

    def _rerun(self, call: _Call, grads: tuple[torch.Tensor | None, ...], needs: tuple[bool, ...]) -> tuple[list[Any], _Backward | None]:
        """The backward pass of a replayed call, run: its forward pass again with the meters muted (under the
        module stack it ran in), then the gradients with every op counted and recorded."""
        tracker, dispatcher = self.tracker, self.dispatcher
        frames, stack_key = tracker.frames, tracker.key
        tracker.frames = list(call.frames)
        tracker.key = call.frames[-1][2] if call.frames else ()
        dispatcher.muted = True
        try:
            with torch.enable_grad(), _autocast(call.autocast):
                leaves, spec = tree_flatten((call.args, call.kwargs))
                copies = [leaf.detach().requires_grad_(leaf.requires_grad) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
                args, kwargs = tree_unflatten(copies, spec)
                out = call.block(*args, **kwargs)
        finally:
            dispatcher.muted = False
            tracker.frames, tracker.key = frames, stack_key
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
        inputs = [c for c, leaf in zip(copies, leaves) if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
        wrt = [*inputs, *(p for p in _params(self._subtree(call.block)) if p.requires_grad)]
        wanted = [t for t, need in zip(wrt, needs) if need]
        acted = self.deciders.acted()
        recomputed: list[Op] = []
        dispatcher.watch = lambda op: recomputed.append(op) if op.phase == "recompute" else None
        dispatcher.start_capture()
        try:
            got: Any = [None] * len(wanted)
            if pairs and wanted:
                got = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
        finally:
            dispatcher.watch = None
            recording = dispatcher.end_capture()[1]
        given = iter(got)
        made = [next(given) if need else None for need in needs]
        tensors = [t for t in made if t is not None]
        storages = {storage_of(g) for g in grads if g is not None}
        # activation checkpointing within the block: where its recomputed ops count depends on the recomputes
        # before it (an early-stopped recompute leaves modules unexited), so each such backward pass runs
        exact = (
            not recomputed
            and self.deciders.acted() == acted
            and all(
                type(t) is FakeTensor
                and t.layout is torch.strided
                and t.storage_offset() == 0
                and t.untyped_storage().nbytes() == extent(t)
                for t in tensors
            )
        )
        for t in tensors:  # a gradient passed on, or shared by two inputs, is not one a replay could make
            exact = exact and storage_of(t) not in storages
            storages.add(storage_of(t))
        if not exact:
            return made, None
        metas = tuple(None if t is None else _Meta(tuple(t.shape), t.stride(), t.dtype, t.device, False) for t in made)
        return made, _Backward(recording, call.path, call.key, metas)


class _Call(NamedTuple):
    """A replayed call, as its backward pass needs it."""

    memo: BlockMemo
    block: nn.Module
    recorded: _Block
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    frames: list[Any]  # the tracker's frames as the call began (the stack it ran under)
    path: str
    key: StackKey
    autocast: tuple[Any, ...] | None  # the autocast it ran under (see alike.autocast_state)


class _Replayed(torch.autograd.Function):
    """A replayed call in the autograd graph: empty outputs, and a backward pass the memo counts."""

    @staticmethod
    def forward(ctx: Any, call: _Call, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.call = call
        ctx.set_materialize_grads(False)
        metas = [m for m in call.recorded.leaves if isinstance(m, _Meta)]
        made = tuple(call.memo._tensor(m) for m in metas)
        ctx.mark_non_differentiable(*(t for t, m in zip(made, metas) if not m.requires_grad))
        return made

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        call: _Call = ctx.call
        return (None, *call.memo.backward_of(call, grads, tuple(ctx.needs_input_grad[1:])))


def _placer(old_key: StackKey, old_path: str, new_key: StackKey, new_path: str) -> Place:
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


def _params(subtree: tuple[tuple[str, nn.Module], ...]) -> list[torch.Tensor]:
    return _unique(p for _, m in subtree for p in m._parameters.values() if p is not None)


def _unique(tensors: Iterator[torch.Tensor] | Any) -> list[torch.Tensor]:
    return list({id(t): t for t in tensors}.values())


def _run(block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The call, run as a module call runs (its hooks, the tracker's among them)."""
    return block._call_impl(*args, **kwargs)  # type: ignore[no-untyped-call]


def _autocast(state: tuple[Any, ...] | None) -> contextlib.ExitStack:
    """The autocast of :func:`.alike.autocast_state`, entered again (a replayed call's forward pass, run for its backward)."""
    stack = contextlib.ExitStack()
    for kind, enabled, dtype in state[:-1] if state is not None else ():
        if enabled:
            stack.enter_context(torch.autocast(kind, dtype=dtype, cache_enabled=state[-1]))  # type: ignore[index]
    return stack
