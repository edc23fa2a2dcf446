"""Repeated calls of stock leaf modules are replayed instead of dispatched again
(FLOPs-only runs): the figures must be those of dispatching every op."""

import pytest
import torch
import torchvision
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

from examples.gpt2 import GPT2, GPT2Config
from models import TinyCNN, TinyTransformer
from pytest_modelprof import ProfileError, profile
from pytest_modelprof.engine.observe import blocks, memo
from pytest_modelprof.engine.observe.dispatch import Dispatcher


class DeepMLP(nn.Module):
    """Six identical residual blocks: every leaf call after the first block replays."""

    def __init__(self, width=16, blocks=6):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * width, width))
            for _ in range(blocks)
        )
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def resnet18():
    return torchvision.models.resnet18(num_classes=10)


ALL = {"eval", "grad", "train"}
# (name, model, inputs, the modes in which some leaf call repeats another's signature)
WORKLOADS = [
    ("mlp", DeepMLP, lambda: torch.randn(4, 5, 16), ALL),
    ("resnet18", resnet18, lambda: torch.randn(2, 3, 32, 32), ALL),
    ("gpt2", lambda: GPT2(GPT2Config.tiny()), lambda: torch.randint(0, 256, (2, 16)), ALL),
    ("cnn", TinyCNN, lambda: torch.randn(2, 3, 16, 16), set()),
    # encoder layers: in eval mode under no_grad, a fused fast path that calls no submodule
    ("transformer", TinyTransformer, lambda: torch.randint(0, 50, (2, 12)), {"grad", "train"}),
]


@pytest.fixture
def replays(monkeypatch):
    """How many leaf calls were replayed (the meter is suspended once per replay)."""
    count = [0]
    suspend = Dispatcher.suspend

    def counting(self):
        count[0] += 1
        suspend(self)

    monkeypatch.setattr(Dispatcher, "suspend", counting)
    return count


def without_memo(monkeypatch, *args, **kwargs):
    with monkeypatch.context() as m:
        m.setattr(memo, "STOCK_LEAVES", frozenset())
        m.setattr(blocks, "repeated_blocks", lambda model: [])
        return profile(*args, **kwargs)


@pytest.mark.parametrize("mode", ["eval", "grad", "train"])
@pytest.mark.parametrize(("name", "factory", "inputs", "repeats"), WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_replayed_figures_equal_dispatched_ones(monkeypatch, replays, name, factory, inputs, repeats, mode):
    torch.manual_seed(0)
    model, x = factory(), inputs()
    options = {"train": mode == "train", "no_grad": mode != "grad", "memory": False}
    replayed = profile(model, x, **options)
    assert (replays[0] > 0) == (mode in repeats)
    assert replayed.to_dict() == without_memo(monkeypatch, model, x, **options).to_dict()


def test_analytic_run_replays_the_same_figures(monkeypatch, replays):
    monkeypatch.setattr(blocks, "repeated_blocks", lambda model: [])  # whole blocks would replay first (test_blocks.py)
    model, x = DeepMLP(), torch.randn(4, 5, 16)
    replayed = profile(model, x, device="meta", memory=False, train=True)
    assert replays[0] > 0
    assert replayed.to_dict() == without_memo(monkeypatch, model, x, device="meta", memory=False, train=True).to_dict()


class Reused(nn.Module):
    """One linear layer called on three inputs, two of them alike."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)

    def forward(self, x):
        return self.fc(x).sum() + self.fc(x.view(2, 2, 8)).sum() + self.fc(x[:, :4].repeat(1, 2)).sum()


def test_one_module_called_with_different_shapes(replays):
    result = profile(Reused(), torch.randn(4, 8), memory=False)
    # three calls over 4 rows each: 2 * 8 * 16 FLOPs of products (and a bias add) per row
    assert result.module("fc").calls == 3
    assert result.module("fc").forward_macs == 3 * 4 * 8 * 16
    assert replays[0] == 1  # the 2-D input repeats; the 3-D one has another signature


class Repadded(nn.Module):
    """A convolution whose padding changes between two calls, as some 'same'-padding code does."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)

    def forward(self, x):
        first = self.conv(x)
        self.conv.padding = (0, 0)
        second = self.conv(x)
        self.conv.padding = (1, 1)
        return first.sum() + second.sum()


def test_configuration_is_part_of_the_signature(replays):
    result = profile(Repadded(), torch.randn(1, 3, 8, 8), memory=False)
    assert replays[0] == 0
    # 3 input channels x 9 taps per output element: 8x8 outputs, then 6x6
    assert result.module("conv").forward_macs == 3 * 9 * 4 * (8 * 8 + 6 * 6)


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(self.fc(x))


def test_a_hooked_leaf_is_dispatched(replays):
    model = Twice()
    model.fc.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
    result = profile(model, torch.randn(4, 8), memory=False)
    assert replays[0] == 0
    mul = next(op for op in result.ops if op.op == "aten.mul")
    assert (mul.calls, mul.flops) == (2, 2 * 4 * 8)


def test_another_global_hook_turns_the_memo_off(monkeypatch, replays):
    handle = register_module_forward_pre_hook(lambda module, args: None)
    try:
        model, x = Twice(), torch.randn(4, 8)
        result = profile(model, x, memory=False)
        assert replays[0] == 0
        assert result.to_dict() == without_memo(monkeypatch, model, x, memory=False).to_dict()
    finally:
        handle.remove()


def test_autocast_turns_the_memo_off(monkeypatch, replays):
    # under autocast the first call of a layer casts its weights and later calls reuse the cast
    model, x = DeepMLP(), torch.randn(4, 5, 16)
    result = profile(model, x, memory=False, autocast=torch.bfloat16)
    assert replays[0] == 0
    assert result.to_dict() == without_memo(monkeypatch, model, x, memory=False, autocast=torch.bfloat16).to_dict()


class Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4, max_norm=1.0)  # two ops a call: renormalise, look up

    def forward(self, tokens):
        return self.embed(tokens) + self.embed(tokens + 10)  # the second call looks up past the table


def test_an_error_in_a_replayed_call_leaves_nothing_behind(replays):
    with pytest.raises(ProfileError, match="'embed'"):
        profile(Lookup(), torch.tensor([[1, 2]]), memory=False)
    assert replays[0] == 1
    assert torch._C._len_torch_dispatch_stack() == 0
    assert profile(nn.Linear(2, 2), torch.randn(1, 2), memory=False).forward_macs == 4


class Activations(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.act(self.act(x) - 1))


def test_single_op_layers_are_dispatched(replays):
    # one op a call: a signature would cost what dispatching the op does
    result = profile(Activations(), torch.randn(4, 8), memory=False)
    assert replays[0] == 0
    relu = next(op for op in result.ops if op.op == "aten.relu")
    assert (relu.calls, relu.flops) == (3, 3 * 4 * 8)
