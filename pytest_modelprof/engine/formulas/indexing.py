"""Embedding bags, padding's and embedding's backward, and indexed adds."""

from __future__ import annotations

from typing import Any

import torch

from .builtin import OpCost, from_macs, register, set_formula
from .pool import scatter_grad

set_formula("embedding_dense_backward", scatter_grad)
for _name in ("reflection_pad1d", "reflection_pad2d", "reflection_pad3d", "replication_pad1d", "replication_pad2d", "replication_pad3d"):
    set_formula(_name + "_backward", scatter_grad)


@register("_embedding_bag", "_embedding_bag_forward_only")
def embedding_bag(
    weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any
) -> OpCost:
    per_sample_weights = kwargs.get("per_sample_weights", args[3] if len(args) > 3 else None)
    gathered = indices.numel() * weight.shape[1]
    return OpCost(gathered * (1 + int(per_sample_weights is not None)))


@register("_embedding_bag_backward", "_embedding_bag_dense_backward")
def embedding_bag_backward(grad: torch.Tensor, indices: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # every looked-up row receives its bag's gradient: one add per gathered element
    return OpCost(indices.numel() * grad.shape[-1])


@register("_embedding_bag_per_sample_weights_backward")
def embedding_bag_weights_backward(
    grad: torch.Tensor, weight: torch.Tensor, indices: torch.Tensor, *_: Any, out_val: Any = None, **__: Any
) -> OpCost:
    # a dot product of each gathered row with its bag's gradient
    return from_macs(indices.numel() * weight.shape[1])


@register("scatter_reduce")
def scatter_reduce(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str, *_: Any, **__: Any) -> OpCost:
    # each source element combined into its output position; the mean divides each output once
    return OpCost(src.numel() + (x.numel() if reduce == "mean" else 0))


@register("index_add", "index_add_", "scatter_add", "scatter_add_")
def indexed_add(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *, out_val: Any = None, alpha: Any = 1) -> OpCost:
    # each element of source (index_add; scatter_add's src) is added into the output: 1 add, and
    # a multiply where index_add scales it (alpha != 1)
    return OpCost(source.numel() * (1 + int(alpha != 1)))
