"""Mixture-of-experts blocks in analytic mode: the router's masks sized by a balanced split."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pytest_modelprof import ProfileError, profile


class TopKMoE(nn.Module):
    """Top-k routing, each expert taking the tokens whose choice it is (torch.where(indices == e))."""

    def __init__(self, d=64, experts=4, k=2):
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(experts))
        self.k = k

    def forward(self, x):
        b, s, d = x.shape
        x = x.reshape(-1, d)
        weights, idx = torch.topk(F.softmax(self.router(x), -1), self.k, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(idx == e)
            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        return out.reshape(b, s, d)


class OneHotMoE(TopKMoE):
    """Mixtral's form: a one_hot of the chosen experts, sliced per expert."""

    def forward(self, x):
        b, s, d = x.shape
        x = x.reshape(-1, d)
        weights, idx = torch.topk(F.softmax(self.router(x), -1), self.k, dim=-1)
        mask = F.one_hot(idx, num_classes=len(self.experts)).permute(2, 1, 0)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            slot, token = torch.where(mask[e])
            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        return out.reshape(b, s, d)


def expert_flops(tokens, k, d=64):
    # every token reaches k experts: two linear layers (with biases) and a GELU per routed token
    return tokens * k * (2 * d * 4 * d + 4 * d + 5 * 4 * d + 2 * 4 * d * d + d)


@pytest.mark.parametrize("block", [TopKMoE, OneHotMoE])
def test_a_moe_block_runs_analytically_with_the_real_runs_figures(block):
    torch.manual_seed(0)
    model, x = block(), torch.randn(2, 32, 64)
    real = profile(model, x, train=True)
    analytic = profile(model, x, train=True, device="meta")
    ran = {row.op for row in analytic.ops}
    assert "aten.nonzero" in ran and analytic.uncounted == {}
    # the routed tokens add up as in the real run, whatever the split: the experts' FLOPs are equal
    experts = [m for m in analytic.modules if m.path.startswith("experts.") and m.path.count(".") == 1]
    assert sum(m.forward_flops for m in experts) == expert_flops(64, 2)
    assert sum(m.forward_flops for m in experts) == sum(
        m.forward_flops for m in real.modules if m.path.startswith("experts.") and m.path.count(".") == 1
    )
    if block is TopKMoE:
        assert analytic.flops == real.flops
    else:  # one_hot's fake kernel compares against arange(C); its CPU kernel scatters
        assert analytic.flops == pytest.approx(real.flops, rel=1e-3)
    # a balanced split: each expert's share of the tokens (a real run's split depends on the data)
    assert {m.forward_flops for m in experts} == {expert_flops(64, 2) // 4}
    assert analytic.peak_memory_bytes == pytest.approx(real.peak_memory_bytes, rel=0.05)


def test_a_moe_block_on_a_gpu_target():
    result = profile(TopKMoE(), torch.randn(2, 32, 64), train=True, target="h100")
    assert result.uncounted == {} and result.predicted.seconds > 0


class DataDependent(nn.Module):
    def forward(self, x):
        return x[torch.where(x > 0)]


def test_other_data_dependent_sizes_are_refused_clearly():
    with pytest.raises(
        ProfileError, match=r"in module '<root>' \(DataDependent\): nonzero \(or torch.where\(mask\)\) needs the values of its input"
    ):
        profile(DataDependent(), torch.empty(8, 8, device="meta"), device="meta")


def test_sizes_that_depend_on_real_inputs_are_exact():
    """The values of real inputs are known to an analytic run (see test_values.py): the selection is sized by them."""
    torch.manual_seed(0)
    x = torch.randn(64, 64)
    analytic, real = profile(DataDependent(), x, device="meta"), profile(DataDependent(), x)
    assert analytic.peak_memory_bytes == real.peak_memory_bytes
    assert analytic.peak_memory_bytes != profile(DataDependent(), -x, device="meta").peak_memory_bytes
