"""The tensors a run's inputs hold, wherever they are: in pytrees and in the attributes of objects.

A model's inputs are not only tensors and containers of them: a Hugging Face ``Cache`` holds a list
of layers, each with its keys and values; a flex-attention ``BlockMask`` holds its block counts and
indices; a dataclass holds what a batch is made of. :class:`Inputs` reaches them all, to convert them
for a run (copies on its device, or fake tensors) without changing the caller's objects, and to tell
which of them are a KV cache.
"""

from __future__ import annotations

import copy as copying
import enum
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten


def input_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The tensors of a run's inputs, each once, those objects hold included; and of them the KV cache's keys and
    values: those of two or more dimensions held by a cache (see :class:`Inputs`; a count of positions is no KV cache)."""
    walk = Inputs()
    walk.of(args, kwargs)
    return list(walk.tensors.values()), [t for t in walk.kv_cache.values() if t.dim() >= 2]


# keyword inputs that are a KV cache whatever holds them (Hugging Face's names, their legacy tuples included)
CACHE_KEYWORDS = frozenset({"past_key_values", "cache", "kv_cache"})


class Inputs:
    """A walk over a run's inputs that reaches every tensor: through pytrees (lists, tuples, dicts, named
    tuples, registered nodes) and through the attributes (``__dict__`` and slots) of any other object
    that is not callable, a class, a module or an enum (a dataclass, a ``BlockMask``, a Hugging Face
    ``Cache`` and its layers).

    With ``convert``, :meth:`of` returns the inputs with each tensor replaced by ``convert(tensor)``,
    rebuilding containers and copying objects shallowly, so the caller's objects are never changed
    (a cache's ``update`` writes into the run's copy); a ``torch.device`` attribute of an object becomes
    ``target``, as its tensors do. An object or tensor reached twice is converted once, so aliasing holds.
    ``tensors`` are the tensors of the result, each once; ``kv_cache`` those of them held (at any depth)
    by an object whose class or a base class is named ``...Cache``, or by a keyword in ``CACHE_KEYWORDS``."""

    def __init__(self, convert: Callable[[torch.Tensor], torch.Tensor] | None = None, target: torch.device | None = None) -> None:
        self._convert, self._target = convert, target
        self._done: dict[int, Any] = {}  # id of an input value -> what it became
        self._reached: list[Any] = []  # the values whose ids are keys of _done: alive while the walk runs
        self.tensors: dict[int, torch.Tensor] = {}
        self.kv_cache: dict[int, torch.Tensor] = {}

    def of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return self._value(args, False), {name: self._value(value, name in CACHE_KEYWORDS) for name, value in kwargs.items()}

    def _value(self, value: Any, in_cache: bool) -> Any:
        done = self._done.get(id(value))
        if isinstance(value, torch.Tensor):
            if done is None:
                done = self._remember(value, self._convert(value) if self._convert is not None else value)
            self.tensors[id(done)] = done
            if in_cache:
                self.kv_cache[id(done)] = done
            return done
        if done is not None:
            return done
        children, spec = tree_flatten(value, is_leaf=lambda child: child is not value)
        if not spec.is_leaf():  # a pytree node: its children
            return self._remember(value, tree_unflatten([self._value(child, in_cache) for child in children], spec))
        if not _holds_attributes(value):
            return value
        try:
            copied = copying.copy(value) if self._convert is not None else value
        except Exception:  # an object Python cannot copy (a lock, a handle of C++): it is left as it is
            return value
        if copied is value and self._convert is not None:  # a __copy__ that returns the object itself: it is shared
            return value
        self._remember(value, copied)
        in_cache = in_cache or any(cls.__name__.endswith("Cache") for cls in type(value).__mro__)
        for name, attribute in _attributes(value):
            if isinstance(attribute, torch.device) and self._target is not None:
                new = self._target
            else:
                new = self._value(attribute, in_cache)
            if new is not attribute and self._convert is not None:
                object.__setattr__(copied, name, new)  # past a frozen dataclass's __setattr__
        return copied

    def _remember(self, value: Any, becomes: Any) -> Any:
        self._done[id(value)] = becomes
        self._reached.append(value)
        return becomes


def _holds_attributes(value: Any) -> bool:
    """Whether the walk goes into ``value``'s attributes: an object of data, not a function, a class, a module
    (``nn.Module`` is callable) or an enum."""
    has_attributes = hasattr(value, "__dict__") or hasattr(type(value), "__slots__")
    return has_attributes and not callable(value) and not isinstance(value, (types.ModuleType, enum.Enum))


def _attributes(value: Any) -> list[tuple[str, Any]]:
    """``value``'s attributes: its ``__dict__`` and the slots of its classes that are set."""
    found = list(getattr(value, "__dict__", {}).items())
    for cls in type(value).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                found.append((name, getattr(value, name)))
    return found
