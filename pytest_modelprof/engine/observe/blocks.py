"""Replays the repeated blocks of an analytic FLOP count instead of running them.

A deep model is a few kinds of block repeated: the 32 decoder layers of a Llama, the
bottlenecks of a ResNet stage. On fake tensors each block's ops run only to be counted,
and two calls that are sure to run the same ops count the same: so a call like one seen
before is run and its counts recorded (a first call only runs: a model whose blocks all
differ records nothing), and a later call of a block *like it* adds the recording again
under its own module paths, without running. Its outputs are made
empty with the recorded metadata, through an ``autograd.Function`` (:class:`.rerun.Replayed`)
whose backward does the same for the block's backward pass: the first replayed block
that reaches it runs its forward again with the meters muted, on what its call read as
it was then (:class:`.rerun.State`), and its backward counted and recorded, its parameters'
gradients accumulating as in the step (as activation checkpointing would); later ones
replay that recording and set their parameters' ``.grad`` as it left them. The engine then
sums what the block passes back to an input with what it holds for it under the module
stack where the step would have (the first node of the block to pass the input a gradient).
The figures are those of running every block, bit for bit; what is saved is the time.

Two calls are alike when everything their ops can depend on is the same:

- the block's *signature*: its type, the type of every module beneath it and the
  metadata of their parameters and buffers (type, dtype, device, shape, strides,
  requires_grad), the metadata of each tensor among the call's arguments and the value of
  each other argument (the arguments must be tensors, numbers, strings and None, in
  tuples, lists and dicts), and the grad, inference and autocast modes;
- the value of every attribute of those modules that the recorded call *read*
  (:class:`.alike.Reads` wraps their classes' attribute access while it runs), and, for a
  container or an object it read (a config), what that held: a layer's index, read only
  for a cache the call did not get, does not tell the layers apart; a sliding window it
  reads does, and so does a config its parent changes between the calls.

A call is recorded only where replaying it is sure to be exact; otherwise it runs, and
later calls of its signature too. It must read and decide no value (the known values
and the router masks of :class:`~..analytic.modes.Deciders`), change no tensor it did not
make nor a list or dict among its arguments, set no attribute, put no hook on an input,
return tensors of its own or arguments as they were given (no view of one; none the run knows
a value of: that they may not be finite, as behind an additive mask, is made so again) and
build a graph that reaches no tensor but its arguments and parameters. Its module and the modules
beneath it must have no hooks and no ``forward`` of their own, and the call must run under
no functorch transform, tracing, saved-tensor hooks (a checkpoint around it), global hook
but the tracker's, or other memo. A block called a second time, and one whose parameter
its parent uses as well, share their parameters' gradient accumulation with another call,
which a replay cannot: where one of them had a call replayed, the step runs again with the
blocks of its type always run (:class:`CalledAgain`). What a replay cannot see is state
outside the modules and the arguments (a global variable the parent sets before each call).

Only analytic runs with the engine's FLOP meter, and its memory meter on the CPU, use the memo (a
predicted time's clock follows the ops in order; a sharded step's collectives are not recorded). With
memory followed, only calls made without grad replay: a call's memory is then its own, moment by
moment (:mod:`.memory_replay`), while a replayed backward pass would free and accumulate at
other moments than the step. The memo serves the modules that repeat another's type and structure
and share no parameter with a module outside them (:func:`.alike.repeated_blocks`); it lives for one run.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.modules import module as _module_globals
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..analytic.backward import in_backward
from .alike import (
    EQUAL,
    Reads,
    Writes,
    autocast_state,
    closed_graph,
    containers_of,
    contents_of,
    leaf_signature,
    repeated_blocks,
    same_value,
    storage_of,
)
from .memo import _NotReplayable, _tensor_signature
from .modules import ACCUMULATE_GRAD_SEQUENCE_NR
from .rerun import MISSING, Backwards, Call, Meta, Passed, Recorded, Replayed, State, hooks_of, meta_of, placer, plain

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..analytic.modes import Deciders
    from .dispatch import Dispatcher
    from .modules import ModuleTracker, StackKey

_TRIES = 2  # recordings of one signature whose reads differ, after which its calls just run


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
        apart: frozenset[int] = frozenset(),
        inference_only: bool = False,
    ) -> None:
        """``hooks``: how many global forward pre-hooks (and as many forward hooks) are the tracker's own;
        ``apart``: the ids of blocks that always run (called more than once in an earlier try of the step);
        ``inference_only``: replay only calls made without grad (a run that follows memory)."""
        self.inference_only = inference_only
        self.dispatcher = dispatcher
        self.tracker = tracker
        self.deciders = deciders
        self.fake_mode = fake_mode
        self.blocks = [block for block in repeated_blocks(model) if id(block) not in apart]
        self._hooks = hooks
        self._ours: set[int] = set()
        self._subtrees: dict[int, tuple[tuple[str, nn.Module], ...]] = {}
        self.recorded: dict[Any, list[Recorded]] = {}
        self.refused: set[Any] = set()
        self.seen: set[Any] = set()
        self.backwards = Backwards(dispatcher, tracker, deciders, fake_mode)
        self._recording = False
        self._called: set[int] = set()  # the blocks called so far
        self._replayed: set[int] = set()  # ... and those of them replayed
        self._accumulated: dict[int, type] = {}  # parameters whose gradients replays accumulate -> their block's type

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Every call of a repeated block goes through the memo while this is entered."""
        self.dispatcher.guard = self._guard
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
            self.dispatcher.guard = None

    def _guard(self, node: Any) -> bool:
        """Whether the meters should not see an op of the backward pass (a rerun's accumulation into its input
        copies); raises :class:`CalledAgain` where a parameter of a replayed call gets a gradient from elsewhere
        too (its parent uses it): the step would sum the two before it accumulates them, which the replay's own
        accumulation does not."""
        if node in self.backwards.hidden:
            return True
        if not self.backwards.rerunning and node._sequence_nr() == ACCUMULATE_GRAD_SEQUENCE_NR and hasattr(node, "variable"):
            kind = self._accumulated.get(id(node.variable))
            if kind is not None:
                raise CalledAgain(frozenset(id(b) for b in self.blocks if type(b) is kind))
        return False

    def _subtree(self, block: nn.Module) -> tuple[tuple[str, nn.Module], ...]:
        subtree = self._subtrees.get(id(block))
        if subtree is None:
            subtree = self._subtrees[id(block)] = tuple(block.named_modules(remove_duplicate=False))
        return subtree

    # a call ------------------------------------------------------------------------

    def _call(self, block: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if self._recording or self.dispatcher.capturing or self.dispatcher.region != "forward" or in_backward():
            return _run(block, args, kwargs)
        if self.inference_only and torch.is_grad_enabled():
            return _run(block, args, kwargs)  # (memory is followed: a replayed backward pass frees otherwise)
        if id(block) in self._called:
            # a block called again: its calls' gradients sum in its parameters' accumulators, and autocast
            # casts its weights once; a replayed call takes part in neither, so the step runs again without it
            if id(block) in self._replayed:  # (and its kind: its like are likely called again too)
                raise CalledAgain(frozenset(id(b) for b in self.blocks if type(b) is type(block)))
            return _run(block, args, kwargs)
        self._called.add(id(block))
        signature = self._signature(block, args, kwargs)
        if signature is None or signature in self.refused or self.tracker.frame_for(block) is None:
            return _run(block, args, kwargs)
        if signature not in self.seen:  # a first call just runs: only a signature seen again is worth recording
            self.seen.add(signature)
            return _run(block, args, kwargs)
        subtree = dict(self._subtree(block))
        tried = self.recorded.get(signature, ())
        for recorded in tried:
            if all(same_value(subtree[path].__dict__.get(name, MISSING), value, then) for path, name, value, then in recorded.reads):
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
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if hooks is not None and hooks[0] is not self.dispatcher.pack:
            return None  # saved-tensor hooks of the model's: a checkpoint around the call, offloading
        leaves, spec = tree_flatten((args, kwargs))
        try:
            inputs = tuple(leaf_signature(leaf) for leaf in leaves)
            unbounded = tuple(self.deciders.unbounded(leaf) for leaf in leaves if isinstance(leaf, torch.Tensor))
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
            signature = (type(block), spec, inputs, unbounded, tuple(state), modes)
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
        params = _params(subtree)
        buffers = _unique(b for _, m in subtree for b in m._buffers.values() if b is not None)
        given = {storage_of(t) for t in (*inputs, *params, *buffers)}
        watch = Writes(given)
        reads = Reads(subtree)
        containers = containers_of((args, kwargs))
        hooks = [hooks_of(t) for t in inputs]
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
        if (
            not watch.wrote
            and not reads.wrote
            and not reads.changed()
            and self.deciders.acted() == acted
            and all(contents_of(c) == then for c, then in containers)
            and hooks == [hooks_of(t) for t in inputs]  # no hook put on an input, which its backward would run
        ):
            recorded = self._recorded(block, path, key, args, kwargs, out, recording, reads, calls_before, given)
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
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
        recording: tuple[Any, ...],
        reads: Reads,
        calls_before: Counter[str],
        given: set[int],
    ) -> Recorded | None:
        """The recording of a call that ran, or None where its output cannot be made again exactly."""
        leaves, spec = tree_flatten(out)
        arguments = tree_flatten((args, kwargs))[0]
        kept: list[Any] = []
        storages = set(given)
        for leaf in leaves:
            passed = next((i for i, argument in enumerate(arguments) if leaf is argument), None)
            if passed is not None:  # an argument handed back as it is (T5 passes its position bias on)
                kept.append(Passed(passed))
            elif isinstance(leaf, torch.Tensor):
                if (
                    not plain(leaf)
                    or leaf.is_conj()
                    or leaf.is_neg()
                    or storage_of(leaf) in storages
                    or self.deciders.follow(leaf)
                    or hooks_of(leaf) != (0, 0)
                ):
                    return None
                storages.add(storage_of(leaf))
                kept.append(meta_of(leaf, leaf.requires_grad, self.deciders.unbounded(leaf)))
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
        made = [leaf for leaf, m in zip(leaves, kept) if isinstance(m, Meta)]
        if not all(meter.closes(part, made) for meter, part in zip(self.dispatcher.meters, recording)):
            return None  # (memory: the call left storages other than its outputs')
        differentiable = any(isinstance(m, Meta) and m.requires_grad for m in kept)
        return Recorded(tuple(reads.log()), recording, path, key, tuple(calls), spec, tuple(kept), differentiable)

    # replaying ----------------------------------------------------------------------

    def _replay(self, block: nn.Module, recorded: Recorded, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """What the call adds, added again under its own paths; its output made with the recorded metadata."""
        tracker = self.tracker
        frames = list(tracker.frames)
        tracker._enter(block, args)  # as the tracker's hook would: the call is one of the model's
        path, _, key = tracker.frames[-1]
        self.dispatcher.replay(recorded.recording, placer(recorded.key, recorded.path, key, path))
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
            state = State.of(subtree, recorded.reads)
            self._accumulated.update((id(p), type(block)) for p in params)
            call = Call(self.backwards, block, recorded, args, kwargs, frames, path, key, autocast_state(), len(inputs), params, state)
            made = iter(Replayed.apply(call, *inputs, *params))
        else:
            outputs = [self.backwards.tensor(m) for m in recorded.leaves if isinstance(m, Meta)]
            for meter, part in zip(self.dispatcher.meters, recorded.recording):
                meter.made(part, outputs)
            made = iter(outputs)
        arguments = tree_flatten((args, kwargs))[0]
        leaves = [next(made) if isinstance(m, Meta) else arguments[m.argument] if isinstance(m, Passed) else m for m in recorded.leaves]
        out = tree_unflatten(leaves, recorded.spec)
        tracker._exit(block, args, out)
        self._replayed.add(id(block))
        return out


class CalledAgain(BaseException):
    """A block with a replayed call was called again: the step must run again with ``blocks`` (ids) always
    run (a BaseException, so that no ``except Exception`` in the model swallows it)."""

    def __init__(self, blocks: frozenset[int]) -> None:
        super().__init__(blocks)
        self.blocks = blocks


def _params(subtree: tuple[tuple[str, nn.Module], ...]) -> list[torch.Tensor]:
    return _unique(p for _, m in subtree for p in m._parameters.values() if p is not None)


def _unique(tensors: Iterator[torch.Tensor] | Any) -> list[torch.Tensor]:
    return list({id(t): t for t in tensors}.values())


def _run(block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The call, run as a module call runs (its hooks, the tracker's among them)."""
    return block._call_impl(*args, **kwargs)  # type: ignore[no-untyped-call]
