"""Recurrent layers against hand formulas, on the fused CPU kernels and the unfused paths.

Per step, sample, layer and direction the gates cost gates * (input + hidden) MACs,
with gates = 4H for an LSTM, 3H for a GRU and H for a plain RNN.
"""

import pytest
import torch
from torch import nn

from pytest_modelprof import profile

T, N, I, H = 7, 3, 10, 16


def recurrent_macs(gates_per_hidden, layers, directions):
    total = 0
    for layer in range(layers):
        layer_input = I if layer == 0 else H * directions
        total += directions * T * N * gates_per_hidden * H * (layer_input + H)
    return total


@pytest.mark.parametrize("layers, bidirectional", [(1, False), (2, True), (3, False)])
def test_lstm_macs(layers, bidirectional):
    lstm = nn.LSTM(I, H, num_layers=layers, bidirectional=bidirectional)
    result = profile(lstm, torch.randn(T, N, I))
    assert result.uncounted == {}
    assert result.macs == recurrent_macs(4, layers, 2 if bidirectional else 1)


def test_lstm_flops_by_hand():
    lstm = nn.LSTM(I, H)
    result = profile(lstm, torch.randn(T, N, I))
    assert "aten.mkldnn_rnn_layer" in {op.op for op in result.ops}
    steps = T * N
    gate_matmuls = 2 * steps * 4 * H * (I + H)
    gate_adds = steps * 4 * H * 3  # W_ih x + W_hh h, plus two biases
    # sigmoid x3 and tanh on the gates, c' = f*c + i*g (3), h' = o * tanh(c') (2)
    cell = steps * H * (4 + 3 + 2)
    assert result.flops == gate_matmuls + gate_adds + cell


def test_lstm_batch_first_matches_sequence_first():
    a = profile(nn.LSTM(I, H), torch.randn(T, N, I))
    b = profile(nn.LSTM(I, H, batch_first=True), torch.randn(N, T, I))
    assert a.flops == b.flops


def test_lstm_backward_is_twice_forward():
    lstm = nn.LSTM(I, H, num_layers=2)
    result = profile(lstm, torch.randn(T, N, I), train=True)
    assert result.backward_macs == 2 * result.forward_macs


@pytest.mark.parametrize("layers, bidirectional", [(1, False), (2, True)])
def test_gru_macs(layers, bidirectional):
    gru = nn.GRU(I, H, num_layers=layers, bidirectional=bidirectional)
    result = profile(gru, torch.randn(T, N, I))
    assert result.uncounted == {}
    assert result.macs == recurrent_macs(3, layers, 2 if bidirectional else 1)


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_rnn_macs(nonlinearity):
    rnn = nn.RNN(I, H, num_layers=2, nonlinearity=nonlinearity)
    result = profile(rnn, torch.randn(T, N, I))
    assert result.uncounted == {}
    assert result.macs == recurrent_macs(1, 2, 1)


@pytest.mark.parametrize("cell, gates", [(nn.LSTMCell, 4), (nn.GRUCell, 3), (nn.RNNCell, 1)])
def test_cells(cell, gates):
    result = profile(cell(I, H), torch.randn(N, I))
    assert result.uncounted == {}
    assert result.macs == N * gates * H * (I + H)
