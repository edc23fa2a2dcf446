"""The backward pass run in Python (analytic CUDA targets) against PyTorch's autograd engine.

On CPU fake tensors both can run: the same profile, run once with the engine and once
with :func:`~pytest_modelprof.engine.analytic.backward.run_backward`, must give the same
gradients' existence and layout, the same FLOPs per phase and operator, and the same
memory over time (peak, breakdown, every category's maximum).
"""

from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from pytest_modelprof import ProfileError, profile
from pytest_modelprof.engine import workload as workload_module
from pytest_modelprof.engine.analytic import backward as backward_module
from pytest_modelprof.engine.analytic.backward import SavedTensors, run_backward


@pytest.fixture
def python_backward(monkeypatch):
    """Every analytic run takes its backward pass through the Python executor."""
    monkeypatch.setattr(workload_module.Workload, "python_backward", property(lambda self: self.fake_mode is not None))


class Scale(torch.autograd.Function):
    """A custom Function with a non-tensor argument between two tensor ones."""

    @staticmethod
    def forward(ctx, x, factor, y):
        ctx.save_for_backward(x, y)
        ctx.factor = factor
        return x * y * factor

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return grad * y * ctx.factor, None, grad * x * ctx.factor


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.block = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
        self.gate = nn.Parameter(torch.ones(16))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        x = x + checkpoint(self.block, x, use_reentrant=False)  # recomputed in the backward pass
        x = Scale.apply(x, 2.0, self.gate.expand_as(x))
        return self.head(x) + self.head(x * 0.5)  # a module used twice: its gradients are summed


class InPlace(nn.Module):
    """In-place activations (autograd saves a clone of their input's old value, made after their
    node) and a branch whose output the forward pass drops (what it saved dies with it)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.Hardswish(inplace=True), nn.Linear(64, 64), nn.ReLU(inplace=True))
        self.aux = nn.Sequential(nn.Linear(32, 256), nn.GELU())
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        self.aux(x)  # computed and dropped
        return self.head(torch.nn.functional.hardsigmoid(self.body(x), inplace=True))


class InPlaceOnViews(nn.Module):
    """In-place ops on views (autograd wraps their nodes in CopySlices, and regenerates the view's
    node before saving an output): an in-place activation on a linear layer's 3-d output (a view
    of the matrix product, as in Swin V2's position-bias MLP), a bias cloned and partly zeroed,
    ops on slices that save their output, an operand, or a clone of the old value."""

    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(16, 64), nn.ReLU(inplace=True), nn.Linear(64, 16))
        self.weight = nn.Parameter(torch.randn(48, 16))
        self.bias = nn.Parameter(torch.ones(48))

    def forward(self, x):
        x = self.mlp(x)  # (batch, tokens, 16)
        bias = self.bias.clone()
        bias[16:32].zero_()
        x = torch.nn.functional.linear(x, self.weight, bias)  # (batch, tokens, 48)
        x[..., :16].sigmoid_()  # saves its output
        x[..., 16:32].mul_(x[..., 32:].exp())  # saves the operand and a clone of the old value
        x[..., 32:].pow_(2)  # saves a clone of the old value
        return x


class Stacked(nn.Module):
    """Blocks checkpointed one by one (each keeps its input until its nodes have run), and a block under
    saved-tensor hooks of the model's own (what they pack is dropped as each node has run)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32)) for _ in range(4))
        self.hooked = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 32))

    def forward(self, x):
        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=False)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (t,), lambda packed: packed[0]):
            return self.hooked(x)


def figures(result):
    memory = result.memory
    ops = sorted((o.op, o.phase, o.calls, o.flops) for o in result.ops)
    return (result.forward_flops, result.backward_flops, result.recompute_flops, result.optimizer_flops, ops), (
        memory.peak_bytes,
        memory.peak_phase,
        memory.peak_breakdown,
        memory.category_max,
        memory.timeline,
    )


@pytest.mark.parametrize(
    ("build", "shape"), [(Mixed, (8, 3, 16, 16)), (InPlace, (64, 32)), (InPlaceOnViews, (8, 32, 16)), (Stacked, (16, 32))]
)
@pytest.mark.parametrize("optimizer", [None, "adamw"])
def test_the_python_backward_pass_gives_the_engines_figures(monkeypatch, optimizer, build, shape):
    model = build()
    x = torch.randn(*shape)

    def run():
        opt = torch.optim.AdamW(model.parameters(), foreach=False) if optimizer else None
        return profile(model, x, train=True, device="meta", optimizer=opt)

    engine = run()
    monkeypatch.setattr(workload_module.Workload, "python_backward", property(lambda self: self.fake_mode is not None))
    # the engine never sums gradients in place into a fake tensor (a tensor subclass); the executor does where the
    # engine would into a plain one (test_gradients_are_summed_in_place_where_the_engine_sums_a_plain_tensors)
    monkeypatch.setattr(backward_module._Holders, "sums_in_place", lambda self, old, grad: False)
    python = run()
    assert figures(python) == figures(engine)
    assert python.backward_flops > 0 and (python.recompute_flops > 0 or build not in (Mixed, Stacked))


class Dense(nn.Module):
    """DenseNet's pattern: every layer reads the concatenation of all earlier feature maps, so each map's gradient
    is the sum of slices of the concatenations' gradients (views, which the engine adds out of place) and of the
    convolution's that made it (into which it then adds the rest in place)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.layers = nn.ModuleList(nn.Conv2d(8 * (i + 1), 8, 3, padding=1) for i in range(4))

    def forward(self, x):
        features = [self.stem(x)]
        for layer in self.layers:
            features.append(torch.relu(layer(torch.cat(features, 1))))
        return torch.cat(features, 1).mean((2, 3))


class Seeded(nn.Module):
    """A 0-d loss whose gradient (which the caller of ``backward`` holds) reaches one input twice: the engine adds
    the second out of place."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        a = self.w * 3
        return a + a * 2 + x.mean() * 0


@pytest.mark.filterwarnings("ignore:.*Profiler clears events:UserWarning")  # (torch 2.11's profiler, on entry)
@pytest.mark.parametrize("build", [Dense, Mixed, Seeded])
def test_gradients_are_summed_in_place_where_the_engine_sums_a_plain_tensors(build):
    # the engine adds a further gradient of an input into the first in place where that one is dense and no one
    # else holds it (InputBuffer::accumulate): the analytic CUDA step's adds and in-place adds against the engine's
    # on real CPU tensors, as its profiler records them
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    model, x = build(), torch.randn(2, 3, 8, 8) if build is Dense else torch.randn(8, 3, 16, 16)

    def loss_fn(out):
        return out if out.dim() == 0 else out.sum()  # (a 0-d output is the loss itself)

    result = profile(model, x, train=True, device="meta", target="h100", memory=False, flops=False, loss_fn=loss_fn)
    analytic = Counter()
    for row in result.predicted.ops:
        if row.phase == "backward" and row.op in ("aten.add", "aten.add_"):
            analytic[row.op.replace(".", "::")] += row.calls
    loss = loss_fn(model(x))
    with torch_profile(activities=[ProfilerActivity.CPU]) as recorded:
        loss.backward()
    real = Counter(event.name for event in recorded.events() if event.name in ("aten::add", "aten::add_"))
    assert analytic == real and real["aten::add_" if build is not Seeded else "aten::add"] > 0


def test_gradients_are_those_of_the_engine():
    """Real tensors: the executor's gradients equal autograd's, value for value."""
    torch.manual_seed(0)
    model = Mixed().train()
    x = torch.randn(4, 3, 8, 8)
    model(x).square().sum().backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    saved = SavedTensors()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        loss = model(x).square().sum()
    run_backward(loss, saved)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], msg=name)
        assert param.grad.stride() == param.stride()


def test_what_a_node_saved_is_released_once_it_has_run():
    saved = SavedTensors()
    x = torch.randn(64, 64, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        y = torch.sin(x)  # saves x
        z = torch.exp(y)  # saves its result
        loss = z.sum()
    assert sum(len(holders) for holders in saved._by_node.values()) == 2
    run_backward(loss, saved)
    assert not saved._by_node  # every holder emptied: the engine's release_variables
    with pytest.raises(RuntimeError, match="a second time"):
        run_backward(loss, saved)


def test_hooks_on_leaves_run_and_hooks_it_cannot_run_are_refused(python_backward):
    seen = []
    model = nn.Linear(8, 8)
    model.weight.register_hook(lambda g: seen.append("pre") or g * 2)
    model.weight.register_post_accumulate_grad_hook(lambda p: seen.append("post"))
    x = torch.randn(4, 8)
    saved = SavedTensors()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        loss = model(x).sum()
    run_backward(loss, saved)
    assert seen == ["pre", "post"]
    torch.testing.assert_close(model.weight.grad, 2 * x.sum(0).expand(8, 8))

    class Hooked(nn.Linear):
        def forward(self, x):
            out = super().forward(x)
            out.register_hook(lambda g: g)
            return out

    with pytest.raises(ProfileError, match="non-leaf tensor"):
        profile(Hooked(8, 8), x, train=True, target="h100")
