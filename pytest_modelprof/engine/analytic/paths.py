"""The paths Python code takes where it reads a fake tensor, in an analytic run.

- :func:`eager_paths`: libraries that take a tracer's path on fake tensors (transformers' ``is_fake_tensor``)
  take their eager path where the run knows the value they read, as the real run does;
- :func:`passing_value`: a check of a value the run does not know, whose failing branch raises at once
  (``if not (scale > 0).all(): raise``, ``assert``), is answered with the value that lets it pass. Which
  branch raises is read from the checking frame's bytecode (:class:`_Paths`: the forward paths through its
  instructions).
"""

from __future__ import annotations

import contextlib
import dis
import functools
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor


@contextlib.contextmanager
def eager_paths(known: Callable[[torch.Tensor], torch.Tensor | None]) -> Iterator[None]:
    """Libraries that take a tracer's path on fake tensors take their eager path where ``known`` gives the value
    they would read (the run's :meth:`~.values.KnownValues.value`), as they do in the real run that an analytic
    run stands for.

    transformers counts a fake tensor as a trace (``is_tracing``, through ``utils.import_utils.is_fake_tensor``):
    traced, it builds the attention mask that an eager run leaves out once it has read that the padding mask
    is all ones, and attention runs masked where the real run's is causal. Nothing is imported: a library
    that the model has not imported is not there to patch.

    ``Tensor.__format__`` formats a 0-dim tensor as its number, but a subclass's as its repr: a fake one whose
    value the run knows is formatted as its number (``self[f"expert_{idx}"]``, as a mixture-of-experts loop
    names the expert it runs)."""
    with contextlib.ExitStack() as stack:
        module, name = sys.modules.get("transformers.utils.import_utils"), "is_fake_tensor"
        original = getattr(module, name, None)
        if module is not None and callable(original):

            def is_fake_tensor(x: Any) -> bool:
                return bool(original(x)) and known(x) is None

            setattr(module, name, is_fake_tensor)
            stack.callback(setattr, module, name, original)
        formatted, own = FakeTensor.__format__, "__format__" in vars(FakeTensor)

        def __format__(self: FakeTensor, spec: str) -> str:
            value = known(self) if self.dim() == 0 else None
            return format(value.item(), spec) if value is not None else str(formatted(self, spec))  # type: ignore[no-untyped-call]

        setattr(FakeTensor, "__format__", __format__)  # noqa: B010 (a method of the class, set for the run)
        if own:
            stack.callback(setattr, FakeTensor, "__format__", formatted)
        else:  # inherited from Tensor: inherited again
            stack.callback(delattr, FakeTensor, "__format__")
        yield


# frames between a Python truth test and the dispatch of the read it makes: the engine's modes and torch's dispatch
_MACHINERY = (
    "pytest_modelprof.",
    "torch._ops",
    "torch._compile",
    "torch._dynamo.eval_frame",
    "torch.utils._python_dispatch",
    "torch.utils._stats",
    "torch._subclasses.",
)
# instructions that test a value's truth and jump on it, and whether they jump when it is true
_TRUTH_JUMPS = {
    name: "TRUE" in name
    for name in (
        "POP_JUMP_IF_TRUE",
        "POP_JUMP_IF_FALSE",
        "POP_JUMP_FORWARD_IF_TRUE",
        "POP_JUMP_FORWARD_IF_FALSE",
        "POP_JUMP_BACKWARD_IF_TRUE",
        "POP_JUMP_BACKWARD_IF_FALSE",
    )
}


def passing_value() -> bool | None:
    """The truth value that lets the Python check now testing a tensor's truth go on without raising: the
    frame that tests it (``if``, ``if not``, ``assert``, as written or as pytest rewrites it) jumps one way to
    code whose every path raises, before it returns, loops or yields, and the other way to code that may go
    on. None where the read is not such a check (both branches go on, ``bool(t)`` called, ``.item()``)."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith(_MACHINERY):
        frame = frame.f_back
    if frame is None:
        return None
    instructions, at = _instructions(frame.f_code)
    n = at.get(frame.f_lasti)
    if n is None:
        return None
    negated = False
    for opname in ("TO_BOOL", "UNARY_NOT"):  # Python 3.13's explicit conversion, and a `not` the compiler kept
        if instructions[n].opname == opname and n + 1 < len(instructions):
            negated ^= opname == "UNARY_NOT"
            n += 1
    jump = instructions[n]
    if jump.opname not in _TRUTH_JUMPS or jump.argval not in at:
        return None
    paths = _Paths(instructions, at)
    raises_if_taken, raises_if_not = paths.all_raise(at[jump.argval]), paths.all_raise(n + 1)
    if raises_if_taken == raises_if_not:
        return None
    tested = _TRUTH_JUMPS[jump.opname] != raises_if_taken  # the tested value that goes the other way
    return tested != negated


@functools.lru_cache(maxsize=256)
def _instructions(code: types.CodeType) -> tuple[list[dis.Instruction], dict[int, int]]:
    """``code``'s instructions, and the index of each by its offset (a check in a loop is read once)."""
    instructions = list(dis.get_instructions(code))
    return instructions, {instruction.offset: n for n, instruction in enumerate(instructions)}


_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs) | frozenset(getattr(dis, "hasjump", ()))
_ENDS = ("RETURN", "RERAISE", "YIELD", "SEND", "FOR_ITER", "END_ASYNC_FOR")  # a path that goes on elsewhere


class _Paths:
    """The forward paths through a code object's instructions."""

    def __init__(self, instructions: list[dis.Instruction], at: dict[int, int]) -> None:
        self.instructions, self.at = instructions, at
        self.memo: dict[int, bool] = {}
        self.budget = 4096  # instructions looked at, in all: a longer failing branch is not called a check

    def all_raise(self, n: int) -> bool:
        """Whether every path from ``instructions[n]`` raises before it returns, jumps back or yields."""
        if n in self.memo:
            return self.memo[n]
        start, raises = n, False
        self.memo[start] = False
        while n < len(self.instructions) and self.budget > 0:
            self.budget -= 1
            instruction = self.instructions[n]
            if instruction.opname == "RAISE_VARARGS":
                raises = True
                break
            if instruction.opname.startswith(_ENDS):
                break
            if instruction.opcode in _JUMPS:
                target = self.at.get(instruction.argval) if isinstance(instruction.argval, int) else None
                if target is None or target <= n:  # a loop, or a target not seen
                    break
                conditional = "IF" in instruction.opname
                raises = self.all_raise(target) and (not conditional or self.all_raise(n + 1))
                break
            n += 1
        self.memo[start] = raises
        return raises
