"""CTC loss: FLOPs by hand, analytic runs against real ones, and the kernel CUDA picks on a target.

The lattice of a sequence spans its input steps x its target extended with blanks (2 L + 1):
13 FLOPs per forward variable (a 3-way log-sum-exp plus the log-probability), in the backward
pass 13 per backward variable and 9 to fold alpha + beta into the gradient, and 6 per gradient
element (see engine/formulas/losses.py).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pytest_modelprof import ProfileError, profile
from pytest_modelprof.engine.targets.scratch.losses import ctc_scratch

T, B, C = 30, 4, 20  # input steps, sequences, classes (blank 0)


class Recogniser(nn.Module):
    def __init__(self, blank=0):
        super().__init__()
        self.head = nn.Linear(16, C)
        self.blank = blank

    def forward(self, x, targets, input_lengths, target_lengths):
        return F.ctc_loss(self.head(x).log_softmax(2), targets, input_lengths, target_lengths, blank=self.blank)


def inputs(lengths=(10, 8, 9, 7), padded=False, dtype=torch.long, input_lengths=None):
    x = torch.randn(T, B, 16)
    labels = [torch.randint(1, C, (n,), dtype=dtype) for n in lengths]
    targets = torch.nn.utils.rnn.pad_sequence(labels, batch_first=True) if padded else torch.cat(labels)
    il = torch.tensor(input_lengths or [T] * B, dtype=dtype)
    return x, targets, il, torch.tensor(lengths, dtype=dtype)


def ctc_flops(result):
    return {op.op: op.flops for op in result.ops if "ctc" in op.op}


@pytest.mark.parametrize("padded", [True, False])
def test_ctc_by_hand(padded):
    result = profile(Recogniser(), inputs(padded=padded), train=True)
    assert result.uncounted == {}
    lattice = B * T * (2 * 10 + 1)  # every sequence to the longest target, as log_alpha holds them
    assert ctc_flops(result) == {"aten._ctc_loss": 13 * lattice, "aten._ctc_loss_backward": (13 + 9) * lattice + 6 * T * B * C}


@pytest.mark.parametrize("padded", [True, False])
def test_an_analytic_ctc_step_is_the_real_one(padded):
    # the longest concatenated target is read from the lengths the caller passes (known values)
    model = Recogniser()
    real = profile(model, inputs(padded=padded), train=True)
    analytic = profile(model, inputs(padded=padded), train=True, device="meta")
    assert (analytic.flops, analytic.memory.peak_bytes) == (real.flops, real.memory.peak_bytes)
    assert analytic.memory.category_max == real.memory.category_max


def test_an_analytic_ctc_with_lengths_it_cannot_know_says_so():
    class Drawn(Recogniser):
        def forward(self, x, targets, input_lengths, target_lengths):
            drawn = torch.randint(5, 10, (B,))  # random lengths: no value an analytic run can know
            return super().forward(x, targets, input_lengths, drawn)

    with pytest.raises(ProfileError, match="reads the values of a tensor"):
        profile(Drawn(), inputs(), train=True, device="meta")


def test_a_cuda_target_takes_cudnns_ctc_where_cuda_would():
    # int32 concatenated targets, blank 0, every target under 256 and no longer than its input:
    # cuDNN's kernel, which makes the gradient in the forward pass, over each sequence's own lattice
    lengths = (10, 8, 9, 7)
    result = profile(Recogniser(), inputs(lengths, dtype=torch.int32, input_lengths=[30, 25, 30, 20]), train=True, target="h100")
    assert result.uncounted == {}
    lattice = T * sum(2 * n + 1 for n in lengths)
    assert ctc_flops(result) == {"aten._cudnn_ctc_loss": (2 * 13 + 9) * lattice + 6 * T * B * C}
    # the gradient cuDNN returns is kept for the backward pass, beside the log-probabilities
    assert result.memory.category_max["activations"] >= 2 * T * B * C * 4


@pytest.mark.parametrize(
    ("why", "lengths", "dtype", "blank", "input_lengths"),
    [
        ("int64 targets", (10, 8, 9, 7), torch.long, 0, None),
        ("a blank other than 0", (10, 8, 9, 7), torch.int32, 3, None),
        ("a target longer than its input", (10, 8, 9, 7), torch.int32, 0, [30, 25, 30, 6]),
    ],
)
def test_a_cuda_target_takes_atens_ctc_elsewhere(why, lengths, dtype, blank, input_lengths):
    result = profile(Recogniser(blank), inputs(lengths, dtype=dtype, input_lengths=input_lengths), train=True, target="h100")
    assert result.uncounted == {}
    assert set(ctc_flops(result)) == {"aten._ctc_loss", "aten._ctc_loss_backward"}, why


def test_ctcs_backward_kernel_holds_the_backward_variables():
    # LossCTC.cu: each sequence's target offset, target length and input length (int64), and
    # log_beta, the shape of log_alpha
    backward = torch.ops.aten._ctc_loss_backward.default
    log_probs, log_alpha = torch.empty(T, B, C, device="meta"), torch.empty(B, T, 21, device="meta")
    args = (torch.empty(B, device="meta"), log_probs, torch.empty(B, 10, dtype=torch.long, device="meta"), [T] * B, [10] * B)
    args += (torch.empty(B, device="meta"), log_alpha, 0, False)
    assert ctc_scratch("aten._ctc_loss_backward", backward, args, {}) == [8 * B] * 3 + [B * T * 21 * 4]
