"""The memory meter: storage lifetimes, by category, over the run.

Every tensor an op produces is followed by its storage (views share one), from the
op that allocated it until the storage is freed (a finalizer on the storage, which
PyTorch keeps one Python object for). Each storage belongs to one category; the
meter keeps the bytes of every category after each op, so the peak it reports is a
true peak over time, with its breakdown at that moment, not a sum of maxima.

Categories: parameters, buffers and inputs (resident from the start); gradients (what
``AccumulateGrad`` stores in ``.grad``); activations (saved for the backward pass, seen
by a saved-tensors hook); optimizer state; temporaries (everything else the run
allocates). A storage moves from temporaries to activations or gradients when it
becomes one; parameters, buffers, inputs and optimizer state never change category.

On fake tensors the same storages exist, without memory behind them, so analytic runs
give the figures of real ones. For CUDA targets each allocation is rounded up to the
caching allocator's 512-byte blocks, and the figure is allocated bytes; the allocator's
reserved segments and the cuBLAS workspace are estimated apart (:mod:`.cuda_estimates`).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from .modules import StackKey

CATEGORIES = ("parameters", "buffers", "inputs", "gradients", "activations", "temporaries", "optimizer_state")
PARAMETERS, BUFFERS, INPUTS, GRADIENTS, ACTIVATIONS, TEMPORARIES, OPTIMIZER_STATE = range(len(CATEGORIES))
_STICKY = frozenset({PARAMETERS, BUFFERS, INPUTS, OPTIMIZER_STATE})
CUDA_BLOCK = 512


class MemoryMeter:
    """Bytes per category after each op; the peak and where it fell."""

    def __init__(self, round_to: int = 1) -> None:
        self.round_to = round_to
        self.live: dict[int, list[int]] = {}  # storage address -> [bytes, category]
        self.totals = [0] * len(CATEGORIES)
        self.category_max = [0] * len(CATEGORIES)
        self.peak = 0
        self.peak_breakdown = [0] * len(CATEGORIES)
        self.peak_where: tuple[str, StackKey] = ("forward", ())
        self.timeline: list[tuple[str, tuple[int, ...]]] = []
        self.module_activations: dict[str, int] = {}
        self.module_peaks: dict[tuple[str, bool], int] = {}  # (path, in backward) -> most bytes in use
        self.allocated = 0  # bytes of new storages so far: the difference across an op is what it allocated
        self.parameters: list[tuple[str, int, int]] = []  # (name, weight bytes, gradient bytes)
        self._finalizers: list[weakref.finalize[Any, Any]] = []
        self._open = True
        # for CUDA targets, every allocation (address, bytes) and free (address, -1) in order,
        # replayed by the caching-allocator model of the reserved-memory estimate
        self.events: list[tuple[int, int]] | None = [] if round_to > 1 else None

    # tensors ---------------------------------------------------------------

    def track(self, tensor: torch.Tensor, category: int) -> int:
        """Follow ``tensor``'s storage (once), in ``category`` unless it already has a fixed one."""
        storage = tensor.untyped_storage()
        address: int = storage._cdata
        entry = self.live.get(address)
        if entry is None:
            size = storage.nbytes()
            if self.events is not None:
                self.events.append((address, size))
            if self.round_to > 1:
                size = -(-size // self.round_to) * self.round_to
            self.live[address] = [size, category]
            self.totals[category] += size
            self.allocated += size
            self._finalizers.append(weakref.finalize(storage, self._free, address))
        elif entry[1] != category and entry[1] not in _STICKY and not (category == ACTIVATIONS and entry[1] == GRADIENTS):
            self.totals[entry[1]] -= entry[0]
            self.totals[category] += entry[0]
            entry[1] = category
        return address

    def track_all(self, values: Any, category: int) -> None:
        for value in tree_flatten(values)[0]:
            if isinstance(value, torch.Tensor):
                self.track(value, category)

    def saved_for_backward(self, tensor: torch.Tensor, key: StackKey) -> None:
        """A saved-tensors hook saw ``tensor``: it lives on until the backward pass uses it."""
        entry = self.live.get(tensor.untyped_storage()._cdata)
        first_time = entry is None or entry[1] == TEMPORARIES
        address = self.track(tensor, ACTIVATIONS)
        if first_time and self.live[address][1] == ACTIVATIONS:
            for path in key:
                self.module_activations[path] = self.module_activations.get(path, 0) + self.live[address][0]

    def record_parameters(self, params: dict[str, torch.Tensor]) -> None:
        """Weight and gradient bytes of each parameter, once the backward pass has made the gradients."""
        self.parameters = [
            (name, t.untyped_storage().nbytes(), t.grad.untyped_storage().nbytes() if t.grad is not None else 0)
            for name, t in params.items()
        ]

    def _free(self, address: int) -> None:
        entry = self.live.pop(address, None)
        if entry is not None and self._open:
            self.totals[entry[1]] -= entry[0]
            if self.events is not None:
                self.events.append((address, -1))

    # time --------------------------------------------------------------------

    def sample(self, phase: str, key: StackKey) -> None:
        """Record the bytes per category after an op, and the peak."""
        totals = tuple(self.totals)
        self.timeline.append((phase, totals))
        total = sum(totals)
        for index, value in enumerate(totals):
            if value > self.category_max[index]:
                self.category_max[index] = value
        if total > self.peak:
            self.peak = total
            self.peak_breakdown = list(totals)
            self.peak_where = (phase, key)
        backward = phase in ("backward", "recompute")
        for path in key:
            if total > self.module_peaks.get((path, backward), 0):
                self.module_peaks[(path, backward)] = total

    def close(self) -> None:
        """Stop following storages: no finalizer outlives the run."""
        self._open = False
        for finalizer in self._finalizers:
            finalizer.detach()
        self._finalizers.clear()
