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


class CountedMoE(TopKMoE):
    """Experts fed from the router's token counts, read back as Python ints (``tolist``) to split the tokens
    sorted by expert: counted as JetMoE does (ones scattered at the chosen experts, summed over tokens),
    by ``bincount`` or by ``histc``."""

    def __init__(self, count="scatter"):
        super().__init__()
        self.count = count

    def forward(self, x):
        b, s, d = x.shape
        x = x.reshape(-1, d)
        weights, idx = torch.topk(F.softmax(self.router(x), -1), self.k, dim=-1)
        n = len(self.experts)
        if self.count == "scatter":
            counts = torch.zeros(x.shape[0], n).scatter(1, idx, 1).long().sum(0)
        elif self.count == "bincount":
            counts = torch.bincount(idx.flatten(), minlength=n)
        else:
            counts = torch.histc(idx.flatten().float(), bins=n, min=0, max=n - 1)
        order = idx.flatten().argsort()
        tokens = order // self.k
        parts = x[tokens].split([int(c) for c in counts.tolist()])
        routed = torch.cat([expert(part) for expert, part in zip(self.experts, parts)])
        out = torch.zeros_like(x).index_add_(0, tokens, routed * weights.flatten()[order, None])
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
    assert analytic.flops == real.flops  # one_hot included: the CPU kernel's checks and scatter, not the fake kernel's arange
    # a balanced split: each expert's share of the tokens (a real run's split depends on the data)
    assert {m.forward_flops for m in experts} == {expert_flops(64, 2) // 4}
    # a router that splits the tokens as evenly as the analytic run does: the real run's peak, to the byte
    assert analytic.peak_memory_bytes == profile(*evenly_routed(block), train=True).peak_memory_bytes


def evenly_routed(block):
    """``block`` with a router that sends token t to experts t mod 4 and t + 1 mod 4 (32 of the 64
    token choices each), and its input."""
    model, x = block(), torch.randn(2, 32, 64)
    with torch.no_grad():
        model.router.weight.zero_()
        model.router.bias.zero_()
        model.router.weight[:, :4] = 10 * torch.eye(4)  # the logits: 10 x the input's first four features
        tokens = x.view(-1, 64)
        tokens[:, :4] = 0
        for t in range(tokens.shape[0]):
            tokens[t, t % 4], tokens[t, (t + 1) % 4] = 2.0, 1.0
    return model, x


@pytest.mark.parametrize("count", ["scatter", "bincount", "histc"])
def test_experts_split_by_the_routers_counts_run_analytically(count):
    torch.manual_seed(0)
    model, x = CountedMoE(count), torch.randn(2, 30, 64)  # 60 tokens x 2 choices over 4 experts: 30 each
    real = profile(model, x, train=True)
    analytic = profile(model, x, train=True, device="meta")
    assert analytic.uncounted == {}
    experts = [m for m in analytic.modules if m.path.startswith("experts.") and m.path.count(".") == 1]
    assert [m.forward_flops for m in experts] == [expert_flops(30, 1)] * 4
    assert analytic.flops == real.flops


def test_uneven_counts_still_add_up_to_the_routed_tokens():
    torch.manual_seed(0)
    model, x = CountedMoE("bincount"), torch.randn(1, 7, 64)  # 14 routed tokens over 4 experts: 4, 4, 3, 3
    experts = [m for m in profile(model, x, device="meta").modules if m.path.startswith("experts.") and m.path.count(".") == 1]
    assert [m.forward_flops for m in experts] == [expert_flops(4, 1)] * 2 + [expert_flops(3, 1)] * 2


class CapacityMoE(nn.Module):
    """Switch Transformers' form: top-1 routing, each expert keeping the tokens of a sequence up to its capacity
    (a cumulative sum of the one-hot choices along the sequence), the experts that get any token found with
    ``nonzero`` and looked up by name in a loop over them."""

    def __init__(self, capacity, d=64, experts=4):
        super().__init__()
        self.router, self.capacity = nn.Linear(d, experts), capacity
        self.experts = nn.ModuleDict(
            {f"expert_{e}": nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for e in range(experts)}
        )

    def forward(self, x):
        b, s, d = x.shape
        probs = F.softmax(self.router(x), -1)
        chosen = F.one_hot(probs.argmax(-1), num_classes=len(self.experts))
        chosen = chosen * (torch.cumsum(chosen, dim=-2) <= self.capacity)
        weights = probs.max(-1).values.reshape(-1, 1)
        x, mask = x.reshape(-1, d), chosen.reshape(-1, 1, len(self.experts)).permute(2, 1, 0)
        out = torch.zeros_like(x)
        for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
            slot, token = torch.where(mask[e].squeeze(0))
            out.index_add_(0, token, self.experts[f"expert_{e[0]}"](x[token]) * weights[token, slot, None])
        return out.reshape(b, s, d)


@pytest.mark.parametrize("capacity, kept", [(64, 8), (5, 5)], ids=["within-capacity", "over-capacity"])
def test_a_capacity_router_keeps_each_experts_share_up_to_its_capacity(capacity, kept):
    torch.manual_seed(0)
    model, x = CapacityMoE(capacity), torch.randn(2, 32, 64)  # each sequence's 32 tokens over 4 experts: 8 each
    analytic = profile(model, x, train=True, device="meta")
    experts = [m for m in analytic.modules if m.path.startswith("experts.") and m.path.count(".") == 1]
    # every expert gets tokens, and keeps min(8, capacity) of each of the 2 sequences
    assert [m.forward_flops for m in experts] == [expert_flops(2 * kept, 1)] * 4
    if capacity >= 32:  # no token over capacity in any split: the real run routes all 64 tokens too
        real = profile(model, x, train=True)
        assert sum(m.forward_flops for m in experts) == sum(
            m.forward_flops for m in real.modules if m.path.startswith("experts.") and m.path.count(".") == 1
        )


def test_a_moe_block_on_a_gpu_target():
    result = profile(TopKMoE(), torch.randn(2, 32, 64), train=True, target="h100")
    assert result.uncounted == {} and result.predicted.seconds > 0
    # the experts' FLOPs by hand, the tokens split evenly as on the CPU (no value reaches a target run)
    experts = [m for m in result.modules if m.path.startswith("experts.") and m.path.count(".") == 1]
    assert [m.forward_flops for m in experts] == [expert_flops(64, 2) // 4] * 4


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


class GroupedExperts(nn.Module):
    """Experts as one grouped product over tokens sorted by expert (transformers' grouped_mm experts),
    in full precision, which PyTorch's meta kernel of torch._grouped_mm refuses."""

    def __init__(self, d=64, experts=4, k=2):
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.up = nn.Parameter(torch.randn(experts, d, 4 * d) / d**0.5)
        self.down = nn.Parameter(torch.randn(experts, 4 * d, d) / (4 * d) ** 0.5)
        self.k = k

    def forward(self, x):
        b, s, d = x.shape
        x = x.reshape(-1, d)
        weights, idx = torch.topk(F.softmax(self.router(x), -1), self.k, dim=-1)
        order = idx.flatten().argsort()
        counts = torch.histc(idx.flatten().float(), bins=len(self.up), min=0, max=len(self.up) - 1)
        offs = counts.cumsum(0).to(torch.int32)
        routed = x[order // self.k]
        hidden = F.gelu(torch._grouped_mm(routed, self.up, offs=offs))
        out = torch._grouped_mm(hidden, self.down, offs=offs) * weights.flatten()[order, None]
        return torch.zeros_like(x).index_add_(0, order // self.k, out).reshape(b, s, d)


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch._grouped_mm is newer than this torch")
def test_a_full_precision_grouped_product_runs_analytically():
    torch.manual_seed(0)
    model, x = GroupedExperts(), torch.randn(2, 32, 64)
    real = profile(model, x, train=True)
    analytic = profile(model, x, train=True, device="meta")
    assert analytic.uncounted == {}
    # every token's k rows through both products, whatever the split: 64 x 2 rows of 64 -> 256 -> 64
    assert analytic.op("aten._grouped_mm", "forward").macs == real.op("aten._grouped_mm", "forward").macs == 128 * 2 * 64 * 256
    assert analytic.flops == real.flops
    assert profile(model, x, train=True, target="h100").uncounted == {}


def test_a_model_that_asks_the_gpu_gets_the_targets_answers():
    seen = []

    class Asks(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x):
            properties = torch.cuda.get_device_properties(x.device)
            seen.append(
                (torch.cuda.get_device_capability(x.device), torch.cuda.get_device_name(x.device), properties.multi_processor_count)
            )
            return self.linear(x)

    profile(Asks(), torch.randn(4, 8), target="h100")
    profile(Asks(), torch.randn(4, 8), target="a100-80gb")
    assert [(cc, sms) for cc, _, sms in seen] == [((9, 0), 132), ((8, 0), 108)]
    assert seen[0][1] == "h100"  # the spec's name
