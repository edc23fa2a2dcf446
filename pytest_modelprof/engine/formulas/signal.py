"""FFTs and pairwise distances."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from .builtin import Formula, OpCost, first_tensor, register, set_formula


# FFTs: 5 N log2 N real FLOPs per complex transform of N points (radix-2 Cooley-Tukey, the
# convention of FFTW's benchmarks), N the product of the transformed dims; half of that for a
# transform of real input or to real output; a normalisation scales each output element once
# (2 FLOPs for a complex one).
def _fft(kind: str) -> Formula:
    def formula(x: torch.Tensor, dim: Sequence[int], normalization: int, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
        # the transform's length: the complex input's for c2c, the real side's for r2c and c2r
        real_side = x if kind == "r2c" else first_tensor(out_val)
        points = math.prod(real_side.shape[d] for d in dim) if dim else 1
        if points == 0:
            return OpCost(0)
        transforms = real_side.numel() // points
        per_transform = 5 * points * math.log2(points) * (1 if kind == "c2c" else 0.5) if points > 1 else 0
        out = first_tensor(out_val)
        scale = out.numel() * (2 if out.is_complex() else 1) if normalization else 0
        return OpCost(round(transforms * per_transform) + scale)

    return formula


for _kind in ("r2c", "c2c", "c2r"):
    set_formula(f"_fft_{_kind}", _fft(_kind))


# cdist: per pair of rows and per feature, a difference, a power (or absolute value) and a sum;
# then a root per pair (none for p of 0, 1 and infinity). Its backward (one call per input):
# per pair and feature, the difference, its power, a scale by the pair's gradient over its
# distance, and a sum.
@register("_cdist_forward")
def cdist(x1: torch.Tensor, x2: torch.Tensor, p: float, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    pairs = first_tensor(out_val).numel()
    root = pairs if p not in (0.0, 1.0, math.inf) else 0
    return OpCost(3 * pairs * x1.shape[-1] + root)


@register("_cdist_backward")
def cdist_backward(grad: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(4 * grad.numel() * x1.shape[-1])


# cdist's matrix-product form for p = 2 (torch.cdist's compute_mode, by default past 25 rows a side):
# x1 (P x M) and x2 (R x M) padded with their squared norms (a square and an add per element) and
# ones, x1 scaled by -2, one product of M + 2 terms per pair, then a clamp and a root per pair
# (aten/src/ATen/native/Distance.cpp, _euclidean_dist).
@register("_euclidean_dist")
def euclidean_dist(x1: torch.Tensor, x2: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    pairs = first_tensor(out_val).numel()
    macs = pairs * (x1.shape[-1] + 2)
    return OpCost(2 * macs + 3 * x1.numel() + 2 * x2.numel() + 2 * pairs, macs)


@register("_pdist_forward")
def pdist(x: torch.Tensor, p: float = 2.0, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # as cdist: each of the n (n - 1) / 2 pairs of rows, 3 per feature and a root
    pairs = first_tensor(out_val).numel()
    root = pairs if p not in (0.0, 1.0, math.inf) else 0
    return OpCost(3 * pairs * x.shape[-1] + root)


@register("_pdist_backward")
def pdist_backward(grad: torch.Tensor, x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(4 * grad.numel() * x.shape[-1])
