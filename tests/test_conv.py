"""Convolutions against hand formulas, and their backward.

A convolution does, for every output position and output channel, one MAC per
weight of its group: N * C_out * prod(out_spatial) * (C_in / groups) * prod(kernel).
A transposed convolution scatters every *input* position through the kernel:
N * C_in * prod(in_spatial) * (C_out / groups) * prod(kernel).
"""

import math

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from pytest_modelprof import profile


def out_size(size, kernel, stride=1, padding=0, dilation=1):
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


@pytest.mark.parametrize(
    "dims, c_in, c_out, kernel, stride, padding, dilation, groups",
    [
        (1, 4, 6, 3, 1, 0, 1, 1),
        (2, 3, 8, 3, 2, 1, 1, 1),
        (2, 8, 8, 3, 1, 1, 1, 8),
        (2, 8, 12, 3, 1, 2, 2, 4),
        (3, 2, 4, 3, 2, 1, 1, 2),
    ],
    ids=["1d", "2d-strided", "2d-depthwise", "2d-dilated-grouped", "3d-grouped"],
)
def test_convolution_macs(dims, c_in, c_out, kernel, stride, padding, dilation, groups):
    conv = getattr(nn, f"Conv{dims}d")(c_in, c_out, kernel, stride, padding, dilation, groups, bias=True)
    n, size = 2, 9
    x = torch.randn(n, c_in, *[size] * dims)
    spatial = out_size(size, kernel, stride, padding, dilation) ** dims
    macs = n * c_out * spatial * (c_in // groups) * kernel**dims
    result = profile(conv, x)
    assert result.macs == macs
    assert result.flops == 2 * macs + n * c_out * spatial  # plus the bias add


def test_transposed_grouped_convolution_uses_input_spatial_size():
    n, c_in, c_out, groups, k, h, w = 2, 6, 4, 2, 3, 5, 7
    conv = nn.ConvTranspose2d(c_in, c_out, k, stride=2, padding=1, output_padding=1, groups=groups, bias=False)
    result = profile(conv, torch.randn(n, c_in, h, w))
    assert result.macs == n * c_in * h * w * (c_out // groups) * k * k
    assert result.uncounted == {}


def test_transposed_conv1d_and_3d():
    conv1 = nn.ConvTranspose1d(3, 5, 4, stride=2, bias=False)
    assert profile(conv1, torch.randn(1, 3, 10)).macs == 1 * 3 * 10 * 5 * 4
    conv3 = nn.ConvTranspose3d(2, 2, 2, stride=2, bias=False)
    assert profile(conv3, torch.randn(1, 2, 3, 3, 3)).macs == 2 * 27 * 2 * 8


def test_forward_agrees_with_torch_flop_counter():
    conv = nn.Conv2d(16, 32, 3, padding=1, groups=4, bias=False)
    x = torch.randn(2, 16, 12, 12)
    with FlopCounterMode(display=False) as counter:
        conv(x)
    assert profile(conv, x).flops == counter.get_total_flops()


@pytest.mark.parametrize("groups", [1, 4, 32], ids=["dense", "grouped", "depthwise"])
def test_backward_is_twice_forward(groups):
    conv = nn.Conv2d(32, 32, 3, padding=1, groups=groups, bias=False)
    x = torch.randn(2, 32, 10, 10, requires_grad=True)
    result = profile(conv, x, train=True)
    assert result.backward_macs == 2 * result.forward_macs
    assert result.backward_flops == 2 * result.forward_flops


def test_depthwise_backward_where_torch_overcounts():
    # torch.utils.flop_counter ignores `groups` in its backward formula; we don't.
    conv = nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False)
    x = torch.randn(2, 32, 10, 10, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        conv(x).sum().backward()
    torch_backward = counter.get_total_flops() - 2 * 2 * 32 * 100 * 9
    ours = profile(conv, x, train=True)
    assert ours.backward_flops == 2 * 2 * 2 * 32 * 100 * 9
    assert torch_backward > 10 * ours.backward_flops


def test_conv_bias_gradient_is_a_sum_of_output_gradients():
    conv = nn.Conv2d(3, 4, 3, bias=True)
    x = torch.randn(1, 3, 6, 6, requires_grad=True)
    result = profile(conv, x, train=True)
    forward_macs = 4 * 16 * 3 * 9
    assert result.backward_flops == 2 * 2 * forward_macs + 4 * 16
    assert math.isclose(result.backward_flops / result.forward_flops, 2, rel_tol=0.05)
