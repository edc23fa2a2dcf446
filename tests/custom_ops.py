"""A custom op with no built-in FLOP formula, for the extensibility tests."""

import torch
from torch import nn


@torch.library.custom_op("modelprof_test::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


class UsesCustomOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, bias=False)

    def forward(self, x):
        return scaled_tanh(self.lin(x), 2.0)


def scaled_tanh_flops(x, scale, *, out_val):
    return 2 * out_val.numel()  # tanh, then the multiply
