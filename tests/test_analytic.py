"""Analytic mode (fake tensors) gives the figures of a real run without allocating."""

import dataclasses

import pytest
import torch
import torchvision
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, in_kernel_invocation_manager
from torch.utils._python_dispatch import TorchDispatchMode

from models import TinyCNN, TinyTransformer, flop_figures, workloads
from pytest_modelprof import profile
from pytest_modelprof.engine.analytic import values
from pytest_modelprof.engine.analytic.beside import detached, in_place_foreach, unsafe_viewed, writes_in_place_alone
from pytest_modelprof.engine.ops import MARKERS, fake_device


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name, factory, inputs", workloads(), ids=[w[0] for w in workloads()])
def test_analytic_equals_real(name, factory, inputs, train):
    model = factory()
    real = profile(model, inputs, train=train)
    analytic = profile(model, inputs, train=train, device="meta")
    assert analytic.analytic and not real.analytic
    assert real.uncounted == {}
    assert flop_figures(analytic) == flop_figures(real)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_analytic_equals_real_on_resnet18(train):
    model = torchvision.models.resnet18(num_classes=10)
    x = torch.randn(1, 3, 64, 64)
    assert flop_figures(profile(model, x, train=train, device="meta")) == flop_figures(profile(model, x, train=train))


def test_device_queries_are_answered_above_the_fake_mode(monkeypatch):
    # the autograd engine asks each fake tensor its device in C++, a dispatch through every mode above the fake
    # mode; the engine's modes answer it as the fake mode does, so (apart from its setup) the step's queries
    # stop at the topmost one
    asked = []
    stock = FakeTensorMode.dispatch

    def dispatch(self, func, types, args=(), kwargs=None):
        asked.append(func is torch.ops.prim.device.default)
        return stock(self, func, types, args, kwargs or {})

    monkeypatch.setattr(FakeTensorMode, "dispatch", dispatch)
    images = torch.randn(2, 3, 16, 16)
    with FakeTensorMode() as mode:
        model, fake_images = TinyCNN(), mode.from_tensor(images)
        asked.clear()
        model(fake_images).sum().backward()
    untracked = sum(asked)
    assert untracked > 100  # the question the engine answers is asked, a few times an op
    asked.clear()
    result = profile(TinyCNN(), images, device="meta", train=True)
    assert sum(asked) < untracked / 20
    assert flop_figures(result) == flop_figures(profile(TinyCNN(), images, train=True))
    with FakeTensorMode() as mode:  # the answer, outside a kernel and inside one (where the fake mode says meta)
        fake = mode.fake_tensor_converter.from_meta_and_device(mode, torch.empty(2, device="meta"), torch.device("cuda", 0))
        assert fake_device(fake) == torch.device("cuda", 0) == fake.device
        with in_kernel_invocation_manager(mode):
            assert fake_device(fake) == torch.device("meta")
    assert fake_device(torch.zeros(2)) is None


class Ranged(nn.Module):
    """A forward pass in ranges of ``record_function``, as FSDP2 and the optimizers open them."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        with torch.autograd.profiler.record_function("first range"):
            x = self.a(x).relu()
        with torch.autograd.profiler.record_function("second range"):
            return self.b(x)


def test_record_function_ranges_are_opened_above_the_fake_mode(monkeypatch):
    # a range's markers take and make no tensor: the engine's modes run them, as every mode beneath them would
    reached = fake_mode_sees(monkeypatch)
    x = torch.randn(2, 8)
    with FakeTensorMode() as mode:
        Ranged()(mode.from_tensor(x)).sum().backward()
    assert len(MARKERS & set(reached)) == 2  # untracked, both markers reach the fake mode
    reached.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], acc_events=True) as profiler:  # (2.11 warns without)
        result = profile(Ranged(), x, device="meta", train=True)
    assert reached and not MARKERS & set(reached)
    assert {"first range", "second range"} <= {event.name for event in profiler.events()}  # the ranges are still there
    assert flop_figures(result) == flop_figures(profile(Ranged(), x, train=True))


class Sees(TorchDispatchMode):
    """A mode of the caller's, entered before the run: what reaches it."""

    def __init__(self):
        super().__init__()
        self.funcs = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.funcs.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", [None, "meta"], ids=["real", "analytic"])
def test_a_mode_of_the_callers_beneath_the_run_still_sees_the_ranges(device):
    with Sees() as mode:
        profile(Ranged(), torch.randn(2, 8), device=device)
    assert MARKERS <= set(mode.funcs)


def test_model_built_on_meta_matches_the_same_model_on_cpu():
    with torch.device("meta"):
        on_meta = TinyTransformer()
    tokens = torch.randint(0, 50, (2, 12))
    assert flop_figures(profile(on_meta, tokens, device="meta")) == flop_figures(profile(TinyTransformer(), tokens))


def test_model_and_inputs_already_fake():
    # (TransformerEncoder deep-copies its layer, which torch warns about under fake mode)
    with FakeTensorMode():
        model = TinyCNN()
        images = torch.randn(2, 3, 16, 16)
    result = profile(model, images, train=True)
    assert result.analytic
    assert flop_figures(result) == flop_figures(profile(TinyCNN(), torch.randn(2, 3, 16, 16), train=True))


def fake_mode_sees(monkeypatch) -> list:
    """The ops that reach FakeTensorMode's dispatch from now on, in order (a list the test reads)."""
    seen = []
    stock_dispatch = FakeTensorMode.dispatch
    monkeypatch.setattr(FakeTensorMode, "dispatch", lambda self, func, *rest: seen.append(func) or stock_dispatch(self, func, *rest))
    return seen


def test_a_fake_models_tensors_are_aliased_for_the_run_as_detach_makes_them(monkeypatch):
    # a fake model's parameters and optimizer state are aliased for the run without dispatching detach
    # through the fake mode (five times the cost); the alias is the one the fake mode makes, constants included
    with FakeTensorMode() as mode:
        weight = torch.randn(6, 8, requires_grad=True)
        view = weight.detach()[1:, ::2]  # a view: offset and strides
        step = torch.tensor(3.0)  # an optimizer's step counter: a fake constant, whose value the mode keeps
    for t in (weight, view, step):
        made, stock = detached(t), t.detach()
        for tensor in (made, stock):
            assert type(tensor) is FakeTensor and tensor.fake_mode is mode and not tensor.requires_grad
        layout = [(x.shape, x.stride(), x.storage_offset(), x.dtype, x.device) for x in (made, stock)]
        assert layout[0] == layout[1]
        assert made.untyped_storage()._cdata == stock.untyped_storage()._cdata == t.untyped_storage()._cdata
        assert (made.constant is None) == (stock.constant is None) == (t.constant is None)
    assert detached(step).constant.item() == 3.0 and detached(step).constant.data_ptr() == step.constant.data_ptr()
    dispatched = fake_mode_sees(monkeypatch)
    weight.detach()
    assert dispatched == [torch.ops.aten.detach.default]  # (what is spared)
    dispatched.clear()
    detached(weight), detached(step)
    assert dispatched == []


def test_autograds_detach_of_each_saved_tensor_stops_above_the_fake_mode(monkeypatch):
    # with memory followed, autograd detaches each input it saves (for the saved-tensors hook) in C++: a dispatch
    # through every mode, answered by the known values' mode as the fake mode would, with every figure the same
    reached = fake_mode_sees(monkeypatch)
    images = torch.randn(2, 3, 16, 16)
    fast = profile(TinyCNN(), images, device="meta", train=True).to_dict()
    assert torch.ops.aten.detach.default not in reached
    monkeypatch.setattr(values, "detached", lambda t: t.detach())
    assert profile(TinyCNN(), images, device="meta", train=True).to_dict() == fast
    assert torch.ops.aten.detach.default in reached  # (what is spared)


def test_an_unsafe_view_is_made_beside_the_fake_mode_as_the_mode_makes_it(monkeypatch):
    # a linear layer of a 3-d input folds its product back with _unsafe_view, which the fake mode makes on its
    # uncached path: made beside it, the same tensor; the rest (not contiguous, a constant, a size that does not
    # fit) left to the mode
    view = torch.ops.aten._unsafe_view.default
    with FakeTensorMode() as mode:
        product = torch.randn(6, 8)
        step = torch.tensor(3.0)  # a fake constant (an optimizer's step counter)
        strided = torch.randn(8, 6).t()
    made = unsafe_viewed(product, [2, 3, 8])
    with mode:
        stock = view(product, [2, 3, 8])
    for tensor in (made, stock):
        assert type(tensor) is FakeTensor and tensor.fake_mode is mode and tensor.constant is None
    layout = [(x.shape, x.stride(), x.storage_offset(), x.dtype, x.device) for x in (made, stock)]
    assert layout[0] == layout[1] == (torch.Size([2, 3, 8]), (24, 8, 1), 0, torch.float32, torch.device("cpu"))
    assert made.untyped_storage()._cdata == stock.untyped_storage()._cdata == product.untyped_storage()._cdata
    assert step.constant is not None and unsafe_viewed(step, [1]) is None  # (the mode works out a constant's value)
    assert unsafe_viewed(strided, [48]) is None and unsafe_viewed(product, [5, 8]) is None
    # in a run, it does not reach the fake mode, and every figure is as it was
    reached = fake_mode_sees(monkeypatch)
    tokens = torch.randint(0, 50, (2, 12))
    fast = profile(TinyTransformer(), tokens, device="meta", train=True).to_dict()
    assert view not in reached
    monkeypatch.setattr(values, "unsafe_viewed", lambda t, size: None)
    assert profile(TinyTransformer(), tokens, device="meta", train=True).to_dict() == fast
    assert view in reached  # (what is spared)


@pytest.mark.parametrize(
    "make",
    [
        lambda params: torch.optim.AdamW(params, foreach=True),
        lambda params: torch.optim.Adam(params, foreach=True, amsgrad=True, weight_decay=0.1),
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, foreach=True),
        lambda params: torch.optim.RMSprop(params, foreach=True, centered=True),
    ],
)
def test_an_optimizers_in_place_foreach_ops_are_answered_above_the_fake_mode(monkeypatch, make):
    # an in-place foreach op over fake tensors alike place by place makes nothing: answered without the fake mode's
    # kernel, tensor by tensor; every figure (memory, FLOPs, the predicted step on a GPU) is as it was
    reached = fake_mode_sees(monkeypatch)
    model, tokens = TinyTransformer(), torch.randint(0, 50, (2, 12))

    def run() -> dict:
        return profile(model, tokens, device="meta", train=True, optimizer=make(model.parameters()), target="h100").to_dict()

    counts = torch.ops.aten._foreach_add_.Tensor  # the step counts' (constants, and a tensor added): the mode's
    fast = run()
    assert {f for f in reached if in_place_foreach(f)} <= {counts}
    monkeypatch.setattr(values, "writes_in_place_alone", lambda mode, args, kwargs: False)
    assert run() == fast
    assert {f for f in reached if in_place_foreach(f)} - {counts}  # (what is spared)


def test_an_in_place_foreach_op_of_operands_not_alike_is_the_fake_modes():
    with FakeTensorMode() as mode:
        a, b = [torch.randn(3, 4), torch.randn(5)], [torch.randn(3, 4), torch.randn(5)]
        assert writes_in_place_alone(mode, (a, b, b, [0.1, 0.2]), {})
        assert not writes_in_place_alone(mode, (a, b[:1], b, [0.1, 0.2]), {})  # a list too short: the mode's error
        assert not writes_in_place_alone(mode, (a, b, b, [0.1]), {})
        assert not writes_in_place_alone(mode, (a, [b[1], b[0]], 1.0), {})  # shapes that differ
        assert not writes_in_place_alone(mode, (a, [t.half() for t in b], 1.0), {})
        assert not writes_in_place_alone(mode, (a, torch.tensor(1.0)), {})  # a tensor of scalars
        assert not writes_in_place_alone(mode, ([torch.zeros(3, dtype=torch.long)], 0.5), {})  # a float into integers
        assert not writes_in_place_alone(mode, ([torch.randn(4, 3).t()], 2.0), {})
        assert not writes_in_place_alone(mode, ([torch.tensor(3.0)], 1.0), {})  # a constant: the mode works out its value
        with pytest.raises(RuntimeError):
            torch._foreach_add_(a, [b[1], b[0]])  # the mode's own check, which a shape that differs is left to
    assert not writes_in_place_alone(FakeTensorMode(), (a, b, 1.0), {})  # another mode's tensors
    assert in_place_foreach(torch.ops.aten._foreach_addcdiv_.ScalarList) and not in_place_foreach(torch.ops.aten._foreach_sqrt.default)
    # an out= overload writes another list than its first, which it may resize (_foreach_norm's outputs are 0-dim)
    assert not in_place_foreach(torch.ops.aten._foreach_norm.Scalar_out) and not in_place_foreach(torch.ops.aten._foreach_add.Scalar_out)


def test_a_mode_of_the_callers_beneath_the_run_sees_the_ops_made_above_the_fake_mode(monkeypatch):
    # detaches, unsafe views and in-place foreach ops are made above the fake mode only where it alone would see them
    made_above = (torch.ops.aten.detach.default, torch.ops.aten._unsafe_view.default)

    def seen() -> list:
        model, tokens = TinyTransformer(), torch.randint(0, 50, (2, 12))
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
        with Sees() as mode:
            profile(model, tokens, device="meta", train=True, optimizer=optimizer)
        return sorted(str(f) for f in mode.funcs if f in made_above or in_place_foreach(f))

    with_shortcuts = seen()
    assert {"aten._unsafe_view.default", "aten.detach.default", "aten._foreach_addcdiv_.ScalarList"} <= set(with_shortcuts)
    monkeypatch.setattr(values, "detached", lambda t: t.detach())
    monkeypatch.setattr(values, "unsafe_viewed", lambda t, size: None)
    monkeypatch.setattr(values, "writes_in_place_alone", lambda mode, args, kwargs: False)
    assert seen() == with_shortcuts


def test_analytic_mode_allocates_nothing():
    # 40 GB of weights and a 400 MB activation: fine, because none of it exists
    with torch.device("meta"):
        huge = nn.Linear(100_000, 100_000, bias=False)
    result = profile(huge, torch.randn(1000, 100_000, device="meta"), device="meta", train=True)
    assert result.forward_macs == 1000 * 100_000 * 100_000
    assert result.backward_macs == 1000 * 100_000 * 100_000  # weight gradient only
    assert result.param_bytes == 4 * 10**10


def test_analytic_mode_of_a_cpu_model_leaves_it_on_cpu():
    model = TinyTransformer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profile(model, torch.randint(0, 50, (2, 12)), device="meta", train=True)
    assert all(p.device.type == "cpu" and p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_profile_round_trips_through_a_dict():
    result = profile(TinyTransformer(), torch.randint(0, 50, (2, 12)), train=True)
    again = type(result).from_dict(result.to_dict())
    assert dataclasses.asdict(again) == dataclasses.asdict(result)
    assert again.flops == result.flops


def test_tensors_held_outside_parameters_and_buffers():
    class PlainAttribute(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 6, bias=False)
            self.mask = torch.ones(6, 6).tril()  # not a buffer

        def forward(self, x):
            return self.lin(x) @ self.mask

    x = torch.randn(2, 6)
    assert flop_figures(profile(PlainAttribute(), x, device="meta")) == flop_figures(profile(PlainAttribute(), x))


def memory_figures(result):
    return (
        result.peak_memory_bytes,
        result.peak_activation_bytes,
        result.memory.peak_phase,
        result.memory.peak_module,
        result.memory.peak_breakdown,
        result.memory.category_max,
        [(m.path, m.activation_bytes, m.forward_peak_bytes, m.backward_peak_bytes) for m in result.modules],
    )


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name, factory, inputs", workloads()[:2], ids=[w[0] for w in workloads()[:2]])
def test_analytic_memory_equals_real(name, factory, inputs, train):
    model = factory()
    assert memory_figures(profile(model, inputs, train=train, device="meta")) == memory_figures(profile(model, inputs, train=train))


def test_analytic_memory_of_the_fused_cpu_lstm():
    _, factory, inputs = workloads()[2]
    model = factory()
    assert memory_figures(profile(model, inputs, train=True, device="meta")) == memory_figures(profile(model, inputs, train=True))


def test_grad_enabled_inference_keeps_what_autograd_saves_analytically():
    """``no_grad=False``: the parameters require gradients, as the caller's do, so autograd saves the
    GELU's input for the backward pass in an analytic run as in a real one."""
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64))
    x = torch.randn(8, 64)
    real, analytic = profile(model, x, no_grad=False), profile(model, x, no_grad=False, device="meta")
    assert real.memory.category_max["activations"] >= 8 * 64 * 4
    assert memory_figures(analytic) == memory_figures(real)


def test_a_batched_product_with_a_parameter_is_folded_as_in_a_real_run():
    """``torch.matmul`` of a non-contiguous 3-d tensor by a parameter folds it into one ``mm`` when the
    parameter requires a gradient (at::native::should_fold), in inference too."""

    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return x.transpose(0, 1) @ self.weight

    x = torch.randn(5, 3, 8)
    real, analytic = profile(Mixer(), x), profile(Mixer(), x, device="meta")
    assert [op.op for op in analytic.ops if op.flops] == [op.op for op in real.ops if op.flops] == ["aten.mm"]
    assert memory_figures(analytic) == memory_figures(real)


class ConvertedHead(nn.Module):
    """Converts its head to double precision as it runs (as Switch Transformers' router does with
    ``self.classifier.to(self.dtype)``): a module conversion of the run's own parameters."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(64, 64), nn.Linear(64, 4)

    def forward(self, x):
        self.head.double()
        return self.head(self.body(x).double()).float()


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_module_converted_as_it_runs_converts_the_runs_parameters_in_place(train):
    model, x = ConvertedHead(), torch.randn(4, 64)
    analytic = profile(model, x, train=train, device="meta")
    # the head's single-precision weights are freed by the conversion: at the peak the parameters are the body's alone
    assert analytic.memory.peak_breakdown["parameters"] == (64 * 64 + 64) * 4
    assert model.head.weight.dtype == torch.float32  # the caller's model is left as it was
    assert analytic.flops == profile(model, x, train=train).flops
    if not train:  # a real inference run converts the model's own parameters, as the model asks
        model = ConvertedHead()
        assert profile(model, x).peak_memory_bytes == analytic.peak_memory_bytes
        assert model.head.weight.dtype == torch.float64
