"""Which module (dotted path) is running, in the forward pass and in the backward pass.

Forward: global module pre/post hooks, registered only while a profile runs, keep a
stack of frames. A module's path is its name under the module that called it, so a
module shared by two parents is attributed to whichever parent ran it; a module
called from outside its parent falls back to its first path in ``named_modules``. A module
the model puts in as it runs (a child of a running module, not in the model when the run
began: BigBird swaps its attention in forward) is tracked from its first call, and every
path a module ran at is kept (``ran``), so that each gets a row.

Backward: every autograd node gets a sequence number when the forward creates it.
At each module entry and exit the tracker records the next sequence number and the
stack at that moment; an op in the backward pass is attributed to the stack that was
active when its node (:func:`..analytic.backward.current_node`) was created. This is
exact for modules called several times, shared modules and re-entrant calls, and it
needs no hooks on tensors.
"""

from __future__ import annotations

import bisect
import warnings
import weakref
from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from ..analytic.backward import in_backward

StackKey = tuple[str, ...]
"""The dotted paths of the modules running, outermost first, each path once."""

ROOT: StackKey = ("",)

_get_sequence_nr = torch.autograd._get_sequence_nr  # type: ignore[attr-defined]
# AccumulateGrad nodes (one per leaf) all carry this sequence number.
ACCUMULATE_GRAD_SEQUENCE_NR = 2**64 - 1


def ancestors(path: str) -> StackKey:
    """The stack key of ``path`` and all its ancestors: ``"a.b"`` -> ``("", "a", "a.b")``."""
    if not path:
        return ROOT
    parts = path.split(".")
    return ("", *(".".join(parts[: i + 1]) for i in range(len(parts))))


class ModuleTracker:
    """Tracks the module stack of one model while it is profiled (a context manager)."""

    def __init__(self, named_modules: list[tuple[str, nn.Module]]) -> None:
        """``named_modules`` is the model's ``named_modules(remove_duplicate=False)``."""
        self.first_path: dict[int, str] = {}
        for path, module in named_modules:
            self.first_path.setdefault(id(module), path)
        self.frames: list[tuple[str, nn.Module, StackKey]] = []
        self.key: StackKey = ()
        self.calls: Counter[str] = Counter()
        # a parent's id -> the parent, its children's names by id
        self._child_names: dict[int, tuple[weakref.ref[nn.Module], dict[int, str | None]]] = {}
        self._boundary_seqs: list[int] = []
        self._boundary_keys: list[StackKey] = []
        self._node_keys: dict[int, StackKey] = {}
        self._param_keys: dict[int, StackKey] = {}
        self._handles: list[Any] = []
        self.ran: dict[str, nn.Module] = {}  # each path a module ran at, and the first module that ran there
        # told of every tracked call (see memo.LeafMemo): enter(module, args, key), exit(module)
        self.observer: Any = None

    def __enter__(self) -> ModuleTracker:
        self._handles = [
            register_module_forward_pre_hook(self._enter),
            register_module_forward_hook(self._exit),
        ]
        # torch.compile'd modules warn of global hooks (these): the run's own, not the caller's concern
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks", category=UserWarning)
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._warnings.__exit__(None, None, None)

    def watch_parameters(self, tensors: dict[str, torch.Tensor]) -> None:
        """Attribute gradient accumulation for these (name -> tensor) leaves to their owners."""
        for name, tensor in tensors.items():
            self._param_keys[id(tensor)] = ancestors(name.rpartition(".")[0])

    # forward -------------------------------------------------------------

    def _child_path(self, module: nn.Module) -> str | None:
        """``module``'s path as a child of the running module, None where it is not one."""
        if not self.frames:
            return None
        parent_path, parent, _ = self.frames[-1]
        known = self._child_names.get(id(parent))
        if known is None or known[0]() is not parent:  # (not another object at a freed one's id)
            names: dict[int, str | None] = {}
            for n, child in parent._modules.items():
                names.setdefault(id(child), n)  # its first name, as a scan of the children finds it
            known = self._child_names[id(parent)] = (weakref.ref(parent), names)
        name = known[1].get(id(module), "")
        if name == "" or (name is not None and parent._modules.get(name) is not module):
            # not its child when first seen (one it put in since, or none of its children), or moved since
            name = known[1][id(module)] = next((n for n, child in parent._modules.items() if child is module), None)
        if name is None:
            return None
        return f"{parent_path}.{name}" if parent_path else name

    def _path_of(self, module: nn.Module) -> str:
        path = self._child_path(module)
        return path if path is not None else self.first_path[id(module)]

    def _adopt(self, module: nn.Module) -> bool:
        """Whether ``module``, not in the model when the run began, is a child of the running module (one
        the model put in as it ran: BigBird swaps its attention in forward); if so it is tracked from now."""
        path = self._child_path(module)
        if path is not None:
            self.first_path[id(module)] = path
        return path is not None

    def frame_for(self, module: nn.Module) -> tuple[str, StackKey] | None:
        """The path ``module`` runs at if it is called now, and the module stack it then runs under
        (None: a module the tracker does not follow)."""
        if id(module) not in self.first_path and not self._adopt(module):
            return None
        path = self._path_of(module)
        if not self.frames:
            # a module entered with nothing above it: the model itself, or a
            # checkpointed submodule recomputed during the backward pass
            return path, ancestors(path)
        if path in self.key:
            return path, self.key
        return path, (*self.key, path)

    def _enter(self, module: nn.Module, args: Any) -> None:
        frame = self.frame_for(module)
        if frame is None:
            return
        path, key = frame
        self.frames.append((path, module, key))
        self.key = key
        if path not in self.ran:
            self.ran[path] = module
        if not in_backward():
            self.calls[path] += 1
        self._mark()
        if self.observer is not None:
            self.observer.enter(module, args, key)

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if id(module) not in self.first_path:
            return
        if self.observer is not None:
            self.observer.exit(module)
        while self.frames:
            _, frame_module, _ = self.frames.pop()
            if frame_module is module:
                break
        self.key = self.frames[-1][2] if self.frames else ()
        self._mark()

    def _mark(self) -> None:
        # only autograd nodes need the boundaries, and none are made with grad off
        if torch.is_grad_enabled():
            self._boundary_seqs.append(_get_sequence_nr())
            self._boundary_keys.append(self.key)

    def innermost(self) -> tuple[str, nn.Module] | None:
        """The deepest module still running (after an exception: where it was raised)."""
        if not self.frames:
            return None
        path, module, _ = self.frames[-1]
        return path, module

    # backward ------------------------------------------------------------

    def key_of_node(self, node: Any) -> StackKey:
        """The module stack that was active when the forward created ``node``."""
        if node is None:
            return ROOT
        seq = node._sequence_nr()
        if seq == ACCUMULATE_GRAD_SEQUENCE_NR:
            return self._param_keys.get(id(node.variable), ROOT)
        return self.key_of_sequence_nr(seq)

    def attribute_node(self, node: Any, key: StackKey) -> None:
        """Attribute what runs for ``node`` in the backward pass to ``key`` (a node the forward pass did not make
        under a module of its own: a block memo's replayed call, see :mod:`.blocks`)."""
        self._node_keys[node._sequence_nr()] = key

    def key_of_sequence_nr(self, seq: int) -> StackKey:
        """The module stack that was active when the forward made autograd node number ``seq``."""
        key = self._node_keys.get(seq)
        if key is None:
            index = bisect.bisect_right(self._boundary_seqs, seq) - 1
            key = self._boundary_keys[index] if index >= 0 else ()
            self._node_keys[seq] = key
        return key


def named_members(model: nn.Module) -> tuple[list[tuple[str, nn.Module]], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``model``'s modules (``named_modules(remove_duplicate=False)``: a module reached by two paths, at each), and its
    ``named_parameters()`` and ``named_buffers()``, read off the one walk of the modules where ``nn.Module``'s own methods
    would give them (each module and tensor under the first name the walk reaches it by, as they do, modules told apart
    as their sets tell them); a model whose methods are not those (a class's or an object's own ``named_parameters``,
    ``named_buffers`` or ``_named_members``, behind both; a module's own ``named_modules``) is asked itself."""
    modules = list(model.named_modules(remove_duplicate=False))
    if any(not _own(model, name) for name in ("named_parameters", "named_buffers", "_named_members")) or any(
        not _own(module, "named_modules") for _, module in modules
    ):
        return modules, dict(model.named_parameters()), dict(model.named_buffers())
    params: dict[str, torch.Tensor] = {}
    buffers: dict[str, torch.Tensor] = {}
    walked: set[nn.Module] = set()  # as named_modules(remove_duplicate=True) keeps them
    seen: tuple[set[int], set[int]] = (set(), set())  # parameters and buffers, by id (each method keeps its own)
    for prefix, module in modules:
        if module in walked:
            continue
        walked.add(module)
        for members, found, ids in ((module._parameters, params, seen[0]), (module._buffers, buffers, seen[1])):
            for name, tensor in members.items():
                if tensor is not None and id(tensor) not in ids:
                    ids.add(id(tensor))
                    found[f"{prefix}.{name}" if prefix else name] = tensor
    return modules, params, buffers


_MODULE_METHODS = {name: getattr(nn.Module, name) for name in ("named_parameters", "named_buffers", "_named_members", "named_modules")}


def _own(module: nn.Module, name: str) -> bool:
    """Whether ``module.<name>`` is ``nn.Module``'s method as this module found it when imported."""
    return getattr(getattr(module, name), "__func__", None) is _MODULE_METHODS[name]
