"""Convolutions and their backward pass: every weight meets every window position, padding included."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from .builtin import OpCost, first_tensor, from_macs, register


def conv_macs(weight_shape: Sequence[int], batch: int, spatial: Sequence[int]) -> int:
    """MACs of a convolution: every weight meets every position of ``spatial``.

    ``spatial`` is the output's spatial size for a convolution and the input's for a
    transposed one. The weight's shape already divides channels by ``groups``
    (``(C_out, C_in/groups, *k)``, or ``(C_in, C_out/groups, *k)`` transposed), so
    grouped and depthwise convolutions need no special case.
    """
    return batch * math.prod(spatial) * math.prod(weight_shape)


@register(
    "convolution",
    "_convolution",
    "convolution_overrideable",
    "cudnn_convolution",
    "cudnn_convolution_transpose",
    "mkldnn_convolution",
    "_slow_conv2d_forward",
    "slow_conv3d_forward",
    "slow_conv_transpose2d",
    "slow_conv_transpose3d",
    "slow_conv_dilated2d",
    "slow_conv_dilated3d",
)
def convolution(x: torch.Tensor, weight: torch.Tensor, bias: Any = None, *args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
    out = first_tensor(out_val)
    transposed = _conv_is_transposed(x, weight, out, args, kwargs)
    spatial = x.shape[2:] if transposed else out.shape[2:]
    macs = conv_macs(weight.shape, x.shape[0], spatial)
    return from_macs(macs, out.numel() if bias is not None else 0)


def _conv_is_transposed(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    if "transposed" in kwargs:
        return bool(kwargs["transposed"])
    # convolution(input, weight, bias, stride, padding, dilation, transposed, ...)
    if len(args) >= 4 and isinstance(args[3], bool):
        return args[3]
    # The dedicated transposed kernels take output_padding where others take dilation;
    # their weight's first dimension is C_in, not C_out.
    return weight.shape[0] == x.shape[1] and weight.shape[0] != out.shape[1]


@register("convolution_backward")
def convolution_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
    output_mask: Sequence[bool],
    *_: Any,
    out_val: Any = None,
    **__: Any,
) -> OpCost:
    # grad_input is a (transposed) convolution of grad_out with the weight and
    # grad_weight a convolution of the input with grad_out: each does exactly the
    # forward's multiply-accumulates, whatever ``groups`` is.
    spatial = x.shape[2:] if transposed else grad_out.shape[2:]
    forward_macs = conv_macs(weight.shape, x.shape[0], spatial)
    macs = forward_macs * (int(output_mask[0]) + int(output_mask[1]))
    bias_grad_adds = grad_out.numel() if output_mask[2] else 0
    return from_macs(macs, bias_grad_adds)
