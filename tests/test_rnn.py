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


# On a CUDA target the whole stack is one cuDNN kernel, aten._cudnn_rnn ------------------


@pytest.mark.parametrize(
    ("module", "gates"),
    [
        (lambda: nn.LSTM(I, H, num_layers=2, bidirectional=True), 4),
        (lambda: nn.GRU(I, H, num_layers=2), 3),
        (lambda: nn.RNN(I, H, nonlinearity="relu"), 1),
    ],
)
def test_a_cuda_target_runs_the_stack_as_one_cudnn_kernel(module, gates):
    rnn = module()
    layers, directions = rnn.num_layers, 2 if rnn.bidirectional else 1
    result = profile(rnn, torch.randn(T, N, I), train=True, target="h100")
    assert {"aten._cudnn_rnn", "aten._cudnn_rnn_backward"} <= {op.op for op in result.ops}
    assert result.uncounted == {}
    assert result.op("aten._cudnn_rnn").calls == 1
    assert result.forward_macs == recurrent_macs(gates, layers, directions)
    assert result.backward_macs == 2 * result.forward_macs
    # the same layers on the CPU, layer by layer or cell by cell: the same multiply-accumulates
    assert result.forward_macs == profile(module(), torch.randn(T, N, I)).forward_macs


def test_cudnns_lstm_reserve_as_measured_on_an_h100():
    # pytest_modelprof/data/gpu-truth: _cudnn_rnn_backward's reserve for LSTM(512, 1024, 2 layers),
    # batch 32, 256 steps, fp32 was a uint8 tensor of 369,099,008 bytes
    from pytest_modelprof.engine.analytic.cuda.rnn import reserve_bytes

    assert reserve_bytes(2, seq=256, batch=32, hidden=1024, layers=2, directions=1, element=4) == 369_099_008
    lstm = nn.LSTM(512, 1024, 2, batch_first=True)
    result = profile(lstm, torch.randn(32, 256, 512), train=True, target="h100")
    # what the backward pass keeps of the forward: the reserve (in 512-byte blocks), the output,
    # and the initial hidden and cell states (the input is resident anyway)
    output, state = 32 * 256 * 1024 * 4, 2 * 32 * 1024 * 4
    assert result.memory.category_max["activations"] == -(-369_099_008 // 512) * 512 + output + 2 * state


def test_a_cuda_target_runs_recurrent_layers_under_autocast():
    # autocast's own _cudnn_rnn kernel flattens the weights through cuDNN: the casts are done
    # without it, and the low-precision weights are what the backward pass keeps
    lstm = nn.LSTM(I, H, num_layers=2)
    result = profile(lstm, torch.randn(T, N, I), train=True, autocast=torch.bfloat16, target="h100")
    assert result.op("aten._cudnn_rnn").calls == 1 and result.uncounted == {}
    assert result.forward_macs == recurrent_macs(4, 2, 1)
    weights = sum(p.numel() for p in lstm.parameters())
    assert result.op("aten._to_copy", "forward").calls >= len(list(lstm.parameters()))
    assert result.memory.category_max["activations"] >= weights * 2  # the bf16 copies, kept for the backward pass


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    ("cell", "op", "gates", "backward_per_unit", "bias_sums"),
    [
        # LSTM backward per hidden unit (RNN.cu): tanh(c') and the output gate's product 2, c's
        # gradient 5, the gates' products 4, the four gate derivatives 3 each; one sum of the gates
        (nn.LSTMCell, "aten._thnn_fused_lstm_cell", 4, 2 + 5 + 4 + 4 * 3, 1),
        # GRU: the update gate's gradient 5, hx's 1, the new gate's 5, its hidden half's 1, the reset
        # gate's 4; the input-side and hidden-side gate sums apart
        (nn.GRUCell, "aten._thnn_fused_gru_cell", 3, 5 + 1 + 5 + 1 + 4, 2),
    ],
)
def test_a_cuda_target_runs_cells_as_cudas_fused_kernels(cell, op, gates, backward_per_unit, bias_sums, bias):
    result = profile(cell(I, H, bias=bias), torch.randn(N, I), train=True, target="h100")
    assert result.uncounted == {}
    assert result.forward_macs == N * gates * H * (I + H)  # the gates' two matrix products
    units = N * H
    # the gate halves summed, with both biases; then the cell (LSTM: 3 sigmoids, a tanh, c' = f*c + i*g,
    # h' = o*tanh(c'); GRU by the same convention as nn.GRU's): 9 per hidden unit
    assert result.op(op).flops == N * gates * H * (3 if bias else 1) + 9 * units
    sums = bias_sums * N * gates * H if bias else 0
    assert result.op(op + "_backward" + ("_impl" if cell is nn.LSTMCell else "")).flops == backward_per_unit * units + sums
    # the CPU's unfused cell: the same matrix products
    assert result.forward_macs == profile(cell(I, H, bias=bias), torch.randn(N, I)).forward_macs


class PackedClassifier(nn.Module):
    """Variable-length sequences packed (unsorted), a bidirectional stack, padded back."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn
        self.head = nn.Linear(2 * H, 4)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, lengths = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        return self.head(out).sum(1) / lengths[:, None].to(out.device)  # lengths come on the CPU


LENGTHS = torch.tensor([7, 5, 2])  # N = 3 sequences of at most T = 7 steps


@pytest.mark.parametrize(("module", "gates"), [(nn.LSTM, 4), (nn.GRU, 3)])
def test_packed_sequences_run_analytically(module, gates):
    # the batch sizes a packed sequence carries are read as numbers by the recurrent kernels:
    # worked out from the lengths the caller passes
    model = PackedClassifier(module(I, H, 2, batch_first=True, bidirectional=True))
    inputs = (torch.randn(N, T, I), LENGTHS)
    real = profile(model, inputs, train=True)
    analytic = profile(model, inputs, train=True, device="meta")
    assert analytic.uncounted == {} and analytic.flops == real.flops
    assert analytic.memory.peak_bytes == real.memory.peak_bytes
    # on a CUDA target the stack is one cuDNN call over the packed rows: 14 rows, not 3 x 7
    target = profile(model, inputs, train=True, target="h100")
    assert target.op("aten._cudnn_rnn").calls == 1 and target.uncounted == {}
    rows = int(LENGTHS.sum())
    expected = sum(2 * rows * gates * H * ((I if layer == 0 else 2 * H) + H) for layer in range(2))
    assert target.op("aten._cudnn_rnn").macs == expected
