"""FFTs, pairwise distances, grid sampling and binary search, counted by hand (the convention of docs/flops.md)."""

import math

import pytest
import torch
import torch.nn.functional as F

from models import Fn
from pytest_modelprof import profile


def flops_of(result, op):
    return result.op(op).flops


@pytest.mark.parametrize(
    ("fn", "op", "expected"),
    [
        # 16 complex transforms of 64 points: 5 n log2 n each
        (lambda x: torch.fft.fft(x), "aten._fft_r2c", 16 * 5 * 64 * 6 // 2),  # real input: half
        (lambda x: torch.fft.fft(x.to(torch.complex64)), "aten._fft_c2c", 16 * 5 * 64 * 6),
        # a 2-D transform of the 16 x 64 points: 5 N log2 N with N = 1024
        (lambda x: torch.fft.fft2(x.to(torch.complex64)), "aten._fft_c2c", 5 * 1024 * 10),
        # the orthonormal scaling: once per complex output element, 2 FLOPs each
        (lambda x: torch.fft.fft(x.to(torch.complex64), norm="ortho"), "aten._fft_c2c", 16 * 5 * 64 * 6 + 2 * 16 * 64),
        # back to 64 real points from 33 complex ones: half a complex transform of 64 points, scaled by 1/n
        (lambda x: torch.fft.irfft(torch.fft.rfft(x)), "aten._fft_c2r", 16 * 5 * 64 * 6 // 2 + 16 * 64),
    ],
)
def test_fft_by_hand(fn, op, expected):
    result = profile(Fn(fn), torch.randn(16, 64))
    assert result.uncounted == {}
    assert flops_of(result, op) == expected


@pytest.mark.parametrize(("p", "root"), [(2.0, 1), (1.0, 0), (3.0, 1)])
def test_cdist_by_hand(p, root):
    x1, x2 = torch.randn(2, 10, 8, requires_grad=True), torch.randn(2, 12, 8, requires_grad=True)
    result = profile(Fn(lambda a, b: torch.cdist(a, b, p=p, compute_mode="donot_use_mm_for_euclid_dist")), (x1, x2), train=True)
    pairs = 2 * 10 * 12
    # difference, power, sum per pair and feature; a root per pair except for p = 1
    assert flops_of(result, "aten._cdist_forward") == 3 * pairs * 8 + root * pairs
    # one backward call per input: difference, power, scale, sum per pair and feature
    assert result.op("aten._cdist_backward").calls == 2
    assert flops_of(result, "aten._cdist_backward") == 2 * 4 * pairs * 8


def test_cdist_as_a_matrix_product_by_hand():
    # p = 2 past 25 rows a side: [-2 x1, |x1|^2, 1] times [x2, 1, |x2|^2]^T, a product of M + 2 terms per
    # pair; the norms cost a square and an add per element, the scaling 1 per element of x1; then clamp, root
    x1, x2 = torch.randn(2, 30, 8), torch.randn(2, 40, 8)
    result = profile(Fn(torch.cdist), (x1, x2))
    assert result.uncounted == {}
    pairs = 2 * 30 * 40
    op = result.op("aten._euclidean_dist")
    assert (op.flops, op.macs) == (2 * pairs * 10 + 3 * x1.numel() + 2 * x2.numel() + 2 * pairs, pairs * 10)


@pytest.mark.parametrize(("mode", "per_element"), [("bilinear", 7), ("nearest", 0), ("bicubic", 31)])
def test_grid_sample_by_hand(mode, per_element):
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    grid = (torch.rand(2, 5, 7, 2) * 2 - 1).requires_grad_()
    result = profile(Fn(lambda a, g: F.grid_sample(a, g, mode=mode, align_corners=False)), (x, grid), train=True)
    locations = 2 * 5 * 7
    # the interpolation per output element (2 x 3 channels x 5 x 7), 3 per coordinate to map a location
    assert flops_of(result, "aten.grid_sampler_2d") == per_element * 3 * locations + 3 * 2 * locations
    # backward: the input's gradient and the grid's (both asked for), the mapping again
    assert flops_of(result, "aten.grid_sampler_2d_backward") == 2 * per_element * 3 * locations + 3 * 2 * locations


@pytest.mark.parametrize(("align_corners", "op"), [(True, "aten.cudnn_grid_sampler"), (False, "aten.grid_sampler_2d")])
def test_grid_sample_on_a_cuda_target_by_hand(align_corners, op):
    # CUDA hands bilinear, zero-padded, corner-aligned 2-d sampling to cuDNN, whose backward
    # always makes both gradients; the count is the same as grid_sampler_2d's
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    grid = (torch.rand(2, 5, 7, 2) * 2 - 1).requires_grad_()
    model = Fn(lambda a, g: F.grid_sample(a, g, align_corners=align_corners))
    result = profile(model, (x, grid), train=True, device="meta", target="h100")
    assert result.uncounted == {}
    locations = 2 * 5 * 7
    assert flops_of(result, op) == 7 * 3 * locations + 3 * 2 * locations
    assert flops_of(result, op + "_backward") == 2 * 7 * 3 * locations + 3 * 2 * locations


def test_grid_sample_3d_by_hand():
    x, grid = torch.randn(1, 4, 6, 6, 6), torch.rand(1, 3, 3, 3, 3) * 2 - 1
    result = profile(Fn(lambda a, g: F.grid_sample(a, g, align_corners=True)), (x, grid))
    assert flops_of(result, "aten.grid_sampler_3d") == 15 * 4 * 27 + 3 * 3 * 27  # trilinear: 8 weighted neighbours


def test_binary_search_by_hand():
    boundaries, values = torch.linspace(0, 1, 31), torch.rand(5, 20)
    # a binary search over 31 boundaries (32 slots) takes 5 comparisons per value
    result = profile(Fn(lambda v: torch.bucketize(v, boundaries) + torch.searchsorted(boundaries, v)), values)
    assert flops_of(result, "aten.bucketize") == 100 * 5
    assert flops_of(result, "aten.searchsorted") == 100 * 5
    assert math.ceil(math.log2(32)) == 5


def test_pdist_fold_and_affine_grid_by_hand():
    x = torch.randn(6, 5, requires_grad=True)
    result = profile(Fn(lambda a: F.pdist(a)), x, train=True)
    pairs = 6 * 5 // 2
    assert flops_of(result, "aten._pdist_forward") == 3 * pairs * 5 + pairs  # as cdist: 3 per feature, a root
    assert flops_of(result, "aten._pdist_backward") == 4 * pairs * 5
    columns = torch.randn(2, 3 * 9, 16)  # 3 channels x 3 x 3 windows, 4 x 4 positions
    result = profile(Fn(lambda c: F.fold(c, (6, 6), 3)), columns)
    assert flops_of(result, "aten.col2im") == 2 * 27 * 16  # each column element added into the image
    theta = torch.randn(2, 2, 3)
    result = profile(Fn(lambda t: F.affine_grid(t, (2, 3, 5, 7), align_corners=False)), theta)
    # each of the 2 x 5 x 7 x 2 coordinates: a row of theta times (x, y, 1)
    assert (flops_of(result, "aten.affine_grid_generator"), result.op("aten.affine_grid_generator").macs) == (2 * 70 * 3 * 2, 70 * 3 * 2)


def test_scatter_reduce_unique_cummax_and_fractional_pooling_by_hand():
    src, index = torch.randn(4, 10), torch.randint(0, 3, (4, 10))
    for reduce, extra in (("amax", 0), ("mean", 3 * 10)):  # the mean divides each output
        result = profile(Fn(lambda s, reduce=reduce: torch.zeros(3, 10).scatter_reduce(0, index, s, reduce)), src)
        assert flops_of(result, "aten.scatter_reduce") == 40 + extra
    values = torch.randint(0, 5, (64,))
    result = profile(Fn(lambda v: torch.unique(v)), values)
    assert flops_of(result, "aten._unique2") == 64 * 6 + 64  # sorted (n log2 n comparisons), neighbours compared
    result = profile(Fn(lambda v: torch.cummax(v, -1)[0]), torch.randn(4, 100))
    assert flops_of(result, "aten.cummax") == 400
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    result = profile(Fn(lambda a: F.fractional_max_pool2d(a, 2, output_size=(4, 4))), x, train=True)
    outputs = 2 * 3 * 4 * 4
    assert flops_of(result, "aten.fractional_max_pool2d") == outputs * 4  # a 2 x 2 window per output
    assert flops_of(result, "aten.fractional_max_pool2d_backward") == outputs


def test_special_functions_count_as_one_step_and_windows_as_creation():
    x = torch.rand(4, 10) + 0.5
    result = profile(Fn(lambda a: torch.lgamma(a) + torch.digamma(a) + torch.special.i0(a) + torch.special.i1(a)), x)
    assert result.uncounted == {}
    for op in ("aten.lgamma", "aten.digamma", "aten.i0", "aten.special_i1"):
        assert flops_of(result, op) == 40
    result = profile(Fn(lambda a: a[0] * torch.hann_window(10)), x)
    assert result.uncounted == {} and flops_of(result, "aten.hann_window") == 0


def test_unfold_backward_adds_each_window_gradient_once():
    x = torch.randn(2, 10, requires_grad=True)
    result = profile(Fn(lambda a: a.unfold(1, 4, 2)), x, train=True)  # 4 overlapping windows of 4
    assert result.uncounted == {} and flops_of(result, "aten.unfold_backward") == 2 * 4 * 4
