"""TensorIterator's order of dimensions, which lays out elementwise outputs and splits reductions; dense layouts."""

from __future__ import annotations

from collections.abc import Callable

import torch


def reorder_dimensions(ndim: int, should_swap: Callable[[int, int], int]) -> list[int]:
    """TensorIterator's order of ``ndim`` dimensions, fastest first (aten/src/ATen/TensorIterator.cpp,
    ``reorder_dimensions``): from last to first, then an insertion sort by ``should_swap(a, b)`` (1: ``a``
    goes after ``b``, -1: before, 0: no opinion, which leaves them and looks further)."""
    order = list(range(ndim - 1, -1, -1))
    for i in range(1, ndim):
        moving = i
        for j in range(i - 1, -1, -1):
            comparison = should_swap(order[j], order[moving])
            if comparison > 0:
                order[j], order[moving] = order[moving], order[j]
                moving = j
            elif comparison < 0:
                break
    return order


def non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill its storage span exactly once, in some order of its dimensions."""
    expected = 1
    for stride, size in sorted((stride, size) for size, stride in zip(t.shape, t.stride()) if size != 1):
        if stride != expected:
            return False
        expected *= size
    return True
