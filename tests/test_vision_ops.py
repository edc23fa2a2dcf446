"""torchvision's detection ops, counted by hand (engine/formulas.py, found by name)."""

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


def test_an_adaptive_roi_align_grid_is_listed_uncounted():
    # sampling_ratio=-1: the grid follows each box's size, which the shapes do not give
    result = profile(Fn(lambda a, b: ops.roi_align(a, b, (7, 7))), (torch.randn(1, 4, 16, 16), boxes()))
    assert result.uncounted == {"torchvision.roi_align": 1}


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
