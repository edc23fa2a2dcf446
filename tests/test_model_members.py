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


class AlikeLinear(nn.Linear):
    """Modules equal to each other by value, which a set of modules (named_modules' memo) holds as one."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AlikeLinear)

    def __hash__(self) -> int:
        return 1


class OwnBuffers(nn.Sequential):
    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):  # type: ignore[no-untyped-def,override]
        return iter([])


class OwnModules(nn.Module):
    """A child whose ``named_modules`` hides its children."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(2, 2)

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):  # type: ignore[no-untyped-def,override]
        yield prefix, self


def test_one_walk_gives_what_the_module_methods_give() -> None:
    shared = nn.Linear(3, 3)
    for model in (
        Tied(),
        torchvision.models.resnet18(),
        nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Identity())),
        nn.Sequential(AlikeLinear(2, 2), AlikeLinear(2, 2)),
        nn.Sequential(shared, nn.ReLU(), shared),
    ):
        _same(model)


def test_a_model_with_methods_of_its_own_is_asked_itself() -> None:
    model = Renamed(nn.Linear(2, 2), nn.Linear(2, 2))
    _same(model)
    assert next(iter(named_members(model)[1])) == "renamed.0.weight"
    hidden = OwnBuffers(nn.BatchNorm1d(2))
    _same(hidden)
    assert named_members(hidden)[2] == {}
    _same(nn.Sequential(OwnModules(), nn.Linear(2, 2)))
    patched = nn.Sequential(nn.Linear(2, 2))
    patched.named_parameters = lambda *args, **kwargs: iter([])  # type: ignore[method-assign]
    _same(patched)
    assert named_members(patched)[1] == {}


def _unique_elements(module: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())  # parameters(): each tensor once


def test_each_module_counts_its_parameters_and_its_children_s_once() -> None:
    for model, x in ((Tied().eval(), torch.randn(3, 6)), (torchvision.models.resnet18().eval(), torch.randn(1, 3, 32, 32))):
        result = profile(model, x, memory=False)
        for path, module in model.named_modules():
            assert result.module(path).params == _unique_elements(module), path
    tied_only, block = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), nn.Linear(4, 4)
    tied_only[1].weight = tied_only[0].weight
    for model in (tied_only, nn.Sequential(block, nn.Sequential(block, nn.ReLU()))):
        result = profile(model, torch.randn(2, 4), memory=False)
        for path, module in model.named_modules():
            assert result.module(path).params == _unique_elements(module), path
    tied = profile(Tied().eval(), torch.randn(3, 6), memory=False)
    assert tied.module("").params == 2 * 36 + 3 * 6 + 2 * 6  # two weights (the third tied to one), three biases, the norm's two


def test_an_in_place_run_holds_the_model_s_buffers() -> None:
    model = torchvision.models.resnet18().eval()
    result = profile(model, torch.randn(1, 3, 32, 32))  # real inference on the model's own device: its own tensors
    assert result.memory is not None
    assert result.memory.category_max["buffers"] == sum(b.numel() * b.element_size() for b in model.buffers())
    assert result.memory.category_max["parameters"] == sum(p.numel() * p.element_size() for p in model.parameters())


class HeldTwice(nn.Module):
    """A parameter that another module also holds as a buffer (``alias``), or that the forward reads twice."""

    def __init__(self, alias: bool = True) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.alias = alias
        if alias:
            self.holder = nn.Module()
            self.holder.register_buffer("bias", self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + (self.holder.bias if self.alias else self.linear.bias)


def test_a_parameter_also_held_as_a_buffer_is_one_tensor_of_the_training_step() -> None:
    x = torch.randn(2, 3)
    for device in (None, "meta"):
        result = profile(HeldTwice(), x, train=True, device=device)  # (torch's functional_call refused two tensors for it)
        twice = profile(HeldTwice(alias=False), x, train=True, device=device)  # the same graph, the parameter read twice
        assert result.memory is not None and (result.forward_flops, result.backward_flops) == (twice.forward_flops, twice.backward_flops)
        assert result.memory.category_max["parameters"] == (9 + 3) * 4  # its one bias, counted once, as a parameter
        assert result.memory.category_max["buffers"] == 0
        assert result.memory.category_max["gradients"] == (9 + 3) * 4
