"""Pooling (max, average, adaptive, fractional), and the backward ops that add gradients into windows."""

from __future__ import annotations

import math
from typing import Any

import torch

from .builtin import Formula, OpCost, first_tensor, register, set_formula


def _window_numel(kernel_size: Any, dims: int) -> int:
    sizes = list(kernel_size) if isinstance(kernel_size, (list, tuple)) else [kernel_size]
    if len(sizes) == 1:
        sizes = sizes * dims
    return math.prod(sizes)


def _max_pool(dims: int) -> Formula:
    def formula(x: torch.Tensor, kernel_size: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(first_tensor(out_val).numel() * _window_numel(kernel_size, dims))

    return formula


def _avg_pool(dims: int) -> Formula:
    def formula(x: torch.Tensor, kernel_size: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(first_tensor(out_val).numel() * (_window_numel(kernel_size, dims) + 1))

    return formula


def _avg_pool_backward(dims: int) -> Formula:
    def formula(grad_out: torch.Tensor, x: torch.Tensor, kernel_size: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(grad_out.numel() * (_window_numel(kernel_size, dims) + 1))

    return formula


def scatter_grad(grad_out: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    """Backward ops that add each output gradient into one input position."""
    return OpCost(grad_out.numel())


for _dims in (1, 2, 3):
    set_formula(f"max_pool{_dims}d", _max_pool(_dims))
    set_formula(f"max_pool{_dims}d_with_indices", _max_pool(_dims))
    set_formula(f"max_pool{_dims}d_with_indices_backward", scatter_grad)
    set_formula(f"avg_pool{_dims}d", _avg_pool(_dims))
    set_formula(f"avg_pool{_dims}d_backward", _avg_pool_backward(_dims))
set_formula("mkldnn_max_pool2d", _max_pool(2))
# Tensor.unfold is a view; its backward adds each window's gradient into the input's (overlapping
# windows meet): one add per gradient element
set_formula("unfold_backward", scatter_grad)
for _dims in (2, 3):  # (self, kernel_size, output_size, random_samples): one step per window element per output
    set_formula(f"fractional_max_pool{_dims}d", _max_pool(_dims))
    set_formula(f"fractional_max_pool{_dims}d_backward", scatter_grad)


def adaptive_window_elements(in_size: int, out_size: int) -> int:
    """Sum, over the output positions, of the adaptive window sizes along one dimension."""
    return sum(math.ceil((i + 1) * in_size / out_size) - (i * in_size) // out_size for i in range(out_size))


def _adaptive_pool(spatial_dims: int) -> Formula:
    def formula(x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        out = first_tensor(out_val)
        leading = math.prod(out.shape[: out.dim() - spatial_dims])
        window = math.prod(adaptive_window_elements(x.shape[-d], out.shape[-d]) for d in range(1, spatial_dims + 1))
        # one step per window element, plus the average's divide per output
        return OpCost(leading * window + out.numel())

    return formula


def _adaptive_pool_backward(grad_out: torch.Tensor, x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # every input element receives its windows' gradients (about one add each)
    return OpCost(x.numel())


for _dims in (2, 3):
    set_formula(f"_adaptive_avg_pool{_dims}d", _adaptive_pool(_dims))
    set_formula(f"adaptive_max_pool{_dims}d", _adaptive_pool(_dims))
    set_formula(f"_adaptive_avg_pool{_dims}d_backward", _adaptive_pool_backward)
    set_formula(f"adaptive_max_pool{_dims}d_backward", scatter_grad)


@register("col2im")
def col2im(columns: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # fold: every column element added into its image position
    return OpCost(columns.numel())
