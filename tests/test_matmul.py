"""The matmul family, against hand formulas: an (m x k) @ (k x n) product is m*k*n MACs."""

import pytest
import torch
from torch import nn

from pytest_modelprof import profile


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def counted(fn, *inputs):
    result = profile(Fn(fn), inputs)
    assert result.uncounted == {}
    return result


M, K, N, B = 6, 5, 7, 3
a, b = torch.randn(M, K), torch.randn(K, N)
ba, bb = torch.randn(B, M, K), torch.randn(B, K, N)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: a @ b,
        torch.mm,
        torch.matmul,
        lambda a, b: torch.einsum("mk,kn->mn", a, b),
        lambda a, b: torch.mm(a, b, out=torch.empty(M, N)),
    ],
    ids=["operator", "mm", "matmul", "einsum", "mm_out"],
)
def test_matrix_product_is_m_k_n_macs(fn):
    result = counted(fn, a, b)
    assert result.macs == M * K * N
    assert result.flops == 2 * M * K * N


@pytest.mark.parametrize(
    "fn",
    [torch.bmm, torch.matmul, lambda x, y: torch.einsum("bmk,bkn->bmn", x, y)],
    ids=["bmm", "matmul", "einsum"],
)
def test_batched_product_is_b_m_k_n_macs(fn):
    result = counted(fn, ba, bb)
    assert result.macs == B * M * K * N
    assert result.flops == 2 * B * M * K * N


def test_linear_counts_the_bias_add():
    layer = nn.Linear(K, N)
    result = profile(layer, torch.randn(M, K))
    assert result.macs == M * K * N
    assert result.flops == 2 * M * K * N + M * N


@pytest.mark.parametrize(
    "fn, macs, adds",
    [
        (lambda c, x, y: torch.addmm(c, x, y), M * K * N, M * N),
        (lambda c, x, y: c.clone().addmm_(x, y), M * K * N, M * N),
        (lambda c, x, y: torch.addmm(c, x, y, out=torch.empty(M, N)), M * K * N, M * N),
    ],
    ids=["addmm", "addmm_", "addmm_out"],
)
def test_addmm_variants(fn, macs, adds):
    result = counted(fn, torch.randn(M, N), a, b)
    assert (result.macs, result.flops) == (macs, 2 * macs + adds)


def test_baddbmm_and_inplace():
    bias = torch.randn(B, M, N)
    for fn in (torch.baddbmm, lambda c, x, y: c.clone().baddbmm_(x, y)):
        result = counted(fn, bias, ba, bb)
        assert result.macs == B * M * K * N
        assert result.flops == 2 * B * M * K * N + B * M * N


def test_addbmm_sums_the_batch():
    result = counted(torch.addbmm, torch.randn(M, N), ba, bb)
    assert result.macs == B * M * K * N
    assert result.flops == 2 * B * M * K * N + B * M * N


def test_vector_products():
    v = torch.randn(K)
    assert counted(torch.mv, a, v).macs == M * K
    assert counted(torch.dot, v, torch.randn(K)).macs == K
    result = counted(torch.addmv, torch.randn(M), a, v)
    assert (result.macs, result.flops) == (M * K, 2 * M * K + M)


def test_linear_backward_is_twice_forward():
    layer = nn.Linear(K, N, bias=False)
    x = torch.randn(M, K, requires_grad=True)
    result = profile(layer, x, train=True)
    assert result.backward_flops == 2 * result.forward_flops
    assert result.backward_macs == 2 * M * K * N


def test_linear_backward_without_input_grad_only_computes_weight_grad():
    layer = nn.Linear(K, N, bias=False)
    result = profile(layer, torch.randn(M, K), train=True)
    assert result.backward_macs == M * K * N
