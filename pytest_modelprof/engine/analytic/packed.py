"""Packed sequences on fake tensors: the padding back of one, run op for op in Python.

``torch._VF._pad_packed_sequence`` is a composite that reads its batch sizes in C++, where a fake tensor
has none; :class:`~.values.KnownValues` sets :func:`pad_packed` in its place for an analytic run. The
batch sizes are a CPU tensor the run worked out (the packing is sized from the lengths' known value),
read here as numbers.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensor
from torch.utils._python_dispatch import _disable_current_modes

aten = torch.ops.aten


def pad_packed(
    data: torch.Tensor, batch_sizes: torch.Tensor, batch_first: bool, padding_value: float, total_length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch._VF._pad_packed_sequence`` (aten/src/ATen/native/PackedSequence.cpp) in Python, op for op:
    a padded tensor filled with ``padding_value``, each run of steps with the same batch size copied
    into it, and each sequence's length (a CPU tensor)."""
    if isinstance(batch_sizes, FakeTensor):
        raise DynamicOutputShapeException(aten._pad_packed_sequence.default)
    sizes = [int(n) for n in batch_sizes.tolist()]
    steps, batch = len(sizes), sizes[0]
    if 0 < total_length < steps:
        raise ValueError(f"Expected total_length to be at least the length of the longest sequence {steps}, got {total_length}")
    features = tuple(data.shape[1:])
    output = data.new_full((max(total_length, steps), batch, *features), padding_value)
    offset, previous, start = 0, batch, 0
    for step in range(steps + 1):
        size = sizes[step] if step != steps else 0
        if size != previous:
            rows = previous * (step - start)
            output[start:step, :previous].copy_(data[offset : offset + rows].view(step - start, previous, *features))
            offset, start = offset + rows, step
        previous = size
    with _disable_current_modes():
        lengths = torch.tensor([sum(1 for n in sizes if n > b) for b in range(batch)], dtype=torch.int64)
    return (output.transpose(0, 1) if batch_first else output), lengths
