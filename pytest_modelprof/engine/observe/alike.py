"""When two calls of a block run the same ops: what the block memo (:mod:`.blocks`) checks before it
replays one call for another, and what it watches while it records one.

- :func:`repeated_blocks`: the modules worth a memo, those whose type and structure repeat;
- :func:`leaf_signature`: an argument's part of a call's signature (a tensor's metadata, another value);
- :class:`Reads`: the attributes a call reads (its modules' classes' attribute access wrapped while it
  runs), and whether it sets one or changes a container it read; :func:`same_value` compares a value
  read then with one now;
- :class:`Writes`: whether an op of the call writes into a tensor it did not make;
- :func:`closed_graph`: whether the autograd graph of its outputs reaches no tensor but its arguments
  and parameters.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from torch._prims_common import compute_required_storage_length
from torch.utils._pytree import tree_flatten

from .memo import _NotReplayable, _tensor_signature
from .modules import ACCUMULATE_GRAD_SEQUENCE_NR

if TYPE_CHECKING:
    from .stream import Op

# nn.Module's own bookkeeping, which the memo's signature covers: not an attribute a call reads
_MODULE_STATE = (frozenset(nn.Module().__dict__) | {"_compiled_call_impl"}) - {"training"}
# attribute values compared by equality (the rest by identity: the same config object, the same function)
EQUAL = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` (not itself, nor a container that is never called) with modules beneath
    them whose type and structure (every module's type beneath, every parameter's and buffer's shape and
    dtype) another module of the model has too, and whose parameters no module outside them holds."""
    kinds: dict[Any, int] = {}
    kind_of: dict[int, int] = {}

    def kind(module: nn.Module) -> int:
        known = kind_of.get(id(module))
        if known is None:
            shape = (
                type(module),
                tuple((name, kind(child)) for name, child in module._modules.items() if child is not None),
                tuple((n, None if p is None else (tuple(p.shape), p.dtype, p.requires_grad)) for n, p in module._parameters.items()),
                tuple((n, None if b is None else (tuple(b.shape), b.dtype)) for n, b in module._buffers.items()),
            )
            known = kind_of[id(module)] = kinds.setdefault(shape, len(kinds))
        return known

    modules = [m for m in {id(m): m for m in model.modules()}.values() if m is not model and m._modules and not isinstance(m, _CONTAINERS)]
    try:
        counts = Counter(kind(m) for m in modules)
    except TypeError:  # a symbolic size
        return []
    # where each module's subtree begins and ends in a walk of the model (a module reached twice: its first)
    begins: dict[int, int] = {}
    ends: dict[int, int] = {}
    holders: dict[int, list[int]] = {}  # a parameter held by more than one module -> where each holder begins

    reached: set[int] = set()  # modules reached from two places (a block shares them with another)

    def walk(module: nn.Module) -> None:
        if id(module) in begins:
            reached.add(id(module))
            return
        begins[id(module)] = len(begins)
        for p in module._parameters.values():
            if p is not None:
                holders.setdefault(id(p), []).append(begins[id(module)])
        for child in module._modules.values():
            if child is not None:
                walk(child)
        ends[id(module)] = len(begins)

    walk(model)
    shared = [places for places in holders.values() if len(places) > 1]

    def alone(block: nn.Module) -> bool:
        """Whether no module outside ``block`` holds one of its parameters, nor is one of its modules another's
        (autocast's cast of a weight is cached for the weight's next use: a replayed call would not make it)."""
        begin, end = begins[id(block)], ends[id(block)]
        if reached and any(id(m) in reached for m in block.modules()):
            return False
        return all(all(begin <= at < end for at in places) or not any(begin <= at < end for at in places) for places in shared)

    return [m for m in modules if counts[kind_of[id(m)]] > 1 and alone(m)]


def autocast_state() -> tuple[Any, ...] | None:
    """The autocast a call runs under (None: none): each device type's flag and dtype, and the cast cache's flag."""
    if not torch._C._is_any_autocast_enabled():
        return None
    kinds = tuple((kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)) for kind in ("cpu", "cuda"))
    return (*kinds, torch.is_autocast_cache_enabled())


def leaf_signature(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        return (*_tensor_signature(leaf), leaf.storage_offset(), leaf.is_neg())
    if type(leaf) in EQUAL:
        return (type(leaf), leaf, math.copysign(1.0, leaf) if type(leaf) is float else None)  # 0.0 is not -0.0
    raise _NotReplayable


def same_value(now: Any, then: Any, contents: Any) -> bool:
    """Whether an attribute's value is the one a recorded call read: an equal number, string, dtype, ...,
    tuples of them, a partial of the same function with such arguments, or the very object, holding
    what it held then (``contents``, from :func:`contents_of`)."""
    if type(now) is not type(then):
        return False
    if isinstance(now, EQUAL):
        return bool(now == then) and (type(now) is not float or math.copysign(1.0, now) == math.copysign(1.0, then))
    if type(now) is tuple:
        return len(now) == len(then) and all(same_value(a, b, None) for a, b in zip(now, then))
    if type(now) is functools.partial:  # made per module (an activation's approximation bound to it)
        return (
            now.func is then.func
            and same_value(now.args, then.args, None)
            and len(now.keywords) == len(then.keywords)
            and all(k in then.keywords and same_value(v, then.keywords[k], None) for k, v in now.keywords.items())
        )
    return now is then and contents_of(now) == contents


def contents_of(value: Any) -> Any:
    """What a container or a plain object holds, shallowly (its items' identities, or values where they
    compare by value): a read of it replays only while it holds the same. None for anything else."""
    if isinstance(value, (nn.Module, torch.Tensor, type)) or callable(value):
        return None
    if isinstance(value, (list, tuple)) and type(value) is not tuple:
        return tuple(map(_atom, value))
    if isinstance(value, dict):
        return tuple((k, _atom(v)) for k, v in value.items())
    if isinstance(value, (set, frozenset)):
        return frozenset(map(_atom, value))
    if isinstance(value, bytearray):
        return bytes(value)
    state = getattr(value, "__dict__", None)
    if type(state) is dict:  # a config object a parent may change between its blocks' calls
        return tuple((k, _atom(v)) for k, v in state.items())
    return None


def _atom(value: Any) -> Any:
    return (type(value), value) if type(value) in EQUAL and type(value) is not float else (type(value), id(value))


class Reads:
    """While entered, the modules of a block log every attribute of theirs that is read, and every one set:
    their classes' ``__getattribute__``, ``__setattr__`` and ``__delattr__`` are wrapped (on the classes
    themselves, whose instances elsewhere are not logged) and put back on exit."""

    active: ClassVar[Reads | None] = None  # the Reads entered

    def __init__(self, subtree: tuple[tuple[str, nn.Module], ...]) -> None:
        self.subtree = subtree
        self.names = {id(module): name for name, module in subtree}
        self.read: dict[tuple[str, str], tuple[Any, Any]] = {}  # (module path, attribute) -> (value, its contents)
        self.wrote = False
        self._patched: list[tuple[type, dict[str, Any]]] = []

    def __enter__(self) -> Reads:
        Reads.active = self
        for cls in {type(module): None for _, module in self.subtree}:
            own = {name: cls.__dict__[name] for name in _WRAPPED if name in cls.__dict__}
            self._patched.append((cls, own))
            for name, wrapper in _wrappers(cls).items():
                setattr(cls, name, wrapper)
        return self

    def __exit__(self, *exc: object) -> None:
        Reads.active = None
        for cls, own in self._patched:
            for name in _WRAPPED:
                if name in own:
                    setattr(cls, name, own[name])
                else:
                    delattr(cls, name)
        self._patched = []

    def note(self, module: Any, name: str, value: Any) -> None:
        path = self.names.get(id(module))
        if path is not None and (path, name) not in self.read:
            self.read[(path, name)] = (value, contents_of(value))

    def log(self) -> list[tuple[str, str, Any, Any]]:
        """Each attribute read: (module's path beneath the block, name, value, its contents then)."""
        return [(path, name, value, contents) for (path, name), (value, contents) in self.read.items()]

    def changed(self) -> bool:
        """Whether a container or object the call read changed while it ran (a list it appended to)."""
        return any(contents is not None and contents_of(value) != contents for value, contents in self.read.values())


_WRAPPED = ("__getattribute__", "__setattr__", "__delattr__")


def _wrappers(cls: type) -> dict[str, Any]:
    """``cls``'s attribute access, reads and writes of its instances told to the active :class:`Reads`."""
    get: Any = cls.__getattribute__
    put: Any = cls.__setattr__
    drop: Any = cls.__delattr__

    def __getattribute__(self: Any, name: str) -> Any:
        value = get(self, name)
        reads = Reads.active
        if reads is not None and name not in _MODULE_STATE and name in object.__getattribute__(self, "__dict__"):
            reads.note(self, name, value)
        return value

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if Reads.active is not None and id(self) in Reads.active.names:
            Reads.active.wrote = True
        put(self, name, value)

    def __delattr__(self: Any, name: str) -> None:
        if Reads.active is not None and id(self) in Reads.active.names:
            Reads.active.wrote = True
        drop(self, name)

    return {"__getattribute__": __getattribute__, "__setattr__": __setattr__, "__delattr__": __delattr__}


def containers_of(tree: Any) -> list[tuple[Any, Any]]:
    """The lists, dicts and sets among a call's arguments, with what each holds (a block that appends
    to one changes what its caller sees: it cannot be replayed)."""
    found: list[tuple[Any, Any]] = []
    stack = [tree]
    while stack:
        value = stack.pop()
        if isinstance(value, (list, dict, set)):
            found.append((value, contents_of(value)))
        if isinstance(value, (list, tuple, set)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
    return found


class Writes:
    """Watches a recorded call's ops (as the dispatcher's ``watch``) for one that writes into a tensor the
    call did not make (one of ``given``'s storages: its inputs', parameters', buffers')."""

    _written: ClassVar[dict[Any, tuple[tuple[int, str], ...]]] = {}  # an op -> the arguments it writes

    def __init__(self, given: set[int]) -> None:
        self.given = given
        self.wrote = False

    def __call__(self, op: Op) -> None:
        written = self._written.get(op.func)
        if written is None:
            schema = getattr(op.func, "_schema", None)
            arguments = schema.arguments if schema is not None else ()
            written = self._written[op.func] = tuple(
                (i, a.name) for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write
            )
            if schema is None:  # a higher-order operator: nothing said of what it writes
                self.wrote = True
        for position, name in written:
            value = op.args[position] if position < len(op.args) else op.kwargs.get(name)
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor) and storage_of(t) in self.given:
                    self.wrote = True


def closed_graph(out: Any, inputs: list[torch.Tensor], params: list[torch.Tensor], first_node: int) -> bool:
    """Whether the graph of a call's outputs reaches no tensor but its inputs and parameters: every node
    was made by the call (sequence number from ``first_node`` on), an input's, or a parameter's leaf."""
    boundary = {t.grad_fn for t in inputs if t.grad_fn is not None}
    leaves = {id(t) for t in (*inputs, *params) if t.requires_grad and t.grad_fn is None}
    stack = [t.grad_fn for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set[Any] = set()
    while stack:
        node = stack.pop()
        if node in seen or node in boundary:
            continue
        seen.add(node)
        if node._sequence_nr() == ACCUMULATE_GRAD_SEQUENCE_NR and hasattr(node, "variable"):
            if id(node.variable) not in leaves:
                return False
            continue
        if node._sequence_nr() < first_node:
            return False
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return True


def storage_of(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata  # type: ignore[no-any-return]


def extent(t: torch.Tensor) -> int:
    """The bytes of the smallest storage that holds ``t``."""
    return compute_required_storage_length(t.shape, t.stride(), 0) * t.element_size()
