"""torchvision's detection ops, counted by hand (engine/formulas/vision.py, found by name)."""

import math

import pytest
import torch
import torchvision.ops as ops

from models import Fn
from pytest_modelprof import profile


def flops_of(result, op):
    return result.op(op).flops


def boxes(k=5, size=16.0):
    corners = torch.rand(k, 2) * size / 2
    return torch.cat([torch.zeros(k, 1), corners, corners + size / 2], 1)  # (batch index, x1, y1, x2, y2)


@pytest.mark.parametrize("device", [None, "meta"])
def test_roi_align_by_hand(device):
    x = torch.randn(1, 4, 16, 16, requires_grad=True)
    result = profile(Fn(lambda a, b: ops.roi_align(a, b, (7, 7), sampling_ratio=2)), (x, boxes()), train=True, device=device)
    assert result.uncounted == {}
    outputs = 5 * 4 * 7 * 7
    # per output 2 x 2 bilinear samples (7 for the 4 weighted neighbours, 1 to accumulate), then the average
    assert flops_of(result, "torchvision.roi_align") == outputs * (4 * 8 + 1)
    assert flops_of(result, "torchvision._roi_align_backward") == outputs * (4 * 8 + 1)


@pytest.mark.parametrize("aligned", [False, True])
def test_an_adaptive_roi_align_grid_follows_each_box(aligned):
    # sampling_ratio=-1: per box a ceil(height / 7) x ceil(width / 7) grid
    rois = torch.tensor([[0, 0, 0, 14, 7], [0, 1, 1, 4, 4], [0, 2, 2, 2.5, 2.5], [0, 5, 5, 4, 5]])
    grids = [2, 1, 1, 0] if aligned else [2, 1, 1, 1]  # unaligned, a box under 1 x 1 is made 1 x 1
    x = torch.randn(1, 4, 16, 16, requires_grad=True)
    result = profile(Fn(lambda a, b: ops.roi_align(a, b, (7, 7), aligned=aligned)), (x, rois), train=True)
    assert result.uncounted == {}
    per_box = 4 * 7 * 7
    assert flops_of(result, "torchvision.roi_align") == per_box * (8 * sum(grids) + 4)
    assert flops_of(result, "torchvision._roi_align_backward") == per_box * (8 * sum(grids) + 4)


def test_a_position_sensitive_adaptive_grid_follows_each_box():
    rois = torch.tensor([[0, 0, 0, 9, 3], [0, 1, 1, 2, 2.0]])  # grids ceil(3/2) x ceil(9/2), 1 x 1
    x = torch.randn(1, 8, 16, 16, requires_grad=True)
    result = profile(Fn(lambda a, b: ops.ps_roi_align(a, b, (2, 2))), (x, rois), train=True)
    per_box = 2 * 2 * 2  # 8 channels over 2 x 2 bins: 2 out
    assert flops_of(result, "torchvision.ps_roi_align") == per_box * (8 * (2 * 5 + 1) + 2)
    assert flops_of(result, "torchvision._ps_roi_align_backward") == per_box * (8 * (2 * 5 + 1) + 2)


def test_an_adaptive_grid_without_the_boxes_values_is_listed_uncounted():
    # an analytic run has no values of the boxes, so no grid
    result = profile(Fn(lambda a, b: ops.roi_align(a, b, (7, 7))), (torch.randn(1, 4, 16, 16), boxes()), device="meta")
    assert result.uncounted == {"torchvision.roi_align": 1}


def test_roi_pool_by_hand():
    # a 3 x 1 box (both end pixels count) in 1 x 2 bins of 1.5 pixels: windows [0, 2) and [1, 3), 2 pixels
    # each; a 7 x 7 box at the corner of the map, in 7 x 7 bins of 1: 2 x 2 windows inside, the rest empty
    rois = torch.tensor([[0, 0, 0, 2, 0], [0, 14, 14, 20, 20]], dtype=torch.float32)
    x = torch.randn(1, 3, 16, 16, requires_grad=True)
    one = profile(Fn(lambda a, b: ops.roi_pool(a, b, (1, 2))), (x, rois[:1]), train=True)
    assert flops_of(one, "torchvision.roi_pool") == 3 * (2 + 2)  # a compare per pixel, per channel
    corner = profile(Fn(lambda a, b: ops.roi_pool(a, b, (7, 7))), (x, rois[1:]), train=True)
    assert flops_of(corner, "torchvision.roi_pool") == 3 * 4
    # backward: an add per window that has a maximum; torch marks the others' argmax -1
    for result, pooled, box in ((one, (1, 2), rois[:1]), (corner, (7, 7), rois[1:])):
        _, argmax = torch.ops.torchvision.roi_pool(x.detach(), box, 1.0, *pooled)
        assert flops_of(result, "torchvision._roi_pool_backward") == int((argmax >= 0).sum())


def test_ps_roi_pool_by_hand():
    # a 4 x 4 box (end pixel not counted) in 2 x 2 bins of 2: four windows of 4 pixels, an add per
    # pixel and a divide per window, for each of the 8 / (2 x 2) output channels
    x = torch.randn(1, 8, 16, 16, requires_grad=True)
    result = profile(Fn(lambda a, b: ops.ps_roi_pool(a, b, (2, 2))), (x, torch.tensor([[0, 0, 0, 4, 4.0]])), train=True)
    assert result.uncounted == {}
    assert flops_of(result, "torchvision.ps_roi_pool") == 2 * (16 + 4)
    assert flops_of(result, "torchvision._ps_roi_pool_backward") == 2 * (16 + 4)


def test_nms_by_hand():
    n = 40
    scores = torch.rand(n)
    result = profile(Fn(lambda b, s: ops.nms(b, s, 0.5)), (boxes(n)[:, 1:], scores))
    # sorted by score, an area per box, the IoU of every pair
    assert flops_of(result, "torchvision.nms") == n * math.ceil(math.log2(n)) + 3 * n + 12 * n * (n - 1) // 2


@pytest.mark.parametrize("mask", [True, False])
def test_deformable_convolution_by_hand(mask):
    x = torch.randn(1, 4, 8, 8, requires_grad=True)
    conv = ops.DeformConv2d(4, 6, 3, padding=1)
    offset = torch.randn(1, 2 * 9, 8, 8)
    modulation = torch.rand(1, 9, 8, 8) if mask else None
    result = profile(Fn(lambda a, o, m=None: conv(a, o, m)), (x, offset, modulation) if mask else (x, offset), train=True)
    assert result.uncounted == {}
    macs = 6 * 64 * 4 * 9  # every weight meets every output position, as a convolution's
    columns = 4 * 9 * 64  # the input sampled at each kernel tap and output position
    forward = 2 * macs + columns * (7 + 2 + int(mask)) + 6 * 64  # bilinear, offset, mask; bias
    assert (flops_of(result, "torchvision.deform_conv2d"), result.op("torchvision.deform_conv2d").macs) == (forward, macs)
    assert flops_of(result, "torchvision._deform_conv2d_backward") == 2 * forward
