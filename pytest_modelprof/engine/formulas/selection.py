"""Sorting, selection and searching: one FLOP per comparison."""

from __future__ import annotations

from typing import Any

import torch

from .builtin import OpCost, ceil_log2, first_tensor, register

# One FLOP per comparison (or, for histc, per arithmetic step), as for max and argmax:
# sort compares n * ceil(log2 n) times per sorted row, topk n * ceil(log2 k) (a heap of k),
# a k-th value or median n (a selection), histc 3 per element (shift, scale, range test),
# bincount 1 per element (the count's add), nonzero 1 per element.


def _rows_and_length(x: torch.Tensor, dim: int) -> tuple[int, int]:
    if x.dim() == 0:
        return 1, 1
    n = x.shape[dim]
    return (x.numel() // n if n else 0), n


@register("sort")
def sort(x: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    # sort(self, dim=-1, descending=False); sort.stable(self, *, stable, dim=-1, descending=False)
    dim = kwargs.get("dim", args[0] if args and isinstance(args[0], int) and not isinstance(args[0], bool) else -1)
    rows, n = _rows_and_length(x, dim)
    return rows * n * ceil_log2(n) if n > 1 else 0


@register("topk")
def topk(x: torch.Tensor, k: int, dim: int = -1, *_: Any, out_val: Any = None, **kwargs: Any) -> int:
    rows, n = _rows_and_length(x, kwargs.get("dim", dim))
    return rows * n * ceil_log2(k)


@register("kthvalue", "median", "nanmedian")
def selection(x: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    return x.numel()


@register("histc")
def histc(x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> int:
    return 3 * x.numel()


@register("bincount")
def bincount(x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> int:
    return x.numel()


@register("nonzero", "nonzero_static", "argwhere")
def nonzero(x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> int:
    return x.numel()


@register("_unique2", "unique_dim", "unique_consecutive")
def unique(x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> int:
    # sorted first (comparisons as sort's), then each element compared with its neighbour
    n = x.numel()
    return n * ceil_log2(n) + n if n > 1 else 0


# searchsorted, bucketize: a binary search of each value over the sorted boundaries
@register("searchsorted")
def searchsorted(sorted_sequence: torch.Tensor, values: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(first_tensor(out_val).numel() * ceil_log2(sorted_sequence.shape[-1] + 1))


@register("bucketize")
def bucketize(values: Any, boundaries: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(first_tensor(out_val).numel() * ceil_log2(boundaries.shape[-1] + 1))
