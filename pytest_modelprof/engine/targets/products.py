"""The matrix products behind an op (:func:`gemms_of`), and how long a GPU takes over one (:func:`product_seconds`).

A library's product (cuBLAS, cuDNN's implicit products) splits its output into tiles, and each SM computes
one tile at a time. The library picks, of the tile sizes its kernels come in (:data:`TENSOR_TILES`,
:data:`SIMT_TILES`: their names say them, ``sm90_xmma_gemm_..._128x256``, ``ampere_sgemm_128x64_tn``), the
one that finishes first; where too few tiles would fill the SMs and the reduction is long, it also splits the
reduction of a single product (split-K: the splits' partial sums are added after, a pass not priced here). A
batched product's kernels never do: in NeuSight's kernel data (pytest_modelprof/data/kernel-data) every one of
the 87,248 batched products timed on five GPUs ran one block per output tile and batch entry (its launch grid
says so), however few tiles and however long the reduction (float32 on CUDA cores; taken for tensor cores too,
where no record has a batched product with a reduction long enough to tell). What that choice costs:

- **waves**: the tiles run in waves of one per SM; the last wave's idle SMs, and the part of each edge tile
  past the output's edge, are work the GPU does for nothing (wave and tile quantisation);
- **tile efficiency**: a tile of ``tm x tn`` reads ``tm + tn`` operand rows and columns per ``tm * tn``
  products, so a smaller tile is further from the math's peak: ``1 / (1 + tile_cost * (1/tm + 1/tn))``,
  relative to the largest tile's (the kind's efficiency is that of a product in the largest tiles);
- **reduction length**: a tile's prologue and epilogue (loading the pipeline, writing the output) weigh on a
  short reduction: ``k / (k + k_half)``.

Each is the same function of the product's shape and the GPU's SM count on every GPU; the constants
(``tile_cost``, ``gemm_half``, the efficiency at full size) are one calibration's, one set on tensor cores
and one on CUDA cores (a tensor core's deeper pipeline weighs more on a short reduction). Attention's and
recurrent layers' products (FlashAttention's query tiles, cuDNN's steps) are priced the same way, without
a split of the reduction: their kernels schedule their own work.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import torch

from .cudnn import conv_memory_format, uses_cudnn

if TYPE_CHECKING:
    from .gpus import Calibration


class Gemm(NamedTuple):
    """One matrix product of an op, ``batch`` independent ``(m x k) @ (k x n)`` (the groups of a grouped
    convolution count in ``m``), and its share of the op's FLOPs."""

    m: int
    n: int
    k: int
    share: float = 1.0
    batch: int = 1
    layout: str = "nn"  # cuBLAS's letters for its operands, the second's first: "tn" for ``x @ w.t()`` (see _letter)


# output tiles (rows, columns) of the products' kernels, on tensor cores and on CUDA cores
TENSOR_TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
SIMT_TILES = ((128, 128), (128, 64), (64, 128), (64, 64), (128, 32), (32, 128), (64, 32), (32, 64), (32, 32))
SPLIT_LENGTH = 256  # the shortest reduction a split of a product's reduction is given
BATCHED_TILE = 64 * 64  # a batched product's kernels (a product per grid slice) have tiles of this many outputs or more


def product_seconds(
    gemm: Gemm,
    flops: float,
    peak: float,
    sms: int,
    calibration: Calibration,
    tensor_cores: bool,
    split: bool = True,
    offered: tuple[tuple[int, int], ...] = (),
    half: str = "",
) -> float:
    """The seconds ``sms`` SMs of math peak ``peak`` (FLOP/s at full efficiency) take over ``flops`` of the
    product ``gemm``: of its tile sizes and splits of the reduction, the fastest (see the module's notes);
    ``split``: whether its kernels may split the reduction (a library's may; attention's and recurrent
    kernels, which schedule their own work, do not); ``offered``: the tiles its kernels come in, where the
    GPU's library offers fewer than all (:func:`.gpus.simt_batched_tiles`); ``half``: the calibration's
    ``gemm_half`` entry for its reduction (:func:`.cost.gemm_half_key`; by default, the unit's)."""
    stock = TENSOR_TILES if tensor_cores else SIMT_TILES
    tiles = offered or stock
    useful = gemm.batch * gemm.m * gemm.n
    if useful <= 0 or gemm.k <= 0 or flops <= 0:
        return 0.0
    unit = "tensor" if tensor_cores else "simt"
    k_half = calibration.gemm_half.get(half or ("k" if tensor_cores else "k_simt"), 0.0)
    cost = calibration.tile_cost.get(unit, 0.0)
    largest = 1 + cost * (1 / stock[0][0] + 1 / stock[0][1])  # (the efficiency is the largest tile's)
    best = math.inf
    for rows, columns in tiles:
        if gemm.batch > 1 and rows * columns < BATCHED_TILE:
            continue
        count = gemm.batch * math.ceil(gemm.m / rows) * math.ceil(gemm.n / columns)
        splits = 1
        if split and gemm.batch == 1 and count < sms and gemm.k >= 2 * SPLIT_LENGTH:
            splits = max(1, min(gemm.k // SPLIT_LENGTH, sms // count))
        length = math.ceil(gemm.k / splits)
        waves = math.ceil(count * splits / sms)
        used = useful * gemm.k / (waves * sms * rows * columns * length)  # of the SMs' tile-time, useful
        efficiency = length / (length + k_half) * largest / (1 + cost * (1 / rows + 1 / columns))
        best = min(best, flops / (peak * efficiency * used))
    return best


def as_tensor(value: object) -> torch.Tensor | None:
    return value if isinstance(value, torch.Tensor) else None


def argument(args: tuple[object, ...], index: int, default: object = None) -> object:
    return args[index] if len(args) > index else default


# where convolution ops keep their groups
_CONV_GROUPS = {"aten.convolution": 8, "aten._convolution": 8, "aten.cudnn_convolution": 5, "aten.convolution_backward": 9}
NARROW_CHANNELS = 8  # a convolution with fewer input channels per group runs off the tensor cores


def conv_channels(name: str, args: tuple[object, ...], weight: torch.Tensor) -> tuple[int, int, int]:
    """A convolution's input and output channels per group, and its groups (a transposed
    convolution's weight holds input channels first)."""
    groups = argument(args, _CONV_GROUPS.get(name, 8), 1)
    groups = groups if isinstance(groups, int) and groups > 0 else 1
    transposed = name != "aten.cudnn_convolution" and argument(args, 7 if name == "aten.convolution_backward" else 6) is True
    if transposed:
        return weight.shape[0] // groups, weight.shape[1], groups
    return weight.shape[1], weight.shape[0] // groups, groups


_QUANTIZED_PRODUCTS = frozenset({"_int_mm", "_scaled_mm", "_scaled_mm_v2", "_weight_int4pack_mm", "_weight_int4pack_mm_for_cpu"})


def gemms_of(name: str, args: tuple[object, ...], out: object) -> tuple[Gemm, ...]:
    """The matrix products behind an op on tensor cores, by shape (empty where its shape is not known
    to this function: the kind's efficiency alone applies). A convolution is an implicit product
    (rows: output pixels, columns: output channels, reduction: input channels x kernel), its
    backward one for the input's gradient and one for the weight's; attention a product per
    head (rows: queries, columns: the head size, reduction: the keys, which each block of queries
    runs through); a recurrent layer its input projection over all steps and one recurrent product
    per step (rows: the batch)."""
    base = name.removeprefix("aten.").rstrip("_")
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if base in ("mm", "addmm", "_addmm_activation", "bmm", "baddbmm") and len(tensors) >= 2:
        a, b = tensors[-2], tensors[-1]
        if a.dim() < 2 or b.dim() < 2:
            return ()
        batch = a.shape[0] if a.dim() == 3 else 1
        return (Gemm(a.shape[-2], b.shape[-1], a.shape[-1], 1.0, batch, _letter(b) + _letter(a)),)
    if base in ("convolution", "_convolution", "cudnn_convolution", "convolution_backward"):
        return _conv_gemms(name, args, out)
    if base in _QUANTIZED_PRODUCTS:
        # the first operand and the output give the shape: the weight may be packed, the tensors after it are scales
        operand, y = as_tensor(argument(args, 0)), as_tensor(out)
        if operand is None or y is None or y.dim() != 2 or y.shape[0] == 0:
            return ()
        return (Gemm(y.shape[0], y.shape[1], operand.numel() // y.shape[0]),)
    if "attention" in base and len(tensors) >= 3:
        q, k = (tensors[1], tensors[2]) if base.endswith("backward") else (tensors[0], tensors[1])
        if q.dim() != 4 or k.dim() != 4 or not base.startswith("_scaled_dot_product"):
            return ()
        batch_heads = q.shape[0] * q.shape[1]
        # each block of queries runs through every key, accumulating its output (head size wide): the keys
        # are its reduction, whose length pays for the block's prologue and epilogue
        return (Gemm(batch_heads * q.shape[2], q.shape[3], k.shape[2]),)
    if base in ("_cudnn_rnn", "_cudnn_rnn_backward"):
        return _rnn_gemms(name, args)
    return ()


def _letter(t: torch.Tensor) -> str:
    """cuBLAS's letter for a row-major operand (it works in column-major order): ``t`` for one stored column by
    column (a transposed view, as ``w.t()``), ``n`` for one stored row by row (or copied to be)."""
    return "t" if t.stride(-1) != 1 and t.stride(-2) == 1 else "n"


def _conv_gemms(name: str, args: tuple[object, ...], out: object) -> tuple[Gemm, ...]:
    backward = name == "aten.convolution_backward"
    if backward:
        y, x, weight = (as_tensor(argument(args, i)) for i in (0, 1, 2))
    else:
        x, weight = as_tensor(argument(args, 0)), as_tensor(argument(args, 1))
        y = as_tensor(out)
    if x is None or weight is None or y is None or x.dim() < 3 or y.dim() < 3:
        return ()
    in_per_group, out_per_group, groups = conv_channels(name, args, weight)
    kernel = math.prod(weight.shape[2:])
    pixels_out = y.shape[0] * math.prod(y.shape[2:])
    pixels_in = x.shape[0] * math.prod(x.shape[2:])
    if not backward:
        return (Gemm(pixels_out * groups, out_per_group, in_per_group * kernel),)
    mask = argument(args, 10)
    mask = mask if isinstance(mask, (list, tuple)) and len(mask) > 1 else (True, True)
    parts = []
    if mask[0]:  # the input's gradient: a product over the output's gradient
        parts.append(Gemm(pixels_in * groups, in_per_group, out_per_group * kernel))
    if mask[1]:  # the weight's: reduced over every pixel of the batch
        parts.append(Gemm(out_per_group * groups, in_per_group * kernel, pixels_out))
    return tuple(Gemm(g.m, g.n, g.k, 1 / len(parts)) for g in parts)


def relayout_bytes(name: str, args: tuple[object, ...], out: object) -> int:
    """The bytes cuDNN's layout transforms around a convolution read and write, in kernels of their own: on
    tensor cores its kernels work in channels-last (NHWC), so a convolution given contiguous (NCHW) tensors
    has its input and weight transposed into it and its output back (``nchwToNhwcKernel``,
    ``nhwcToNchwKernel``), and its backward pass the output's gradient, the input and the gradients it
    computes. A pointwise convolution (1x1, stride 1, no padding) is a plain matrix product over NCHW and
    runs without them; a depthwise one in NCHW runs ATen's own kernels (:func:`.cudnn.uses_cudnn`).
    Measured on an H200 (cuDNN 9.19), of the convolutions of the held-out steps and one-layer probes (operators
    by shapes): the transforms ran around 194 of 211 that are neither pointwise nor depthwise, float32 (TF32)
    and half precision alike, and around 83 of 367 pointwise ones (those strided, and some cuDNN's heuristics
    chose so). The cost model prices
    them only where the convolution runs on tensor cores (:func:`.cost.kernel_seconds`)."""
    backward = name == "aten.convolution_backward"
    if name != "aten.convolution" and not backward:
        return 0
    x, weight = (as_tensor(argument(args, i)) for i in ((1, 2) if backward else (0, 1)))
    if x is None or weight is None or x.dim() not in (4, 5):
        return 0
    groups = argument(args, 9 if backward else 8, 1)
    groups = groups if isinstance(groups, int) and groups > 0 else 1
    transposed = argument(args, 7 if backward else 6) is True
    if not uses_cudnn(x, weight, transposed, groups) or conv_memory_format(x, weight) != torch.contiguous_format:
        return 0
    stride, padding = argument(args, 4 if backward else 3, ()), argument(args, 5 if backward else 4, ())
    pointwise = (
        all(size == 1 for size in weight.shape[2:])
        and all(v == 1 for v in (stride if isinstance(stride, (list, tuple)) else ()))
        and all(v == 0 for v in (padding if isinstance(padding, (list, tuple)) else ()))
    )
    if pointwise:
        return 0
    outputs = [t for t in (out if isinstance(out, (list, tuple)) else (out,)) if isinstance(t, torch.Tensor)]
    tensors = [t for t in (as_tensor(argument(args, 0)), x, weight) if t is not None] if backward else [x, weight]
    return 2 * sum(t.numel() * t.element_size() for t in (*tensors, *outputs))


def _rnn_gemms(name: str, args: tuple[object, ...]) -> tuple[Gemm, ...]:
    x, weights, stride = as_tensor(argument(args, 0)), argument(args, 1), argument(args, 2)
    if x is None or x.dim() != 3 or not isinstance(weights, (list, tuple)) or not isinstance(stride, int) or stride < 2:
        return ()
    batch_first = argument(args, 14 if name.endswith("_backward") else 10) is True
    batch, steps = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    gemms = []
    for start in range(0, len(weights) - 1, stride):
        w_ih, w_hh = weights[start], weights[start + 1]
        if not isinstance(w_ih, torch.Tensor) or not isinstance(w_hh, torch.Tensor):
            return ()
        gemms.append(Gemm(batch * steps, w_ih.shape[0], w_ih.shape[1], float(w_ih.numel())))  # every step at once
        gemms.append(Gemm(batch, w_hh.shape[0], w_hh.shape[1], float(w_hh.numel())))  # one step after another
    total = sum(g.share for g in gemms)
    return tuple(Gemm(g.m, g.n, g.k, g.share / total) for g in gemms)
