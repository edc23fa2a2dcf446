"""Interpolation, grid sampling, affine grids, and torchvision's detection ops (found by name)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .builtin import NAMED, Formula, OpCost, ceil_log2, first_tensor, from_macs, from_values, register, set_formula
from .conv import conv_macs
from .pool import scatter_grad


def _interpolation(per_element: int) -> Formula:
    def formula(*_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(per_element * first_tensor(out_val).numel())

    return formula


def _interpolation_backward(per_element: int) -> Formula:
    def formula(grad_out: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(per_element * grad_out.numel())

    return formula


# each output is a weighted sum of 2^n neighbours (2^n multiplies, 2^n - 1 adds);
# bicubic of 16 neighbours; nearest copies one value (0) and its backward adds (1).
_INTERPOLATION = {
    "upsample_linear1d": 3,
    "upsample_bilinear2d": 7,
    "_upsample_bilinear2d_aa": 7,
    "upsample_trilinear3d": 15,
    "upsample_bicubic2d": 31,
    "_upsample_bicubic2d_aa": 31,
}
for _name, _per_element in _INTERPOLATION.items():
    set_formula(_name, _interpolation(_per_element))
    set_formula(_name + "_backward", _interpolation_backward(_per_element))
for _name in (
    "upsample_nearest1d",
    "upsample_nearest2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d",
    "_upsample_nearest_exact3d",
):
    set_formula(_name + "_backward", scatter_grad)

# grid_sample: the interpolation's cost per output element (as above: bilinear 7, trilinear 15,
# bicubic 31, nearest 0), plus 3 per coordinate of each output location to map it into the
# input's pixels ((x + 1) * size - 1) / 2); its backward the per-element cost for each gradient it
# makes (the input's scatters the weighted neighbours, the grid's reads them again), plus the mapping.
_GRID_SAMPLE = {(2, 0): 7, (2, 1): 0, (2, 2): 31, (3, 0): 15, (3, 1): 0}  # (dims, mode) -> per output element


def _grid_sampler(dims: int, backward: bool) -> Formula:
    def formula(*args: Any, out_val: Any = None, **kwargs: Any) -> OpCost | None:
        x, grid, mode = (args[1], args[2], args[3]) if backward else (args[0], args[1], args[2])
        per_element = _GRID_SAMPLE.get((dims, mode))
        if per_element is None:
            return None
        locations = grid.numel() // dims
        channels = x.shape[1]
        # the backward pass makes the gradients its output mask asks for: the input's, the grid's
        passes = sum(bool(m) for m in args[6]) if backward and len(args) > 6 else 1
        return OpCost(passes * per_element * locations * channels + 3 * grid.numel())

    return formula


for _dims in (2, 3):
    set_formula(f"grid_sampler_{_dims}d", _grid_sampler(_dims, backward=False))
    set_formula(f"grid_sampler_{_dims}d_backward", _grid_sampler(_dims, backward=True))


# cuDNN's sampler (what grid_sample runs on CUDA for bilinear, zero-padded, corner-aligned 2-d
# sampling): as grid_sampler_2d's bilinear mode; its backward always makes both gradients
@register("cudnn_grid_sampler")
def cudnn_grid_sampler(x: torch.Tensor, grid: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(_GRID_SAMPLE[(2, 0)] * grid.numel() // 2 * x.shape[1] + 3 * grid.numel())


@register("cudnn_grid_sampler_backward")
def cudnn_grid_sampler_backward(x: torch.Tensor, grid: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(2 * _GRID_SAMPLE[(2, 0)] * grid.numel() // 2 * x.shape[1] + 3 * grid.numel())


@register("affine_grid_generator")
def affine_grid_generator(theta: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # each output coordinate is a row of theta times the homogeneous base position (dims + 1 MACs)
    return from_macs(first_tensor(out_val).numel() * theta.shape[-1])


# torchvision's detection ops (torchvision/csrc/ops), found by name: counting them needs no import of
# torchvision. RoIAlign averages a grid of bilinear samples per output (4 weighted neighbours, 7,
# plus the accumulation, 1; one divide per output); its backward spreads each gradient over the same
# neighbours (4 multiplies and 4 adds per sample). The grid is sampling_ratio x sampling_ratio, or,
# adaptive (sampling_ratio <= 0), ceil(box side / output side) per box: read from the boxes where the
# run has their values, uncounted where it has not (an analytic run). RoIPool takes a window of whole
# pixels per output, the box's side split in equal bins (floor to ceil): its max compares each pixel
# once (its backward adds each gradient to its argmax); the position-sensitive kind averages them
# (an add per pixel and a divide; its backward a divide and an add per pixel). Their windows follow
# the boxes too, so they are counted from the boxes' values alone.
# NMS: the boxes sorted by score, their areas (3 each), and the IoU of every pair (12: 4 max/min,
# 2 extents clamped at 0, the intersection, the union, the ratio, as CUDA's kernel computes the full
# suppression mask). A deformable convolution: a convolution's MACs over columns sampled
# bilinearly at the offset positions (7 per column element, 2 to offset its coordinates, 1 to apply
# the mask), plus the bias; its backward, as a convolution's, twice its forward.

ROI_ALIGN_SAMPLE, NMS_PAIR = 8, 12


@from_values
def _box_sides(rois: torch.Tensor, spatial_scale: float, shift: float) -> list[tuple[float, float]]:
    """Each box's (height, width) on the feature map, as the kernels compute them in the boxes' dtype
    (``rois``: K x 5, batch index then x1, y1, x2, y2); None where the run does not have the values."""
    corners = rois[:, 1:].to(torch.float64 if rois.dtype == torch.float64 else torch.float32)
    corners = corners * spatial_scale - shift
    sides = torch.stack([corners[:, 3] - corners[:, 1], corners[:, 2] - corners[:, 0]], 1)
    return [(h, w) for h, w in sides.tolist()]


def _roi_align(scale_at: int, sampling_at: int, backward: bool, position_sensitive: bool) -> Formula:
    # roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned),
    # ps_roi_align the same without aligned; their backward ops take the gradient first and the sizes
    # of the input, and, position-sensitive, the channel mapping after the boxes
    def formula(*args: Any, out_val: Any = None, **__: Any) -> OpCost | None:
        sampling_ratio = args[sampling_at]
        outputs = args[0] if backward else first_tensor(out_val)
        if sampling_ratio > 0:
            return OpCost(outputs.numel() * (sampling_ratio**2 * ROI_ALIGN_SAMPLE + 1))
        scale, pooled_height, pooled_width = args[scale_at : scale_at + 3]
        aligned = not position_sensitive and bool(args[sampling_at + 1])
        sides = _box_sides(args[1], scale, 0.5 if aligned or position_sensitive else 0.0)
        if sides is None:
            return None
        samples = 0
        for h, w in sides:
            if not (aligned or position_sensitive):  # malformed boxes are forced to 1 x 1
                h, w = max(h, 1.0), max(w, 1.0)
            samples += max(math.ceil(h / pooled_height), 0) * max(math.ceil(w / pooled_width), 0)
        per_box = outputs.numel() // max(len(sides), 1)  # the outputs of one box
        return OpCost(per_box * (samples * ROI_ALIGN_SAMPLE + len(sides)))

    return formula


NAMED["torchvision.roi_align"] = _roi_align(2, 5, backward=False, position_sensitive=False)
NAMED["torchvision.ps_roi_align"] = _roi_align(2, 5, backward=False, position_sensitive=True)
NAMED["torchvision._roi_align_backward"] = _roi_align(2, 9, backward=True, position_sensitive=False)
NAMED["torchvision._ps_roi_align_backward"] = _roi_align(3, 6, backward=True, position_sensitive=True)


@from_values
def _roi_windows(rois: torch.Tensor, spatial_scale: float, pooled: tuple[int, int], size: tuple[int, int], ends: int) -> list[int]:
    """The pixels of every RoIPool window, box by box (``ends``: 1 where a box's side counts both its end
    pixels, RoIPool's, 0 for the position-sensitive kind's); None where the run does not have the boxes."""
    dtype = torch.float64 if rois.dtype == torch.float64 else torch.float32
    scaled = rois[:, 1:].to(dtype) * spatial_scale
    corners = (torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)).long().tolist()  # C's round, half away from 0
    areas: list[int] = []
    for x1, y1, x2, y2 in corners:
        extents = []
        for start, end, bins, limit in ((y1, y2, pooled[0], size[0]), (x1, x2, pooled[1], size[1])):
            steps = torch.arange(bins + 1, dtype=dtype) * (torch.tensor(max(end - start + ends, 1), dtype=dtype) / bins)
            low = (torch.floor(steps[:-1]).long() + start).clamp(0, limit)
            high = (torch.ceil(steps[1:]).long() + start).clamp(0, limit)
            extents.append((high - low).clamp(min=0))
        areas += (extents[0][:, None] * extents[1][None, :]).flatten().tolist()
    return areas


def _roi_pool(backward: bool, position_sensitive: bool) -> Formula:
    # roi_pool(input, rois, spatial_scale, pooled_height, pooled_width), ps_roi_pool alike; their
    # backward ops: (grad, rois, argmax or channel mapping, spatial_scale, pooled_height, pooled_width,
    # batch, channels, height, width)
    def formula(*args: Any, out_val: Any = None, **__: Any) -> OpCost | None:
        at = 3 if backward else 2
        pooled = (args[at + 1], args[at + 2])
        size = (args[at + 5], args[at + 6]) if backward else (args[0].shape[-2], args[0].shape[-1])
        areas = _roi_windows(args[1], args[at], pooled, size, ends=0 if position_sensitive else 1)
        if areas is None:
            return None
        outputs = args[0] if backward else first_tensor(out_val)
        channels = outputs.numel() // max(len(areas), 1)  # the outputs of one window
        filled = sum(1 for area in areas if area > 0)
        if position_sensitive:  # an add per pixel and a divide per window, both ways
            return OpCost(channels * (sum(areas) + filled))
        # forward, a compare per pixel; backward, an add per window, to its argmax
        return OpCost(channels * (filled if backward else sum(areas)))

    return formula


NAMED["torchvision.roi_pool"] = _roi_pool(backward=False, position_sensitive=False)
NAMED["torchvision.ps_roi_pool"] = _roi_pool(backward=False, position_sensitive=True)
NAMED["torchvision._roi_pool_backward"] = _roi_pool(backward=True, position_sensitive=False)
NAMED["torchvision._ps_roi_pool_backward"] = _roi_pool(backward=True, position_sensitive=True)


def _nms(boxes: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    n = boxes.shape[0]
    return OpCost(n * ceil_log2(n) + 3 * n + NMS_PAIR * (n * (n - 1) // 2) if n > 1 else 3 * n)


NAMED["torchvision.nms"] = _nms


def _deform_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor,
    bias: torch.Tensor,
    *args: Any,
    out_val: Any = None,
    **__: Any,
) -> OpCost:
    out = first_tensor(out_val)
    macs = conv_macs(weight.shape, out.shape[0], out.shape[2:])
    columns = out.shape[0] * x.shape[1] * weight.shape[2] * weight.shape[3] * out.shape[2] * out.shape[3]
    use_mask = bool(args[-1])
    return OpCost(2 * macs + columns * (7 + 2 + int(use_mask)) + (out.numel() if bias.numel() else 0), macs)


def _deform_conv2d_backward(grad: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
    # (grad, then the forward's arguments): twice the forward, whose output has the gradient's shape
    forward = _deform_conv2d(*args, out_val=grad, **kwargs)
    return OpCost(2 * forward.flops, 2 * forward.macs)


NAMED["torchvision.deform_conv2d"] = _deform_conv2d
NAMED["torchvision._deform_conv2d_backward"] = _deform_conv2d_backward
