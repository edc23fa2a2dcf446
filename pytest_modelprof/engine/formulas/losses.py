"""Losses: CTC's lattice, the per-element losses, margin losses and the negative log-likelihood."""

from __future__ import annotations

from typing import Any

import torch

from ..ops import REGISTRY, bound_arguments
from .builtin import BUILTIN, Formula, OpCost, aten, from_values, register, set_formula
from .reductions import reduction

# CTC (aten/src/ATen/native/LossCTC.cpp, cuda/LossCTC.cu): dynamic programming over a lattice of
# input steps x the target extended with blanks (2 L + 1 positions). Each forward variable is a
# 3-way log-sum-exp of the previous step's plus a log-probability: 13 (2 comparisons for the max,
# 3 subtractions, 3 exps, 2 adds, a log, adding back the max and the log-probability). The backward
# pass computes the backward variables alike (13) and folds alpha + beta into the gradient of the
# label each position holds with a 2-way log-sum-exp (9 with the sum); then each gradient element
# is exp(lp) - exp(lcab + nll - lp), times the loss's gradient: 6. ATen's kernels span the padded
# lattice (every sequence to the longest target, the shape of ``log_alpha``); cuDNN's, which also
# makes the gradient in its forward pass, each sequence's own (concatenated targets: sum(2 L + 1)).
CTC_CELL, CTC_GRADIENT_CELL, CTC_GRADIENT_ELEMENT = 13, 9, 6


@register("_ctc_loss")
def ctc_loss(log_probs: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost | None:
    if out_val is None:
        return None
    return OpCost(CTC_CELL * out_val[1].numel())


@register("_ctc_loss_backward")
def ctc_loss_backward(grad: torch.Tensor, log_probs: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    log_alpha = args[4]  # (targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha, ...)
    return OpCost((CTC_CELL + CTC_GRADIENT_CELL) * log_alpha.numel() + CTC_GRADIENT_ELEMENT * log_probs.numel())


@register("_cudnn_ctc_loss")
def cudnn_ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    lattice = log_probs.shape[0] * (2 * targets.numel() + log_probs.shape[1])
    return OpCost((2 * CTC_CELL + CTC_GRADIENT_CELL) * lattice + CTC_GRADIENT_ELEMENT * log_probs.numel())


def _loss_backward(per_element: int) -> Formula:
    def formula(grad_out: torch.Tensor, x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(per_element * x.numel())

    return formula


# Margin losses over classes (aten/src/ATen/native/LossMulti*.cpp), per sample of C scores. The
# multi-class margin loss: each non-target class j a hinge z = margin - x[y] + x[j] (2), its test
# (1), a square for p = 2, the weight, the sum (1); a divide per sample and the reduction. Its
# backward: the same hinge and test, the gradient (2 for p = 2: 2 g z), the weight, an update of the
# target's gradient (1), then a multiply by the incoming gradient per score. The multi-label one:
# the hinge of every (listed target, non-target class) pair (z, test, sum: 4; backward: z, test and
# two updates: 5), pairs that the target lists (read where the run has their values) decide.
def _scores(x: torch.Tensor) -> tuple[int, int]:
    """A margin loss's samples and classes per sample."""
    classes = x.shape[-1] if x.dim() else 1
    return x.numel() // max(classes, 1), classes


def _multi_margin(backward: bool) -> Formula:
    packet = aten.multi_margin_loss_backward if backward else aten.multi_margin_loss

    def formula(*args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
        bound = bound_arguments(packet.default, args, kwargs)
        samples, classes = _scores(bound["self"])
        square, weighted = bound["p"] == 2, bound["weight"] is not None
        if backward:
            return OpCost(samples * (classes - 1) * (4 + 2 * square + weighted) + bound["self"].numel())
        return OpCost(samples * (classes - 1) * (4 + square + weighted) + samples + (samples if bound["reduction"] else 0))

    return formula


set_formula("multi_margin_loss", _multi_margin(backward=False))
set_formula("multi_margin_loss_backward", _multi_margin(backward=True))


@from_values
def _label_pairs(target: torch.Tensor) -> int:
    """(listed target, non-target class) pairs of a multi-label margin loss: a sample's targets are its
    row's class indices up to the first negative one; None where the run does not have the values."""
    pairs = 0
    for row in target.reshape(-1, target.shape[-1] if target.dim() else 1).tolist():
        listed = row[: next((i for i, c in enumerate(row) if c < 0), len(row))]
        pairs += len(listed) * (len(row) - len(set(listed)))
    return pairs


@register("multilabel_margin_loss_forward")
def multilabel_margin_loss(x: torch.Tensor, target: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any) -> OpCost | None:
    pairs = _label_pairs(target)
    if pairs is None:
        return None
    samples, _ = _scores(x)
    reduced = bound_arguments(aten.multilabel_margin_loss_forward.default, (x, target, *args), kwargs)["reduction"]
    return OpCost(4 * pairs + samples + (samples if reduced else 0))


@register("multilabel_margin_loss_backward")
def multilabel_margin_loss_backward(
    grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, *_: Any, out_val: Any = None, **__: Any
) -> OpCost | None:
    pairs = _label_pairs(target)
    return None if pairs is None else OpCost(5 * pairs + x.numel())


BUILTIN.update(  # the per-element losses and their backward ops
    {
        packet: (_loss_backward if info.name.endswith("_backward") else reduction)(info.flops_per_element)
        for packet, info in REGISTRY.items()
        if info.family == "loss" and info.flops_per_element
    }
)


@register("nll_loss_forward", "nll_loss2d_forward")
def nll_loss(x: torch.Tensor, target: torch.Tensor, weight: Any = None, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # one gathered value per target, summed (and weighted)
    return OpCost(target.numel() * (1 + int(weight is not None)))


@register("nll_loss_backward", "nll_loss2d_backward")
def nll_loss_backward(grad_out: torch.Tensor, x: torch.Tensor, target: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(target.numel())
