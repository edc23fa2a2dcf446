"""Normalisation layers: statistics, normalise, affine; and weight normalisation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .builtin import OpCost, register


def _norm_forward(x: torch.Tensor, statistics: bool, weight: Any, bias: Any) -> OpCost:
    per_element = 2 + 4 * int(statistics) + int(weight is not None) + int(bias is not None)
    return OpCost(per_element * x.numel())


def _norm_backward(x: torch.Tensor, statistics: bool, output_mask: Sequence[bool]) -> OpCost:
    # grad_input: with batch statistics two row sums and the combination (7), else a scale (2);
    # grad_weight: normalised input times grad, summed (2); grad_bias: a sum (1).
    per_element = (7 if statistics else 2) * int(output_mask[0]) + 2 * int(output_mask[1]) + int(output_mask[2])
    return OpCost(per_element * x.numel())


@register("native_batch_norm", "_native_batch_norm_legit", "cudnn_batch_norm", "miopen_batch_norm")
def batch_norm(
    x: torch.Tensor, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: bool, *_: Any, out_val: Any = None, **__: Any
) -> OpCost:
    return _norm_forward(x, bool(training), weight, bias)


@register("_native_batch_norm_legit_no_training", "_batch_norm_no_update")
def batch_norm_inference(x: torch.Tensor, weight: Any, bias: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return _norm_forward(x, False, weight, bias)


@register("_batch_norm_with_update", "_native_batch_norm_legit_functional")
def batch_norm_training(x: torch.Tensor, weight: Any, bias: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return _norm_forward(x, True, weight, bias)


@register("native_batch_norm_backward")
def batch_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask)
    return _norm_backward(x, bool(args[5]), args[7])


@register("batch_norm_backward")
def batch_norm_backward_v2(grad_out: torch.Tensor, x: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask, reserve)
    return _norm_backward(x, bool(args[5]), args[7])


@register("cudnn_batch_norm_backward", "miopen_batch_norm_backward")
def cudnn_batch_norm_backward(x: torch.Tensor, grad_out: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (input, grad_output, weight, running_mean, running_var, save_mean, save_var, eps[, reserve]): every
    # gradient is computed; with the batch's statistics when the forward saved them (training)
    save_mean = args[3]
    return _norm_backward(x, save_mean is not None and save_mean.numel() > 0, (True, True, True))


@register("native_layer_norm")
def layer_norm(x: torch.Tensor, shape: Any, weight: Any = None, bias: Any = None, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return _norm_forward(x, True, weight, bias)


@register("native_layer_norm_backward")
def layer_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
    return _norm_backward(x, True, args[5])


@register("native_group_norm")
def group_norm(x: torch.Tensor, weight: Any, bias: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return _norm_forward(x, True, weight, bias)


@register("native_group_norm_backward")
def group_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask)
    return _norm_backward(x, True, args[7])


@register("_fused_rms_norm")
def rms_norm(x: torch.Tensor, shape: Any, weight: Any = None, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # square 1, mean 1, multiply by the reciprocal root 1, weight 1
    return OpCost((3 + int(weight is not None)) * x.numel())


@register("_fused_rms_norm_backward")
def rms_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # grad_input: one row sum and the combination (5); grad_weight: multiply and sum (2)
    output_mask = args[-1]
    return OpCost((5 * int(output_mask[0]) + 2 * int(output_mask[1])) * x.numel())


# square and an add for the norm and a multiply, per norm a root and a divide; its backward, per
# element 2 for grad_g (multiply, add) and 3 for grad_v (v times a scale, subtract, multiply), per
# norm 3 divides.
@register("_weight_norm_interface")
def weight_norm(v: torch.Tensor, g: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(3 * v.numel() + 2 * g.numel())


@register("_weight_norm_interface_backward")
def weight_norm_backward(grad_w: torch.Tensor, v: torch.Tensor, g: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(5 * v.numel() + 3 * g.numel())
