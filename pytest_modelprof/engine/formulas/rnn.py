"""Recurrent layers (oneDNN's and cuDNN's kernels) and the fused LSTM and GRU cells of CUDA."""

from __future__ import annotations

from typing import Any

import torch

from .builtin import Formula, OpCost, register, set_formula

# mode numbers of ATen's RNN kernels, and the elementwise work of one cell per
# hidden unit after the gate matmuls and the sum of their two halves:
# LSTM: 3 sigmoids + tanh on the gates, c' = f*c + i*g (3), h' = o*tanh(c') (2)
# GRU: 2 sigmoids, n = tanh(x_n + r*h_n) (3), h' = (1-z)*n + z*h (4)
RNN_CELL_FLOPS = {0: 1, 1: 1, 2: 9, 3: 9}  # RNN_RELU, RNN_TANH, LSTM, GRU


def rnn_layer_cost(steps_times_batch: int, gate_rows: int, input_size: int, hidden_size: int, mode: int, has_biases: bool) -> OpCost:
    """One direction of one recurrent layer over a sequence.

    MACs per step and sample: ``W_ih x`` and ``W_hh h``, i.e. ``gates * (input + hidden)``.
    FLOPs add the sum of the two matmuls and two biases per gate row, then the cell.
    """
    macs = steps_times_batch * gate_rows * (input_size + hidden_size)
    adds = steps_times_batch * gate_rows * (1 + 2 * int(has_biases))
    cell = steps_times_batch * hidden_size * RNN_CELL_FLOPS.get(mode, 1)
    return OpCost(2 * macs + adds + cell, macs)


@register("mkldnn_rnn_layer")
def mkldnn_rnn_layer(x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (input, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, batch_sizes, mode, hidden_size, num_layers, has_biases, ...)
    mode, hidden_size, has_biases = args[6], args[7], args[9]
    steps_times_batch = x.numel() // x.shape[-1]
    return rnn_layer_cost(steps_times_batch, w_ih.shape[0], w_ih.shape[1], hidden_size, mode, has_biases)


@register("mkldnn_rnn_layer_backward")
def mkldnn_rnn_layer_backward(
    x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, *args: Any, out_val: Any = None, **__: Any
) -> OpCost:
    # Gradients for inputs/hidden states and for both weight matrices: twice the
    # forward's MACs; the cell's backward is counted as twice its forward.
    mode, hidden_size, has_biases = args[11], args[12], args[14]
    steps_times_batch = x.numel() // x.shape[-1]
    forward = rnn_layer_cost(steps_times_batch, w_ih.shape[0], w_ih.shape[1], hidden_size, mode, has_biases)
    return OpCost(2 * forward.flops, 2 * forward.macs)


@register("_cudnn_rnn")
def cudnn_rnn(x: torch.Tensor, weights: list[torch.Tensor], weight_stride0: int, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (input, weight, weight_stride0, weight_buf, hx, cx, mode, hidden_size, proj_size, num_layers, ...)
    return _cudnn_rnn_cost(x, weights, weight_stride0, args[3])


def _cudnn_rnn_cost(x: torch.Tensor, weights: list[torch.Tensor], weight_stride0: int, mode: int) -> OpCost:
    """Every layer and direction of the whole stack in one call; the weights come in groups of
    ``weight_stride0``: w_ih, w_hh (, b_ih, b_hh) (, w_hr)."""
    steps_times_batch = x.numel() // x.shape[-1]
    has_biases = weight_stride0 in (4, 5)
    flops = macs = 0
    for start in range(0, len(weights), weight_stride0):
        w_ih, w_hh = weights[start], weights[start + 1]
        cost = rnn_layer_cost(steps_times_batch, w_ih.shape[0], w_ih.shape[1], w_hh.shape[1], mode, has_biases)
        flops, macs = flops + cost.flops, macs + cost.macs
        if weight_stride0 in (3, 5):  # the projection of LSTM's hidden state (proj_size)
            w_hr = weights[start + weight_stride0 - 1]
            flops, macs = flops + 2 * steps_times_batch * w_hr.numel(), macs + steps_times_batch * w_hr.numel()
    return OpCost(flops, macs)


@register("_cudnn_rnn_backward")
def cudnn_rnn_backward(
    x: torch.Tensor, weights: list[torch.Tensor], weight_stride0: int, *args: Any, out_val: Any = None, **__: Any
) -> OpCost:
    # (input, weight, weight_stride0, weight_buf, hx, cx, output, grad_output, grad_hy, grad_cy, mode, ...):
    # as mkldnn_rnn_layer_backward, twice the forward
    forward = _cudnn_rnn_cost(x, weights, weight_stride0, args[7])
    return OpCost(2 * forward.flops, 2 * forward.macs)


# The fused cells CUDA runs for nn.LSTMCell and nn.GRUCell (aten/src/ATen/native/cuda/RNN.cu), after
# the two gate matmuls (counted as mm): forward as a recurrent layer's cell above (the sum of
# the gate halves and biases, then the cell); backward as the kernels compute it, per hidden unit:
# LSTM 23 (tanh(c') and the output gate's product 2, c's gradient 5, the gates' products 4, the
# sigmoid and tanh derivatives 3 each), GRU 16 (the update gate's 5, hx's 1, the new gate's 5, its
# hidden half's 1, the reset gate's 4); with biases, their gradients summed over the batch.
FUSED_CELL_BACKWARD_FLOPS = {2: 23, 3: 16}  # LSTM, GRU


def _fused_cell(mode: int) -> Formula:
    def formula(input_gates: torch.Tensor, hidden_gates: torch.Tensor, state: torch.Tensor, *biases: Any, **__: Any) -> OpCost:
        has_biases = any(isinstance(b, torch.Tensor) for b in biases)
        return OpCost(input_gates.numel() * (1 + 2 * int(has_biases)) + state.numel() * RNN_CELL_FLOPS[mode])

    return formula


set_formula("_thnn_fused_lstm_cell", _fused_cell(2))
set_formula("_thnn_fused_gru_cell", _fused_cell(3))


@register("_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_lstm_cell_backward")
def fused_lstm_cell_backward(
    grad_hy: Any, grad_cy: Any, cx: torch.Tensor, cy: torch.Tensor, workspace: torch.Tensor, has_bias: bool, **__: Any
) -> OpCost:
    return OpCost(cx.numel() * FUSED_CELL_BACKWARD_FLOPS[2] + (workspace.numel() if has_bias else 0))


@register("_thnn_fused_gru_cell_backward")
def fused_gru_cell_backward(grad_hy: torch.Tensor, workspace: torch.Tensor, has_bias: bool, **__: Any) -> OpCost:
    return OpCost(grad_hy.numel() * FUSED_CELL_BACKWARD_FLOPS[3] + (2 * 3 * grad_hy.numel() if has_bias else 0))
