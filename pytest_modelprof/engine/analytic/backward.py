"""The backward pass of an analytic CUDA-target run, executed node by node in Python.

PyTorch's autograd engine cannot run the backward pass of fake CUDA tensors on a
machine without a CUDA driver: before it runs a node it stashes the current stream of
every CUDA device, and asks the driver whether a context exists (pytorch issue 92627).
The forward pass has no such need, so an analytic run on a CUDA target makes its forward
pass with fake tensors that claim ``cuda:0`` (autocast's CUDA op lists, CUDA's kernel
choices and the optimizers' CUDA defaults all apply) and hands the backward pass to
:func:`run_backward`, which walks the same graph as the engine does:

- the same order: a node runs once every node that feeds it has run; among the ready
  ones, the most recently created first (the highest sequence number; ``AccumulateGrad``
  first of all), as the engine's CPU ready queue orders them;
- the same kernels: each node's own backward (its C++ formula, or a custom
  ``autograd.Function``'s ``backward``) is called with the gradients the engine would
  pass: summed when several nodes feed one input (in place into the first where the engine
  would do so for a plain tensor, :class:`_Holders`), cast and reduced to the input's
  dtype and shape as the engine's ``validate_outputs`` does;
- the same lifetimes: what a node saved is released once it has run (the engine's
  ``release_variables``), through saved-tensor hooks that hold each saved tensor in a
  holder keyed by the node that saved it (:class:`SavedTensors`); gradients are freed as
  soon as their consumer has run;
- the same gradients: ``AccumulateGrad`` is done here as the engine does it: a gradient
  that no one else holds and that has the parameter's strides becomes ``.grad``
  (detached), another is copied into the parameter's layout, and an existing ``.grad``
  is added to in place; hooks registered on leaf tensors and post-accumulate-grad hooks
  run.

Hooks registered on non-leaf tensors and on autograd nodes, and re-entrant
checkpointing (which runs the engine itself), cannot be run this way: they are refused
with a clear error, never skipped (:class:`HookGuard`).

The run always uses this executor for a CUDA target, also where a GPU is present, so
an analytic CUDA profile is the same on every machine.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..errors import ProfileError
from ..ops.iteration import non_overlapping_and_dense

_peek_sequence_nr = torch.autograd._get_sequence_nr  # type: ignore[attr-defined]
_autograd: Any = torch._C._autograd
_current_graph_task_id = torch._C._current_graph_task_id
_current_autograd_node = torch._C._current_autograd_node
_COPY_SLICES = "torch::autograd::CopySlices"


class _State:
    node: Any = None  # the node the Python executor is running (None: none)


_STATE = _State()
_TASK_IDS = itertools.count(1 << 62)  # graph task ids of Python backward passes, apart from the engine's


def in_backward() -> bool:
    """Whether a backward pass is under way: the engine's, or :func:`run_backward`'s."""
    return _STATE.node is not None or _current_graph_task_id() != -1


def current_node() -> Any:
    """The autograd node whose backward is running (None outside the backward pass)."""
    return _STATE.node if _STATE.node is not None else _current_autograd_node()


_HANDED: list[weakref.ref[torch.Tensor]] = []  # the saved tensor the run's unpack hook has just handed back (see below)


def handed_back(tensor: Any) -> bool:
    """Whether ``tensor`` is the saved tensor the run's unpack hook has just handed back, one the engine would hand back as
    it is (an input or a leaf that needs a gradient): autograd detaches it, a detach that is the run's own."""
    return bool(_HANDED) and _HANDED[0]() is tensor


class _Holder:
    """One saved tensor, as autograd keeps it (the packed object): it lives as long as the node
    that saved it, and :meth:`SavedTensors.release` empties it once that node has run. For a hook
    pair pushed over the run's own, ``tensor`` is what that pair packed and ``unpack`` its unpack hook."""

    __slots__ = ("__weakref__", "tensor", "unpack")

    def __init__(self, tensor: Any, unpack: Callable[[Any], torch.Tensor] | None = None) -> None:
        self.tensor: Any = tensor
        self.unpack = unpack


class _NestedPack:
    """The pack hook of a pair pushed over the run's own: the pair's packed object goes into a holder
    of the node that saved it, with the pair's unpack hook. Each saved tensor keeps the pack hook it
    was packed by (autograd's ``SavedVariable``, until the node's release); this one lets go of the
    pair's as the pair leaves the stack (:meth:`close`), so that what the pair's hooks hold is held
    by the holders alone. Attributes are the pair's pack hook's (activation checkpointing reads its
    markers off the hooks on the stack)."""

    def __init__(self, saved: SavedTensors, pack: Callable[[torch.Tensor], Any], unpack: Callable[[Any], torch.Tensor]) -> None:
        self._saved: SavedTensors | None = saved
        self._pack: Callable[[torch.Tensor], Any] | None = pack
        self._unpack: Callable[[Any], torch.Tensor] | None = unpack

    def __call__(self, tensor: torch.Tensor) -> _Holder:
        assert self._saved is not None and self._pack is not None, "a saved-tensor hook called off the stack"
        owner = self._saved.owner(tensor)  # before the pair's hook runs ops of its own
        return self._saved.hold(owner, _Holder(self._pack(tensor), self._unpack))

    def close(self) -> None:
        self._saved = self._pack = self._unpack = None

    def __getattr__(self, name: str) -> Any:
        if name in ("_saved", "_pack", "_unpack"):  # not set yet (a copy's)
            raise AttributeError(name)
        return getattr(self._pack, name)


class SavedTensors:
    """Saved-tensor hooks' pack and unpack that let :func:`run_backward` release what a node saved.

    A node's sequence number is taken when it is made, just before autograd saves its
    tensors, so the tensors packed now belong to the node numbered one below the next, with
    the exceptions of in-place ops (torch/csrc/autograd's generated VariableType kernels and
    ``rebase_history``):

    - an in-place op whose backward needs its input's old value saves a clone of it, made
      (with a node of its own) after the op's node: a clone made by the node just numbered
      belongs to the one before;
    - an in-place op on a view is wrapped in a ``CopySlices`` node, numbered after it, which
      the pass runs (and whose release releases the op's node); an output such an op saves
      is saved after autograd has remade the view's own node (``AsStridedBackward0``, or the
      view ops replayed), so a view whose node was just made, and whose base's node is a
      ``CopySlices``, belongs to that ``CopySlices``.

    The holders are followed weakly: what a node that dies unrun saved (a branch whose output
    the step drops) is freed with it, as autograd frees it.

    Saved-tensor hooks pushed over the run's own while it runs (non-reentrant activation
    checkpointing's, ``save_on_cpu``, a user's) pack for the nodes made under them; the engine's
    release of a node drops what they packed and their unpack hook (a checkpoint's hooks hold its
    frame, which holds the inputs it recomputes from). :meth:`nested` holds what they pack in the
    same holders, so that the release here drops it alike.
    """

    def __init__(self) -> None:
        self._by_node: dict[int, list[weakref.ref[_Holder]]] = {}
        self._clones: set[int] = set()  # the numbers of the nodes of in-place ops' clones

    def pack(self, tensor: torch.Tensor) -> _Holder:
        return self.hold(self.owner(tensor), _Holder(tensor))

    def owner(self, tensor: torch.Tensor) -> int:
        """The sequence number of the node that is saving ``tensor`` (see the class's notes)."""
        owner: int = _peek_sequence_nr() - 1
        made_by = tensor.grad_fn
        if made_by is not None and made_by._sequence_nr() == owner:
            if made_by.name() == "CloneBackward0":  # an in-place op's clone of its input's old value
                self._clones.add(owner)
                owner -= 1
            elif tensor._base is not None:
                base = tensor._base.grad_fn
                if base is not None and base.name() == _COPY_SLICES:  # the output of an in-place op on a view
                    owner = base._sequence_nr()
        return owner

    def hold(self, owner: int, holder: _Holder) -> _Holder:
        self._by_node.setdefault(owner, []).append(weakref.ref(holder))
        return holder

    @staticmethod
    def unpack(holder: _Holder) -> torch.Tensor:
        if holder.tensor is None:
            raise RuntimeError("Trying to backward through the graph a second time: its saved tensors have been freed")
        _HANDED.clear()
        if holder.unpack is not None:
            return holder.unpack(holder.tensor)
        tensor: torch.Tensor = holder.tensor
        node, base = _STATE.node, tensor._base  # not the node's output (rewrapped: detached); a view by its base (grad_fn may remake it)
        if tensor.requires_grad and (base.grad_fn is not node if base is not None else tensor.grad_fn is not node):
            _HANDED.append(weakref.ref(tensor))
        return tensor

    @contextlib.contextmanager
    def nested(self) -> Iterator[None]:
        """Hook pairs pushed while this is entered (over the run's own) pack into holders of their node."""
        stock_push, stock_pop = _autograd._push_saved_tensors_default_hooks, _autograd._pop_saved_tensors_default_hooks
        pushed: list[_NestedPack] = []

        def push(pack: Callable[[torch.Tensor], Any], unpack: Callable[[Any], torch.Tensor]) -> None:
            pushed.append(_NestedPack(self, pack, unpack))
            stock_push(pushed[-1], SavedTensors.unpack)

        def pop() -> None:
            stock_pop()
            if pushed:
                pushed.pop().close()

        _autograd._push_saved_tensors_default_hooks, _autograd._pop_saved_tensors_default_hooks = push, pop
        try:
            yield
        finally:
            _autograd._push_saved_tensors_default_hooks, _autograd._pop_saved_tensors_default_hooks = stock_push, stock_pop

    def release(self, node: Any) -> None:
        """Empty what ``node`` saved (for a ``CopySlices``, also what the in-place op it wraps saved,
        numbered just before it, or before that op's clone)."""
        number = node._sequence_nr()
        numbers = [number]
        if node.name() == _COPY_SLICES:
            wrapped = number - 1
            numbers.append(wrapped - 1 if wrapped in self._clones else wrapped)
        for owner in numbers:
            self._clones.discard(owner + 1)
            for reference in self._by_node.pop(owner, ()):
                holder = reference()
                if holder is not None:
                    holder.tensor = holder.unpack = None


class HookGuard(TorchFunctionMode):
    """Refuses what :func:`run_backward` cannot run: hooks on non-leaf tensors, re-entrant checkpoints."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.register_hook and args and args[0].grad_fn is not None:
            raise ProfileError(
                "a hook registered on a non-leaf tensor (Tensor.register_hook) cannot run in the backward pass of "
                "an analytic CUDA-target run; profile on a real GPU (device='cuda') or without the hook"
            )
        return func(*args, **kwargs)


def run_backward(loss: torch.Tensor, saved: SavedTensors) -> None:
    """``loss.backward()``, executed here (see the module's notes)."""
    root = loss.grad_fn
    if root is None:
        raise ProfileError("the loss does not depend on any parameter that requires grad: nothing to backpropagate")
    # the gradient of the loss, made as torch.autograd.backward makes it (outside the pass),
    # and held, as it holds it, until the pass ends
    seed = torch.ones_like(loss, memory_format=torch.preserve_format)
    dependencies = _dependencies(root)
    buffers: dict[Any, list[Any]] = {root: [seed]}
    holders = _Holders(pinned=seed)
    holders.hold(seed)
    order = itertools.count()
    ready: list[tuple[int, int, Any]] = [(-root._sequence_nr(), next(order), root)]
    # code that keys its state by the graph task (non-reentrant checkpointing recomputes
    # once per task) sees one task for the whole pass, as under the engine
    task = next(_TASK_IDS)
    stock_task_id = torch._C._current_graph_task_id
    torch._C._current_graph_task_id = lambda: task
    try:
        _run(buffers, holders, dependencies, ready, order, saved)
    finally:
        torch._C._current_graph_task_id = stock_task_id
        _HANDED.clear()


def _run(
    buffers: dict[Any, list[Any]],
    holders: _Holders,
    dependencies: dict[Any, int],
    ready: list[tuple[int, int, Any]],
    order: Iterator[int],
    saved: SavedTensors,
) -> None:
    shared: set[Any] = set()  # AccumulateGrad nodes whose gradient someone else holds too
    with torch.no_grad():
        while ready:
            node = heapq.heappop(ready)[2]
            inputs = buffers.pop(node)
            holders.release_all(inputs)
            with _running(node):
                if hasattr(node, "variable"):  # AccumulateGrad
                    _accumulate(node.variable, inputs[0], stealable=node not in shared)
                    continue
                outputs = _call(node, inputs)
                # as the engine: the outputs are validated (reduced and cast to what their consumers
                # expect) while the node's inputs and saved tensors are held; then it releases them
                given = Counter(id(grad) for grad in outputs if grad is not None)
                repeated = [grad is not None and given[id(grad)] > 1 for grad in outputs]
                grads = _validated_all(node, outputs)
                del inputs, outputs
                saved.release(node)
                _pass_on(node, grads, repeated, buffers, shared, holders, dependencies, ready, order)
                del grads


def _validated_all(node: Any, outputs: tuple[Any, ...]) -> list[Any]:
    """``node``'s gradients as their consumers expect them, in order (the engine's ``validate_outputs``)."""
    return [
        _validated(grad, consumer, input_nr, index, node) if grad is not None and consumer is not None else grad
        for index, ((consumer, input_nr), grad) in enumerate(zip(node.next_functions, outputs))
    ]


def _pass_on(
    node: Any,
    outputs: list[Any],
    repeated: list[bool],
    buffers: dict[Any, list[Any]],
    shared: set[Any],
    holders: _Holders,
    dependencies: dict[Any, int],
    ready: list[tuple[int, int, Any]],
    order: Iterator[int],
) -> None:
    """Add ``node``'s validated gradients to its consumers' inputs; queue the consumers that have all
    theirs. ``repeated``: which outputs the node gave a tensor it gave another output too; ``holders``: who
    holds the gradients in the buffers."""
    for index, ((consumer, input_nr), grad) in enumerate(zip(node.next_functions, outputs)):
        if consumer is None:
            continue
        buffer = buffers.get(consumer)
        if buffer is None:
            buffer = buffers[consumer] = [None] * max(1, len(consumer._input_metadata))
        if grad is not None:
            if repeated[index]:  # one tensor given to two inputs: the engine would not steal it
                shared.add(consumer)
            old = buffer[input_nr]
            if old is None:
                buffer[input_nr] = grad
                holders.hold(grad)
            elif holders.sums_in_place(old, grad):
                old.add_(grad)
            else:
                holders.release(old)
                buffer[input_nr] = old + grad
                holders.hold(buffer[input_nr])
            del old  # (the sum replaces it: freed now, as the engine frees it)
        dependencies[consumer] -= 1
        if dependencies[consumer] == 0:
            heapq.heappush(ready, (-consumer._sequence_nr(), next(order), consumer))


class _Holders:
    """Who holds each gradient waiting in the buffers, for the rule by which autograd's engine sums a further
    gradient of an input into the first in place (``InputBuffer::accumulate``'s ``can_accumulate_inplace``, for
    a plain tensor: a fake one is a tensor subclass, into which the engine never adds): where the first is dense
    and the last reference to its storage. Here: no other input in the buffers is it, or a view of it; it is not
    a view itself (a slice of a concatenation's gradient); and nothing outside the pass holds it (``pinned``: the
    loss's gradient, which the caller holds until the pass ends). A custom ``autograd.Function`` that keeps a
    gradient it returns is not seen: the engine would add out of place there, the executor in place."""

    def __init__(self, pinned: torch.Tensor) -> None:
        self.inputs: Counter[int] = Counter()  # by a gradient's id: the inputs in the buffers that are it
        self.views: Counter[int] = Counter()  # by a tensor's id: the inputs in the buffers that are views of it
        self.pinned = id(pinned)  # (alive through the pass: its id is not reused)

    def hold(self, grad: torch.Tensor) -> None:
        self.inputs[id(grad)] += 1
        if grad._base is not None:  # (the view keeps its base alive: the base's id is not reused)
            self.views[id(grad._base)] += 1

    def release(self, grad: torch.Tensor) -> None:
        _decrement(self.inputs, id(grad))
        if grad._base is not None:
            _decrement(self.views, id(grad._base))

    def release_all(self, inputs: list[Any]) -> None:
        """A node's inputs leave the buffers (it runs)."""
        for grad in inputs:
            if grad is not None:
                self.release(grad)

    def sums_in_place(self, old: torch.Tensor, grad: torch.Tensor) -> bool:
        """Whether the engine would add ``grad`` into ``old``, an input's first gradient, in place."""
        key = id(old)
        alone = self.inputs[key] == 1 and not self.views[key] and key != self.pinned and grad is not old
        return alone and old._base is None and non_overlapping_and_dense(old)


def _decrement(counter: Counter[int], key: int) -> None:
    if counter[key] > 1:
        counter[key] -= 1
    else:
        del counter[key]


def _dependencies(root: Any) -> dict[Any, int]:
    """How many edges lead into each node reachable from ``root``."""
    count: dict[Any, int] = {root: 0}
    stack = [root]
    while stack:
        for consumer, _ in stack.pop().next_functions:
            if consumer is None:
                continue
            if consumer not in count:
                count[consumer] = 0
                stack.append(consumer)
            count[consumer] += 1
    return count


class _running:
    def __init__(self, node: Any) -> None:
        self.node = node

    def __enter__(self) -> None:
        self.previous = _STATE.node
        _STATE.node = self.node

    def __exit__(self, *exc: object) -> None:
        _STATE.node = self.previous


def _call(node: Any, inputs: list[Any]) -> tuple[Any, ...]:
    """The gradients ``node`` returns for its next edges, one per edge."""
    forward_cls = getattr(node, "_forward_cls", None)
    if forward_cls is None:  # a node of a built-in op (a C++ formula)
        out = node(*inputs)
        return out if isinstance(out, tuple) else (out,)
    # a custom autograd.Function: its backward, with missing gradients made zeros (the default)
    if getattr(forward_cls, "__name__", "") == "CheckpointFunction":
        raise ProfileError(
            "re-entrant activation checkpointing (torch.utils.checkpoint with use_reentrant=True) runs the autograd "
            "engine itself, which an analytic CUDA-target run without a GPU cannot do; use use_reentrant=False"
        )
    if getattr(node, "materialize_grads", True):
        inputs = [
            torch.zeros(meta.shape, dtype=meta.dtype, device=meta.device) if grad is None else grad
            for grad, meta in zip(inputs, node._input_metadata)
        ]
    out = node.apply(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    needed = [grad for grad, wanted in zip(out, node.needs_input_grad) if wanted]
    edges = [i for i, (consumer, _) in enumerate(node.next_functions) if consumer is not None]
    if len(needed) != len(edges):
        raise ProfileError(f"the backward of {forward_cls.__name__} returned {len(out)} gradients for {len(node.needs_input_grad)} inputs")
    grads: list[Any] = [None] * len(node.next_functions)
    for i, grad in zip(edges, needed):
        grads[i] = grad
    return tuple(grads)


def _validated(grad: torch.Tensor, consumer: Any, input_nr: int, index: int, producer: Any) -> torch.Tensor:
    """``grad`` as the consumer's input expects it: the engine's ``validate_outputs``."""
    metadata = consumer._input_metadata
    if input_nr >= len(metadata):
        return grad
    meta = metadata[input_nr]
    shape = tuple(meta.shape)
    if tuple(grad.shape) != shape:
        try:
            grad = grad.sum_to_size(shape)
        except RuntimeError as error:
            raise ProfileError(
                f"{producer.name()} returned a gradient of shape {tuple(grad.shape)} for output {index}, "
                f"where {consumer.name()} expects {shape}"
            ) from error
    if grad.dtype != meta.dtype:
        grad = grad.to(meta.dtype)
    if grad.device != meta.device:
        grad = grad.to(meta.device)
    return grad


def _accumulate(param: torch.Tensor, grad: torch.Tensor | None, stealable: bool) -> None:
    """What ``AccumulateGrad`` does with ``grad`` for the leaf ``param``."""
    for hook in (getattr(param, "_backward_hooks", None) or {}).values():
        if grad is not None:
            changed = hook(grad)
            grad = changed if changed is not None else grad
    if grad is None:
        return
    if param.grad is None:
        if stealable and _obeys_layout(grad, param):
            param.grad = grad.detach()  # stolen: the gradient becomes .grad without a copy
        else:
            param.grad = _in_layout_of(grad, param)
    else:
        param.grad += grad
    for hook in (getattr(param, "_post_accumulate_grad_hooks", None) or {}).values():
        hook(param)


def _obeys_layout(grad: torch.Tensor, param: torch.Tensor) -> bool:
    """The gradient layout contract: ``.grad`` has the parameter's strides (dense parameters) or is contiguous."""
    if not non_overlapping_and_dense(param):
        return grad.is_contiguous()
    for size, stride, wanted in zip(grad.shape, grad.stride(), param.stride()):
        if size != 1 and stride != wanted:
            return False
        if size == 1 and stride == 0:
            return False
    return True


def _in_layout_of(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    if non_overlapping_and_dense(param):
        return torch.empty_strided(param.shape, param.stride(), dtype=param.dtype, device=param.device).copy_(grad)
    return grad.clone(memory_format=torch.contiguous_format)
