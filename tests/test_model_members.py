"""The model's modules, parameters and buffers as a run reads them: one walk of the modules, giving what
``nn.Module``'s own methods give, and each module's parameter count, tied weights counted once."""

import torch
import torchvision
from torch import nn

from pytest_modelprof import profile
from pytest_modelprof.engine.observe.modules import named_members


class Tied(nn.Module):
    """Weights tied across two layers, one block reached by two names, a buffer held twice, a parameter also
    registered as a buffer elsewhere, and a parameter slot left empty."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 6)
        self.head = nn.Linear(6, 6)
        self.head.weight = self.embed.weight
        self.again = self.embed
        self.norm = nn.BatchNorm1d(6)
        self.register_buffer("scale", torch.ones(6))
        self.norm.register_buffer("scale_alias", self.scale)
        self.holder = nn.Module()
        self.holder.register_buffer("bias_as_buffer", self.head.bias)
        self.holder.register_parameter("missing", None)
        self.stack = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), self.head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stack(self.norm(self.again(self.embed(x))) * self.scale) + self.head(x)


class Renamed(nn.Sequential):
    """A class with its own ``named_parameters``, as wrappers that rename their parameters have."""

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):  # type: ignore[no-untyped-def,override]
        for name, p in super().named_parameters(prefix, recurse, remove_duplicate):
            yield f"renamed.{name}", p


def _same(model: nn.Module) -> None:
    modules, params, buffers = named_members(model)
    assert [(n, id(m)) for n, m in modules] == [(n, id(m)) for n, m in model.named_modules(remove_duplicate=False)]
    assert [(n, id(p)) for n, p in params.items()] == [(n, id(p)) for n, p in model.named_parameters()]
    assert [(n, id(b)) for n, b in buffers.items()] == [(n, id(b)) for n, b in model.named_buffers()]


def test_one_walk_gives_what_the_module_methods_give() -> None:
    _same(Tied())
    _same(torchvision.models.resnet18())
    _same(nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Identity())))


def test_a_class_with_its_own_method_is_asked_itself() -> None:
    model = Renamed(nn.Linear(2, 2), nn.Linear(2, 2))
    _same(model)
    assert next(iter(named_members(model)[1])) == "renamed.0.weight"


def _unique_elements(module: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())  # parameters(): each tensor once


def test_each_module_counts_its_parameters_and_its_children_s_once() -> None:
    for model, x in ((Tied().eval(), torch.randn(3, 6)), (torchvision.models.resnet18().eval(), torch.randn(1, 3, 32, 32))):
        result = profile(model, x, memory=False)
        for path, module in model.named_modules():
            assert result.module(path).params == _unique_elements(module), path
    tied = profile(Tied().eval(), torch.randn(3, 6), memory=False)
    assert tied.module("").params == 2 * 36 + 3 * 6 + 2 * 6  # two weights (the third tied to one), three biases, the norm's two
