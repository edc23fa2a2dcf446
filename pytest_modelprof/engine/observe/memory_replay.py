"""What the memory meter records of a block's call under ``no_grad``, and how it adds it again (see
:mod:`.blocks`; the meter is :class:`~..meters.memory.MemoryMeter`).

Without autograd a block's memory is its own: its ops allocate storages and free them again, and what
is left at its end is its outputs'. Nothing it holds outlives it for a backward pass, and nothing the
step held before it is freed or changes category while it runs (its arguments are held by its caller).
So each moment of the call is the moment before it plus what the call has added so far. A recording
keeps each sample as that difference per category, each op row's calls and bytes, the bytes allocated,
and the storages left at the end (the outputs'). A replay adds the differences to the meter's totals at
the replayed call's start, samples them under the replayed call's module stacks, and follows the replay's
outputs' storages in place of the recorded ones. A call whose recording breaks these rules (it freed or
changed a storage it did not allocate, or left one that is not an output's) is not replayed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .alike import storage_of

if TYPE_CHECKING:
    from .stream import Place

MemoryMeter = Any  # (memory.py imports this module: the meter is not named here)


class Capture:
    """A call's memory, as it runs (see the module's notes)."""

    def __init__(self, meter: MemoryMeter) -> None:
        self.base = list(meter.totals)
        self.allocated = meter.allocated
        self.before = {address: tuple(entry) for address, entry in meter.live.items()}
        self.samples: list[tuple[Any, Any, tuple[int, ...]]] = []  # (phase, stack, totals less the base)
        self.rows: dict[tuple[Any, Any, str], list[int]] = {}  # (phase, stack, op) -> [calls, bytes]

    def sample(self, phase: Any, key: Any, totals: tuple[int, ...]) -> None:
        self.samples.append((phase, key, tuple(t - b for t, b in zip(totals, self.base))))

    def row(self, where: tuple[Any, Any, str], nbytes: int) -> None:
        _add(self.rows, where, 1, nbytes)

    def done(self, meter: MemoryMeter) -> Recording | None:
        """The recording, or None where the call's memory is not its own."""
        if any(meter.live.get(address) != list(entry) for address, entry in self.before.items()):
            return None  # a storage the step held before the call was freed, resized or changed category
        left = {address: tuple(entry) for address, entry in meter.live.items() if address not in self.before}
        final = tuple(t - b for t, b in zip(meter.totals, self.base))
        return Recording(self.samples, self.rows, meter.allocated - self.allocated, final, left)


class Recording:
    def __init__(self, samples: list[Any], rows: dict[Any, list[int]], allocated: int, final: tuple[int, ...], left: dict[int, Any]):
        self.samples, self.rows, self.allocated, self.final = samples, rows, allocated, final
        self.left = left  # the storages left at the call's end (its outputs'): address -> (bytes, category)
        self.outputs: list[tuple[int, Any]] = []  # each output tensor's storage, as left (see closes)

    def closes(self, outputs: list[torch.Tensor]) -> bool:
        """Whether what the call left is its outputs' storages, one each; if so, kept in their order."""
        addresses = [storage_of(t) for t in outputs]
        if set(addresses) != set(self.left) or len(set(addresses)) != len(addresses):
            return False
        self.outputs = [(address, self.left[address]) for address in addresses]
        return True


def replay(meter: MemoryMeter, recording: Recording, place: Place) -> None:
    base = list(meter.totals)
    for phase, key, delta in recording.samples:
        meter.totals[:] = [b + d for b, d in zip(base, delta)]
        meter.sample(*place(phase, key))
    for (phase, key, name), (calls, nbytes) in recording.rows.items():
        _add(meter.op_bytes, (*place(phase, key), name), calls, nbytes)
    meter.allocated += recording.allocated
    meter.totals[:] = [b + d for b, d in zip(base, recording.final)]


def follow(meter: MemoryMeter, recording: Recording, outputs: list[torch.Tensor]) -> None:
    """The replay's outputs' storages, followed as the recorded call's were (already counted in the totals)."""
    for tensor, (_, (size, category)) in zip(outputs, recording.outputs):
        storage = tensor.untyped_storage()
        meter.live[storage._cdata] = [size, category]
        meter._watch(storage, storage._cdata)


def _add(rows: dict[Any, list[int]], where: Any, calls: int, nbytes: int) -> None:
    """An op row's [calls, bytes allocated], added to (the meter's ``op_bytes`` rows, or a recording's)."""
    row = rows.setdefault(where, [0, 0])
    row[0] += calls
    row[1] += nbytes
