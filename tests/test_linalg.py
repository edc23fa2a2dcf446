"""Dense linear algebra against Golub & Van Loan's operation counts (Matrix Computations: one FLOP per
floating-point add, multiply or divide), per matrix of a batch of 3."""

import pytest
import torch

from models import Fn
from pytest_modelprof import profile

BATCH, N, M, K = 3, 6, 8, 2  # batch, square size, tall rows, right-hand sides


def square():
    a = torch.randn(BATCH, N, N)
    return a @ a.mT + N * torch.eye(N)  # symmetric positive definite: every factorisation succeeds


def counted(fn, *inputs):
    result = profile(Fn(fn), inputs)
    assert result.uncounted == {}
    return {op.op: op.flops for op in result.ops if op.flops}


@pytest.mark.parametrize(
    ("fn", "op", "per_matrix"),
    [
        (torch.linalg.cholesky, "aten.linalg_cholesky_ex", N**3 // 3),
        (lambda a: torch.linalg.lu_factor(a)[0], "aten.linalg_lu_factor_ex", 2 * N**3 // 3),
        (torch.linalg.inv, "aten.linalg_inv_ex", 2 * N**3),  # LU, then 4n^3/3 for the inverse
        (torch.linalg.det, "aten._linalg_det", 2 * N**3 // 3 + N),  # LU, then the diagonal's product
        (lambda a: torch.linalg.slogdet(a)[1], "aten._linalg_slogdet", 2 * N**3 // 3 + N),
        (lambda a: torch.linalg.eigh(a)[1], "aten._linalg_eigh", 9 * N**3),  # symmetric QR with vectors
        (lambda a: torch.linalg.eig(a)[1].real, "aten.linalg_eig", 25 * N**3),  # Hessenberg QR with vectors
    ],
)
def test_factorisations_of_a_square_matrix(fn, op, per_matrix):
    assert counted(fn, square())[op] == BATCH * per_matrix


@pytest.mark.parametrize(("mode", "q"), [("r", 0), ("reduced", 1), ("complete", None)])
def test_householder_qr(mode, q):
    r = 2 * N * N * (M - N // 3)  # R of an M x N matrix
    forming_q = {0: 0, 1: r, None: 4 * (M * M * N - M * N * N + N**3 // 3)}[q]
    fn = (lambda a: torch.linalg.qr(a, mode=mode)[1]) if mode == "r" else (lambda a: torch.linalg.qr(a, mode=mode)[0])
    assert counted(fn, torch.randn(BATCH, M, N))["aten.linalg_qr"] == BATCH * (r + forming_q)


@pytest.mark.parametrize(
    ("full", "per_matrix"),
    [(True, 4 * M * M * N + 8 * M * N * N + 9 * N**3), (False, 14 * M * N * N + 8 * N**3)],
)
@pytest.mark.parametrize("wide", [False, True])
def test_golub_kahan_reinsch_svd(full, per_matrix, wide):
    a = torch.randn(BATCH, M, N)
    a = a.mT.contiguous() if wide else a  # a wide matrix costs what its transpose does
    assert counted(lambda x: torch.linalg.svd(x, full_matrices=full)[0], a)["aten._linalg_svd"] == BATCH * per_matrix


def test_solves():
    a, b = square(), torch.randn(BATCH, N, K)
    # LU (2n^3/3), then a forward and a back substitution: n^2 each per right-hand side
    assert counted(torch.linalg.solve, a, b)["aten._linalg_solve_ex"] == BATCH * (2 * N**3 // 3 + 2 * N * N * K)
    assert counted(lambda x, y: torch.linalg.solve(x, y[..., 0]), a, b)["aten._linalg_solve_ex"] == BATCH * (2 * N**3 // 3 + 2 * N * N)
    lu = counted(lambda x, y: torch.linalg.lu_solve(*torch.linalg.lu_factor(x), y), a, b)
    assert lu["aten.linalg_lu_solve"] == BATCH * 2 * N * N * K
    triangle = counted(lambda x, y: torch.linalg.solve_triangular(x.triu(), y, upper=True), a, b)
    assert triangle["aten.linalg_solve_triangular"] == BATCH * N * N * K


def test_the_matrix_exponential_by_its_taylor_degree():
    # Bader, Blanes & Casas's scheme as PyTorch runs it: the 1-norm picks the degree. Per n x n matrix the
    # norm costs 2n^2 + n; a zero matrix takes degree 1 (I + A: n^2 adds); the identity (norm 1, between
    # float's bounds 0.58 and 1.46) degree 12: 4 products, 4 combinations of 4 matrices (7n^2 each) and
    # 3 adds; 10 I (norm 10 > 3.01) is divided by 2^s, s = ceil(log2(10 / 3.01)) = 2, takes degree 18 (5
    # products, 5 combinations of 5, 9n^2 each, 3 adds) and is squared twice
    n = 4
    a = torch.stack([torch.zeros(n, n), torch.eye(n), 10 * torch.eye(n)])
    result = profile(Fn(torch.linalg.matrix_exp), (a,))
    assert result.uncounted == {}
    norms = 3 * (2 * n * n + n)
    macs = (4 + 5 + 2) * n**3
    expected = norms + n * n + 2 * macs + (4 * 7 + 3) * n * n + (n * n + 5 * 9 * n * n + 3 * n * n)
    op = result.op("aten.linalg_matrix_exp")
    assert (op.flops, op.macs) == (expected, macs)


def test_the_matrix_exponential_backward_is_one_of_twice_the_size():
    # PyTorch differentiates exp(A) through exp of the 2n x 2n block matrix [[A^H, G], [0, A^H]]
    a = torch.zeros(2, 3, 3, requires_grad=True)
    result = profile(Fn(lambda x: torch.linalg.matrix_exp(x).sum()), (a,), train=True)
    assert result.uncounted == {}
    # forward: zero matrices (degree 1); backward: blocks [[0, G], [0, 0]] with G all ones, of norm 3: past
    # float's bound 1.46 for degree 12, so scaled by 2^s with s = max(0, ceil(log2(3 / 3.01))) = 0, degree 18
    n = 6
    backward = 2 * n * n + n + 2 * 5 * n**3 + (1 + 5 * 9 + 3) * n * n
    assert result.op("aten.linalg_matrix_exp").flops == 2 * (2 * 9 + 3 + 9) + 2 * backward
