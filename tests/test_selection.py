"""Sorting and selection, counted as comparisons (the convention of docs/flops.md), by hand."""

import math

import pytest
import torch

from models import Fn
from pytest_modelprof import profile

ROWS, N = 8, 64


@pytest.mark.parametrize(
    ("fn", "op", "expected"),
    [
        (lambda x: torch.sort(x, dim=-1).values, "aten.sort", ROWS * N * math.ceil(math.log2(N))),  # n log2 n per row
        (lambda x: torch.sort(x, dim=0, stable=True).values, "aten.sort", N * ROWS * math.ceil(math.log2(ROWS))),
        (lambda x: torch.argsort(x, dim=-1), "aten.sort", ROWS * N * math.ceil(math.log2(N))),
        (lambda x: torch.topk(x, 5).values, "aten.topk", ROWS * N * math.ceil(math.log2(5))),  # a heap of k
        (lambda x: torch.topk(x, 1).values, "aten.topk", ROWS * N),  # a running maximum
        (lambda x: torch.kthvalue(x, 3).values, "aten.kthvalue", ROWS * N),  # a selection
        (lambda x: torch.median(x, dim=-1).values, "aten.median", ROWS * N),
        (lambda x: torch.histc(x, bins=10), "aten.histc", 3 * ROWS * N),  # shift, scale, range test
        (lambda x: torch.nonzero(x), "aten.nonzero", ROWS * N),  # one test per element
    ],
)
def test_selection_by_hand(fn, op, expected):
    result = profile(Fn(fn), torch.randn(ROWS, N))
    assert result.uncounted == {}
    assert result.op(op).flops == expected
