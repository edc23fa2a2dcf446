"""Dense linear algebra, as LAPACK's algorithms count."""

from __future__ import annotations

import math
from typing import Any

import torch

from .builtin import Formula, OpCost, first_tensor, from_values, register, set_formula


# Dense linear algebra, as LAPACK's algorithms count (Golub & Van Loan, Matrix Computations, one
# FLOP per floating-point add, multiply or divide), per matrix of the batch: n x n unless said.
def _square(a: torch.Tensor) -> tuple[int, int]:
    return math.prod(a.shape[:-2]), a.shape[-1]


def _tall(a: torch.Tensor) -> tuple[int, int, int]:
    """The batch, and an m x n matrix's dimensions in its tall orientation (m >= n)."""
    m, n = a.shape[-2:]
    return math.prod(a.shape[:-2]), max(m, n), min(m, n)


@register("linalg_cholesky_ex", "cholesky")
def cholesky(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, n = _square(a)
    return OpCost(batch * n**3 // 3)


@register("linalg_lu_factor_ex", "linalg_lu")
def lu_factor(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, m, n = _tall(a)
    return OpCost(batch * (m * n * n - n**3 // 3))  # 2n^3/3 for a square matrix


# a solve with a factored matrix: each right-hand side column costs n^2 per triangle, so 2n (LU) or n
# (one triangle) per element of the solution
def _factored_solve(matrix_at: int, triangles: int) -> Formula:
    """``matrix_at``: the factored matrix's argument (before or after the right-hand side)."""

    def formula(*args: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(triangles * args[matrix_at].shape[-1] * first_tensor(out_val).numel())

    return formula


set_formula("linalg_lu_solve", _factored_solve(0, 2))
set_formula("lu_solve", _factored_solve(1, 2))
set_formula("linalg_solve_triangular", _factored_solve(0, 1))
set_formula("triangular_solve", _factored_solve(1, 1))


@register("_linalg_solve_ex")
def solve(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, n = _square(a)
    return OpCost(batch * (2 * n**3 // 3) + 2 * n * first_tensor(out_val).numel())  # LU, then the two triangles


@register("linalg_inv_ex", "inverse")
def inverse(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, n = _square(a)
    return OpCost(batch * 2 * n**3)  # LU (2n^3/3) and the inverse from it (4n^3/3)


@register("_linalg_det", "_linalg_slogdet", "logdet")
def determinant(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, n = _square(a)
    return OpCost(batch * (2 * n**3 // 3 + n))  # LU, then the product of the diagonal


# (what was computed is read from the outputs: PyTorch drops arguments equal to their defaults, and
# computes vectors it may need for a gradient, which it assumes whenever a dispatch mode is active)
@register("linalg_qr")
def qr(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, m, n = _tall(a)
    q = out_val[0]
    r = 2 * n * n * (m - n // 3)  # Householder, 2n^2(m - n/3)
    if q.numel() == 0:  # mode="r"
        return OpCost(batch * r)
    complete = q.shape[-1] > n
    return OpCost(batch * (r + (4 * (m * m * n - m * n * n + n**3 // 3) if complete else r)))


# The matrix exponential (aten/src/ATen/native/LinearAlgebra.cpp, mexp): each matrix's 1-norm (an
# absolute value and an add per element, a compare per column) picks a Taylor polynomial of degree
# 1, 2, 4, 8, 12 or 18, which costs the matrix products and linear combinations of Bader, Blanes
# and Casas's scheme; a norm above the last bound scales the matrix down by 2^s (a divide per
# element), takes degree 18 and squares the result s times. The norm is a value: counted where the
# run has it. Per degree: (bound in float, in double), matrix products, other FLOPs per element.
_MATRIX_EXP_DEGREES = (
    ((1.192092800768788e-07, 2.220446049250313e-16), 0, 1),  # sum of {I, A}
    ((5.978858893805233e-04, 2.580956802971767e-08), 1, 3),  # a halving, sum of 3
    ((5.116619363445086e-02, 3.397168839976962e-04), 2, 12),  # combinations of 3 and 4
    ((5.800524627688768e-01, 4.991228871115323e-02), 3, 22),  # combinations of 2, 2, 4, 5
    ((1.461661507209034e00, 2.996158913811580e-01), 4, 31),  # 4 combinations of 4, 3 adds
    ((3.010066362817634e00, 1.090863719290036e00), 5, 48),  # 5 combinations of 5, 3 adds
)


@from_values
def _matrix_1_norms(a: torch.Tensor) -> list[float]:
    return a.reshape(-1, *a.shape[-2:]).abs().sum(-2).amax(-1).tolist()


@register("linalg_matrix_exp")
def matrix_exp(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost | None:
    n = a.shape[-1]
    if n <= 1:
        return OpCost(a.numel())  # an exp per element
    norms = _matrix_1_norms(a)
    if norms is None:
        return None
    single = a.dtype in (torch.float32, torch.complex64)
    bounds = [bound[0 if single else 1] for bound, _, _ in _MATRIX_EXP_DEGREES]
    products, other = 0, len(norms) * (2 * n * n + n)
    for norm in norms:
        for i, (_, degree_products, degree_other) in enumerate(_MATRIX_EXP_DEGREES[:-1]):
            if (bounds[i - 1] if i else -1.0) < norm <= bounds[i]:
                products, other = products + degree_products, other + degree_other * n * n
        if norm >= bounds[-2]:  # scaled by 2^s, degree 18, squared s times
            squarings = max(0, math.ceil(math.log2(norm / bounds[-1]))) if norm > 0 else 0
            products += _MATRIX_EXP_DEGREES[-1][1] + squarings
            other += (_MATRIX_EXP_DEGREES[-1][2] + 1) * n * n
    macs = products * n**3
    return OpCost(2 * macs + other, macs)


@register("_linalg_eigh")
def eigh(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, n = _square(a)
    vectors = out_val[1].numel() > 0
    return OpCost(batch * (9 * n**3 if vectors else 4 * n**3 // 3))  # tridiagonal QR


@register("linalg_eig", "_linalg_eigvals")
def eig(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, n = _square(a)
    vectors = isinstance(out_val, (tuple, list)) and len(out_val) > 1 and out_val[1].numel() > 0
    return OpCost(batch * (25 if vectors else 10) * n**3)  # Hessenberg QR


@register("_linalg_svd")
def svd(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, m, n = _tall(a)  # Golub-Kahan-Reinsch on the tall orientation
    u, vh = out_val[0], out_val[2]
    if u.numel() == 0:  # values only
        flops = 4 * m * n * n - 4 * n**3 // 3
    elif max(u.shape[-1], vh.shape[-2]) > n:  # full matrices
        flops = 4 * m * m * n + 8 * m * n * n + 9 * n**3
    else:
        flops = 14 * m * n * n + 8 * n**3
    return OpCost(batch * flops)
