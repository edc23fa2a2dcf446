"""Meta kernels of the CUDA ops PyTorch has none for, so that fake tensors can run them on a target."""

from __future__ import annotations

from typing import Any

import torch

from ..fake import input_gradient_meta


def _transform_bias_rescale_qkv_meta(qkv: torch.Tensor, bias: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, ...]:
    batch, seq, packed = qkv.shape
    head = packed // 3 // num_heads
    q, k, v = qkv.new_empty((3, batch, num_heads, seq, head)).unbind(0)  # one buffer, as the kernel writes it
    return q, k, v


def _masked_softmax_meta(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, mask_type: int | None = None) -> torch.Tensor:
    return torch.empty_like(x)


def _cudnn_grid_sampler_meta(input: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """aten/src/ATen/native/cudnn/GridSampler.cpp: a contiguous [N, C, H_out, W_out] output."""
    return input.new_empty((input.shape[0], input.shape[1], grid.shape[1], grid.shape[2]))


def _cudnn_grid_sampler_backward_meta(input: torch.Tensor, grid: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both gradients, always (cuDNN has no output mask), contiguous."""
    return input.new_empty(input.shape), grid.new_empty(grid.shape)


GRU_WORKSPACE = 5  # what the fused GRU cell keeps per hidden unit: 3 gates, hx, and hn + its bias


def _fused_gru_cell_meta(
    input_gates: torch.Tensor, hidden_gates: torch.Tensor, hx: torch.Tensor, *biases: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """aten/src/ATen/native/cuda/RNN.cu, ``_thnn_fused_gru_cell_cuda``: hy and the workspace."""
    batch, hidden = hx.shape
    return torch.empty_like(hx, memory_format=torch.contiguous_format), hx.new_empty((batch, GRU_WORKSPACE * hidden))


def _fused_gru_cell_backward_meta(grad_hy: torch.Tensor, workspace: torch.Tensor, has_bias: bool) -> tuple[torch.Tensor | None, ...]:
    """The gates' gradients (input and hidden side), hx's, and the biases' (the gates' sums)."""
    batch, hidden = workspace.shape[0], workspace.shape[1] // GRU_WORKSPACE
    gates = (workspace.new_empty((batch, 3 * hidden)), workspace.new_empty((batch, 3 * hidden)))
    biases = (workspace.new_empty((3 * hidden,)), workspace.new_empty((3 * hidden,))) if has_bias else (None, None)
    return (*gates, torch.empty_like(grad_hy, memory_format=torch.contiguous_format), *biases)


def _cudnn_ctc_loss_meta(log_probs: torch.Tensor, *_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """cuDNN's CTC: the loss per sequence, and the gradient, computed in the forward pass."""
    return log_probs.new_empty((log_probs.shape[1],)), torch.empty_like(log_probs, memory_format=torch.contiguous_format)


# meta kernels of the CUDA ops that PyTorch has none for: those of the fused paths; cuDNN's grid
# sampler, which ``grid_sample`` calls on CUDA for bilinear, zero-padded, corner-aligned 2-d sampling
# (aten/src/ATen/native/GridSampler.cpp, ``grid_sampler``); the fused GRU cell ``nn.GRUCell`` runs
# on CUDA (aten/src/ATen/native/RNN.cpp); backward kernels whose gradient has the input's shape
META_KERNELS = {
    "_transform_bias_rescale_qkv": _transform_bias_rescale_qkv_meta,
    "_masked_softmax": _masked_softmax_meta,
    "cudnn_grid_sampler": _cudnn_grid_sampler_meta,
    "cudnn_grid_sampler_backward": _cudnn_grid_sampler_backward_meta,
    "_thnn_fused_gru_cell": _fused_gru_cell_meta,
    "_thnn_fused_gru_cell_backward": _fused_gru_cell_backward_meta,
    "_cudnn_ctc_loss": _cudnn_ctc_loss_meta,
    "_cudnn_ctc_loss.Tensor": _cudnn_ctc_loss_meta,
    "multi_margin_loss_backward": input_gradient_meta,
    "multilabel_margin_loss_backward": input_gradient_meta,
    "fractional_max_pool3d_backward": input_gradient_meta,
}
