"""FLOP formulas: one small pure function per ATen op, by op family, in a decorator registry.

A multiply-accumulate (MAC) is 2 FLOPs; MACs are counted for the matrix-like ops only (products,
convolutions, attention, the gate products of recurrent kernels); FLOPs add every other arithmetic
step (bias and accumulator adds, elementwise work, a transcendental function being one step), and
data movement, creation and random numbers cost 0. The full counting convention, op by op, is in
docs/flops.md.

Each formula takes the op's arguments as the op received them, plus ``out_val``
(the op's output), and returns an :class:`OpCost`, a plain ``int`` (FLOPs, no
MACs), or ``None`` when this particular call cannot be counted (it is then listed
as uncounted). Formulas never run the op, and they count from shapes, so they work
unchanged on real, meta and fake tensors; the few ops whose work follows their
operands' values (variable-length attention's offsets, an adaptive RoI grid, the
matrix exponential's Taylor degree) read them on real tensors and are listed as
uncounted where the run has none.

Adding an op is one decorated function (``@register("op_name")``) in its family's module;
what an op *is* (view, elementwise, reduction, ...) is the op registry's (:mod:`..ops`).
"""

from . import (  # noqa: F401  (each family module registers its formulas when imported)
    attention,
    conv,
    flex,
    indexing,
    linalg,
    losses,
    matmul,
    norm,
    optim,
    pointwise,
    pool,
    quantized,
    reductions,
    rnn,
    selection,
    signal,
    vision,
)
from .attention import attention_backward_cost, attention_cost, causal_scores
from .builtin import BUILTIN, NAMED, Formula, OpCost
from .conv import conv_macs
from .registry import FormulaTable, cost_of, formula_for, register_flop_formula, unregister_flop_formula

__all__ = [
    "BUILTIN",
    "NAMED",
    "Formula",
    "FormulaTable",
    "OpCost",
    "attention_backward_cost",
    "attention_cost",
    "causal_scores",
    "conv_macs",
    "cost_of",
    "formula_for",
    "register_flop_formula",
    "unregister_flop_formula",
]
