"""Memory of a real training loop, iteration by iteration: what it is made of, and whether it grows.

Four lines in a loop::

    monitor = MemoryMonitor(model, optimizer, print_period=50, csv_dir="memory")
    for epoch in range(epochs):
        for x, y in loader:
            loss = criterion(model(x), y); loss.backward(); optimizer.step(); optimizer.zero_grad()
            monitor.record()
        monitor.epoch_end()
    monitor.close()

What each recorded iteration holds (bytes; storages counted once, so views and tied
weights are not counted twice):

- ``weights`` and ``gradients``: the parameters and their ``.grad`` at the record, in total
  and per parameter (:meth:`MemoryMonitor.parameters`); ``optimizer_state``: the tensors
  in ``optimizer.state``;
- ``activations_peak``: the most bytes the model's forward passes of the iteration held
  saved for backward at once (feature maps; parameters, buffers and the model's inputs
  are not activations), seen by a saved-tensors hook around the model's forward;
  ``activations_alive``: those still alive at the record. A clean loop frees them all in
  the backward pass, so anything here outlived its iteration: a loss or metric
  accumulated with grad enabled whose backward never runs (its graph, and everything
  the graph saved, stays alive), outputs of a forward pass under grad mode kept in a list;
- ``intermediate_gradients_peak`` (in printed iterations only: it needs tensor hooks):
  the most bytes of gradients of module outputs alive at once in the backward pass, as
  seen when each is computed;
- on CUDA, the caching allocator's current and peak allocated and reserved bytes since
  the previous record.

Between printed iterations the monitor costs two module hooks, a saved-tensors hook
call and a weak reference per saved storage, and the record itself: a few percent of
a small CNN's iteration on the CPU at most (``benchmarks/monitor_overhead.py``).

Growth: at each :meth:`~MemoryMonitor.epoch_end`, a category whose bytes at the end of
the epoch exceed both those at the end of the previous epoch and those at the epoch's
first record is flagged (a :class:`MemoryGrowthWarning`, :attr:`MemoryMonitor.growth`).
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import warnings
import weakref
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from .._files import replace_atomically
from ..results import Profile
from .assemble import model_figures

CATEGORIES = ("weights", "gradients", "optimizer_state", "activations_peak", "activations_alive", "intermediate_gradients_peak")
GROWING = ("gradients", "optimizer_state", "activations_alive", "cuda_allocated")  # what a leak makes grow


class MemoryGrowthWarning(UserWarning):
    """Memory grew from epoch to epoch: something is kept across iterations."""


@dataclass
class IterationMemory:
    """One recorded iteration; bytes, ``None`` where not measured (CUDA figures on a CPU)."""

    epoch: int
    iteration: int  # counted over the whole run, from 1
    weights: int
    gradients: int
    optimizer_state: int
    activations_peak: int
    activations_alive: int
    intermediate_gradients_peak: int | None = None
    cuda_allocated: int | None = None
    cuda_max_allocated: int | None = None
    cuda_reserved: int | None = None
    cuda_max_reserved: int | None = None


COLUMNS = tuple(f.name for f in fields(IterationMemory))


@dataclass
class Growth:
    """A category that grew over an epoch and since the previous one."""

    category: str
    epoch: int
    previous_epoch_end: int
    epoch_start: int
    epoch_end: int

    def message(self) -> str:
        return (
            f"{self.category} grew in epoch {self.epoch}: {self.epoch_start:,} B at its first record, {self.epoch_end:,} B at its end "
            f"({self.previous_epoch_end:,} B at the end of epoch {self.epoch - 1})"
        )


@dataclass
class _Live:
    """Storages followed until they are freed: bytes now and at most."""

    now: int = 0
    peak: int = 0
    sizes: dict[int, int] = field(default_factory=dict)
    finalizers: list[Any] = field(default_factory=list)

    def add(self, storage: Any, address: int) -> None:
        size = storage.nbytes()
        self.sizes[address] = size
        self.now += size
        self.peak = max(self.peak, self.now)
        self.finalizers.append(weakref.finalize(storage, self._free, address))

    def _free(self, address: int) -> None:
        self.now -= self.sizes.pop(address, 0)

    def close(self) -> None:
        for finalizer in self.finalizers:
            finalizer.detach()
        self.finalizers.clear()


class MemoryMonitor:
    """Records the memory of a training loop at every :meth:`record` (see the module docs).

    ``print_period=N`` prints a report every N recorded iterations to ``stream`` (standard
    output by default; 0: never), with the weight and gradient bytes of the
    ``report_parameters`` largest parameters (-1: every parameter; 0: none). ``csv_dir`` receives ``epoch_<n>.csv`` at each
    :meth:`epoch_end` (one row per recorded iteration, columns :data:`COLUMNS`) and
    ``memory.json`` (everything so far). Use it as a context manager, or call :meth:`close`:
    that removes its hooks.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        print_period: int = 0,
        csv_dir: str | os.PathLike[str] | None = None,
        stream: TextIO | None = None,
        report_parameters: int = 3,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"MemoryMonitor expects a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not isinstance(print_period, int) or print_period < 0:
            raise ValueError(f"print_period must be a whole number of iterations (0: never print), got {print_period!r}")
        self.model = model
        self.optimizer = optimizer
        self.print_period = print_period
        self.csv_dir = Path(csv_dir) if csv_dir is not None else None
        self.stream = stream
        self.report_parameters = report_parameters
        self.rows: list[IterationMemory] = []
        self.growth: list[Growth] = []
        self.epoch = 1
        self.iteration = 0
        self._epoch_start = 0  # index in rows of the epoch's first record
        self._epoch_ends: list[IterationMemory] = []
        device = next((t.device for t in model.parameters()), torch.device("cpu"))
        self.cuda = device.type == "cuda"
        self.device = device
        self._resident = self._resident_storages()
        self._saved: dict[int, tuple[weakref.ref[Any], int]] = {}  # storage address -> (its weak reference, bytes)
        self._saved_peak = 0
        self._grads = _Live()
        self._inputs: set[int] = set()
        self._contexts: list[Any] = []
        self._output_hooks: list[Any] = []
        self._handles = [
            model.register_forward_pre_hook(self._forward_starts),
            model.register_forward_hook(self._forward_ends, always_call=True),
        ]
        self._sample_next = print_period == 1
        if self._sample_next:
            self._watch_outputs()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)

    # hooks ----------------------------------------------------------------

    def _resident_storages(self) -> set[int]:
        tensors = [*self.model.parameters(), *self.model.buffers()]
        self._resident_ids = {id(t) for t in tensors}
        return {t.untyped_storage()._cdata for t in tensors}

    def _forward_starts(self, module: nn.Module, args: Any) -> None:
        if not torch.is_grad_enabled():
            self._contexts.append(None)
            return
        self._inputs = {t.untyped_storage()._cdata for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)}
        context = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        context.__enter__()
        self._contexts.append(context)

    def _forward_ends(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._contexts:
            context = self._contexts.pop()
            if context is not None:
                context.__exit__(None, None, None)
                # saved tensors are freed by the backward pass, not during a forward one:
                # what is saved at the end of a forward is the most held until then
                self._saved_peak = max(self._saved_peak, self._saved_alive())

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) in self._resident_ids:  # a parameter saved by its layer: weights, not activations
            return tensor
        storage = tensor.untyped_storage()
        address = storage._cdata
        known = self._saved.get(address)
        # an address seen before may be a freed storage's, reused by a new one
        if (known is None or known[0]() is not storage) and address not in self._resident and address not in self._inputs:
            self._saved[address] = (weakref.ref(storage), storage.nbytes())
        return tensor

    def _saved_alive(self) -> int:
        """Bytes of saved storages still alive (dead ones are forgotten): a weak reference
        per storage, read when needed, costs the loop less than a callback on every free."""
        dead = [address for address, (ref, _) in self._saved.items() if ref() is None]
        for address in dead:
            del self._saved[address]
        return sum(size for _, size in self._saved.values())

    def _watch_outputs(self) -> None:
        """Gradient hooks on every module output of the next iteration (a printed one)."""

        def hook_outputs(module: nn.Module, args: Any, output: Any) -> None:
            for tensor in tree_flatten(output)[0]:
                if isinstance(tensor, torch.Tensor) and tensor.requires_grad and tensor.grad_fn is not None:
                    tensor.register_hook(self._gradient_seen)  # type: ignore[no-untyped-call]

        self._output_hooks = [m.register_forward_hook(hook_outputs) for m in self.model.modules()]

    def _gradient_seen(self, grad: torch.Tensor) -> None:
        storage = grad.untyped_storage()
        address = storage._cdata
        if address not in self._grads.sizes:
            self._grads.add(storage, address)

    # the loop -------------------------------------------------------------------

    def record(self) -> IterationMemory:
        """Call after each iteration (after the optimizer step): records what memory holds."""
        self._check_open()
        self.iteration += 1
        sampled = bool(self._output_hooks)
        for handle in self._output_hooks:
            handle.remove()
        self._output_hooks = []
        row = IterationMemory(
            epoch=self.epoch,
            iteration=self.iteration,
            weights=_bytes(self.model.parameters()),
            gradients=_bytes(p.grad for p in self.model.parameters() if p.grad is not None),
            optimizer_state=self._optimizer_bytes(),
            activations_peak=self._saved_peak,
            activations_alive=self._saved_alive(),
            intermediate_gradients_peak=self._grads.peak if sampled else None,
        )
        if self.cuda:
            row.cuda_allocated = torch.cuda.memory_allocated(self.device)
            row.cuda_max_allocated = torch.cuda.max_memory_allocated(self.device)
            row.cuda_reserved = torch.cuda.memory_reserved(self.device)
            row.cuda_max_reserved = torch.cuda.max_memory_reserved(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self.rows.append(row)
        self._saved_peak = row.activations_alive
        self._grads.close()
        self._grads = _Live()
        if self.print_period and self.iteration % self.print_period == 0:
            print(self.format_row(row), file=self.stream or sys.stdout)
        if self.print_period and (self.iteration + 1) % self.print_period == 0:
            self._resident = self._resident_storages()
            self._watch_outputs()
        return row

    def epoch_end(self) -> list[Growth]:
        """Call after each epoch: writes its CSV (with ``csv_dir``) and flags memory that grew."""
        self._check_open()
        rows = self.rows[self._epoch_start :]
        found: list[Growth] = []
        if rows and self._epoch_ends:
            previous, first, last = self._epoch_ends[-1], rows[0], rows[-1]
            for category in GROWING:
                before, start, end = getattr(previous, category), getattr(first, category), getattr(last, category)
                if end is not None and before is not None and start is not None and end > before and end > start:
                    found.append(Growth(category, self.epoch, before, start, end))
        for growth in found:
            warnings.warn(growth.message(), MemoryGrowthWarning, stacklevel=2)
            print(f"[memory] {growth.message()}", file=self.stream or sys.stdout)
        self.growth.extend(found)
        if rows:
            self._epoch_ends.append(rows[-1])
        if self.csv_dir is not None:
            self.csv_dir.mkdir(parents=True, exist_ok=True)
            replace_atomically(self.csv_dir / f"epoch_{self.epoch}.csv", _csv(rows))
            replace_atomically(self.csv_dir / "memory.json", json.dumps(self.to_dict(), indent=2) + "\n")
        self.epoch += 1
        self._epoch_start = len(self.rows)
        return found

    def close(self) -> None:
        """Remove every hook; the records stay."""
        for handle in [*self._handles, *self._output_hooks]:
            handle.remove()
        self._handles, self._output_hooks = [], []
        while self._contexts:
            context = self._contexts.pop()
            if context is not None:
                context.__exit__(None, None, None)
        self._saved.clear()
        self._grads.close()

    def __enter__(self) -> MemoryMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if not self._handles:
            raise RuntimeError("this MemoryMonitor is closed")

    def _optimizer_bytes(self) -> int:
        if self.optimizer is None:
            return 0
        return _bytes(v for state in self.optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor))

    # results ----------------------------------------------------------------------

    def parameters(self) -> list[tuple[str, int, int]]:
        """``(name, weight bytes, gradient bytes)`` of each parameter, now."""
        return [
            (name, p.untyped_storage().nbytes(), p.grad.untyped_storage().nbytes() if p.grad is not None else 0)
            for name, p in self.model.named_parameters()
        ]

    def maximum(self, category: str) -> int:
        """The most bytes ``category`` (a field of :class:`IterationMemory`) held at any record."""
        values = [getattr(row, category) for row in self.rows if getattr(row, category) is not None]
        return max(values, default=0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "columns": list(COLUMNS),
            "rows": [asdict(row) for row in self.rows],
            "parameters": [{"name": n, "weight_bytes": w, "gradient_bytes": g} for n, w, g in self.parameters()],
            "growth": [asdict(g) for g in self.growth],
        }

    def profile(self, name: str | None = None) -> Profile:
        """The loop's maxima as a :class:`Profile`, to hold against a budget.

        ``peak_activation_bytes`` is the most any iteration held saved for backward;
        ``peak_memory_bytes`` the CUDA allocator's peak on a GPU, and elsewhere the most
        weights, gradients, optimizer state and saved activations held together.
        """
        if not self.rows:
            raise RuntimeError("no iteration recorded: call record() after each iteration first")
        if self.cuda:
            peak = self.maximum("cuda_max_allocated")
        else:
            peak = max(r.weights + r.gradients + r.optimizer_state + r.activations_peak for r in self.rows)
        result = Profile(
            model=type(self.model).__name__,
            train=True,
            device=str(self.device),
            analytic=False,
            peak_activation_bytes=self.maximum("activations_peak"),
            peak_memory_bytes=peak,
            **model_figures(self.model.parameters(), self.model.buffers()),
        )
        result.name = name
        return result

    def format_row(self, row: IterationMemory) -> str:
        parts = [
            f"weights {_mb(row.weights)}",
            f"gradients {_mb(row.gradients)}",
            f"optimizer state {_mb(row.optimizer_state)}",
            f"activations peak {_mb(row.activations_peak)} (alive after the step {_mb(row.activations_alive)})",
        ]
        if row.intermediate_gradients_peak is not None:
            parts.append(f"intermediate gradients peak {_mb(row.intermediate_gradients_peak)}")
        if row.cuda_allocated is not None:
            parts.append(
                f"CUDA allocated {_mb(row.cuda_allocated)} (peak {_mb(row.cuda_max_allocated or 0)}), "
                f"reserved {_mb(row.cuda_reserved or 0)} (peak {_mb(row.cuda_max_reserved or 0)})"
            )
        if self.report_parameters:
            ranked = sorted(self.parameters(), key=lambda p: -p[1])
            shown = ranked if self.report_parameters < 0 else ranked[: self.report_parameters]
            label = "parameters" if len(shown) == len(ranked) else "largest parameters"
            parts.append(f"{label} " + ", ".join(f"{n} {_mb(w)} (grad {_mb(g)})" for n, w, g in shown))
        return f"[memory] epoch {row.epoch} iteration {row.iteration}: " + "; ".join(parts)


def _bytes(tensors: Any) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen.setdefault(storage._cdata, storage.nbytes())
    return sum(seen.values())


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _mb(value: int) -> str:
    return f"{value / 1e6:.2f} MB"


def _csv(rows: list[IterationMemory]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow(["" if v is None else v for v in (getattr(row, c) for c in COLUMNS)])
    return buffer.getvalue()
