"""The matmul family, against hand formulas: an (m x k) @ (k x n) product is m*k*n MACs."""

import pytest
import torch
from torch import nn

from models import Fn
from pytest_modelprof import profile


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


def test_outer_product_update_is_one_mac_and_one_add_per_element():
    m, n = 5, 7
    bias, u, v = torch.randn(m, n), torch.randn(m), torch.randn(n)
    # bias + outer(u, v): m*n multiplies (one MAC each, contraction length 1) and m*n adds
    result = profile(_Fn(lambda: torch.addr(bias, u, v)), ())
    assert result.op("aten.addr").macs == m * n
    assert result.flops == 2 * m * n + m * n


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "offs", "macs"),
    [
        ((64, 32), (4, 32, 48), [16, 32, 48, 64], 64 * 32 * 48),  # tokens routed to 4 experts
        ((4, 16, 32), (4, 32, 48), None, 4 * 16 * 32 * 48),  # a batch of 4 products
        ((4, 16, 32), (32, 64), [16, 32, 48, 64], 16 * 32 * 64),  # N split into 4 groups
        ((32, 64), (64, 48), [16, 32, 48, 64], 32 * 64 * 48),  # K split: the weight gradient of a MoE layer
    ],
    ids=["2d-3d", "3d-3d", "3d-2d", "2d-2d"],
)
def test_grouped_matrix_products_count_every_group_s_macs(a_shape, b_shape, offs, macs):
    # analytic: torch's grouped product needs bf16 operands with 16-byte aligned strides (CUDA, or a meta run)
    a = torch.randn(*a_shape, dtype=torch.bfloat16, device="meta")
    b = torch.randn(*b_shape, dtype=torch.bfloat16, device="meta")
    if len(b_shape) == 2 and len(a_shape) == 3:
        b = b.t().contiguous().t()  # column-major, as the kernel wants a transposed second operand
    groups = torch.tensor(offs, dtype=torch.int32, device="meta") if offs is not None else None
    result = profile(_Fn(lambda: torch._grouped_mm(a, b, offs=groups)), (), device="meta")
    assert result.uncounted == {}
    assert result.op("aten._grouped_mm").macs == macs
    assert result.flops == 2 * macs


def test_index_add_adds_each_source_element_once_and_scales_it_when_asked():
    x, index, source = torch.zeros(10, 4), torch.tensor([0, 2, 2, 9, 5, 1]), torch.randn(6, 4)
    assert profile(_Fn(lambda: x.index_add(0, index, source)), ()).flops == 6 * 4
    assert profile(_Fn(lambda: x.index_add(0, index, source, alpha=0.5)), ()).flops == 2 * 6 * 4
    scatter_index = torch.zeros(6, 4, dtype=torch.long)
    assert profile(_Fn(lambda: x.scatter_add(0, scatter_index, source)), ()).flops == 6 * 4


class _Fn(torch.nn.Module):
    """A model whose forward is a function of tensors it closes over."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self):
        return self.fn()
