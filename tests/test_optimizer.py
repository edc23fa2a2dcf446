"""A training step with its optimizer step: every implementation of an optimizer costs
the same, the caller's optimizer is left as it was, and bad optimizers are refused."""

import dataclasses
import inspect

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from pytest_modelprof import ProfileError, profile
from pytest_modelprof.engine.analytic import values

PARAMS = 8 * 4 + 4  # nn.Linear(8, 4)
TENSORS = 2  # weight and bias: one step-counter increment each (Adam)


def model():
    return nn.Linear(8, 4)


def x():
    return torch.randn(3, 8)


IMPLEMENTATIONS = [dict(foreach=False), dict(foreach=True), dict(fused=True)]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=["for-loop", "foreach", "fused"])
@pytest.mark.parametrize(
    "make, per_element, counters",
    [
        (lambda p, **kw: torch.optim.Adam(p, **kw), 13, TENSORS),
        (lambda p, **kw: torch.optim.Adam(p, weight_decay=0.1, **kw), 14, TENSORS),
        (lambda p, **kw: torch.optim.AdamW(p, weight_decay=0.1, **kw), 14, TENSORS),
        (lambda p, **kw: torch.optim.SGD(p, lr=0.1, momentum=0.9, **kw), 3, 0),
        (lambda p, **kw: torch.optim.SGD(p, lr=0.1, **kw), 1, 0),
    ],
    ids=["adam", "adam-l2", "adamw", "sgd-momentum", "sgd"],
)
def test_every_implementation_costs_the_same(make, per_element, counters, implementation):
    net = model()
    optimizer = make(net.parameters(), **implementation)
    result = profile(net, x(), train=True, optimizer=optimizer)
    assert result.uncounted == {}
    assert result.optimizer_flops == per_element * PARAMS + counters
    assert result.flops == result.forward_flops + result.loss_flops + result.backward_flops + result.optimizer_flops


def test_analytic_step_equals_real_step():
    net = model()
    optimizer = torch.optim.AdamW(net.parameters())
    real = profile(net, x(), train=True, optimizer=optimizer)
    analytic = profile(net, x(), train=True, optimizer=optimizer, device="meta")
    assert (analytic.optimizer_flops, analytic.flops) == (real.optimizer_flops, real.flops)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=["for-loop", "foreach", "fused"])
@pytest.mark.parametrize("make", [torch.optim.Adam, torch.optim.AdamW], ids=["adam", "adamw"])
def test_analytic_step_of_an_optimizer_that_has_state(make, implementation):
    # after a real step, Adam's step counter is a CPU tensor whose value it reads (step.item()):
    # the analytic run must keep that value, not fail on a data-dependent read
    net = model()
    optimizer = make(net.parameters(), **implementation)
    net(x()).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    real = profile(net, x(), train=True, optimizer=optimizer)
    analytic = profile(net, x(), train=True, optimizer=optimizer, device="meta")
    assert analytic.optimizer_flops == real.optimizer_flops == 13 * PARAMS + TENSORS + (PARAMS if make is torch.optim.AdamW else 0)
    assert (analytic.flops, analytic.peak_memory_bytes) == (real.flops, real.peak_memory_bytes)
    assert optimizer.state[net.weight]["step"].item() == 1  # the caller's counter is left as it was


def test_the_callers_optimizer_and_model_are_left_as_they_were():
    net = model()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    net(x()).sum().backward()
    optimizer.step()  # the caller's optimizer has state now
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in optimizer.state.items()}
    weights = [p.detach().clone() for p in net.parameters()]
    grads = [p.grad.clone() for p in net.parameters()]
    profile(net, x(), train=True, optimizer=optimizer)
    assert all(torch.equal(a, b) for a, b in zip(weights, net.parameters()))
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, net.parameters()))
    for param, entries in optimizer.state.items():
        assert all(torch.equal(state[id(param)][k], v) for k, v in entries.items())


def test_frozen_parameters_are_not_stepped():
    net = nn.Sequential(nn.Linear(8, 8).requires_grad_(False), nn.Linear(8, 4))
    optimizer = torch.optim.SGD(net[1].parameters(), lr=0.1)
    result = profile(net, x(), train=True, optimizer=optimizer)
    assert result.optimizer_flops == PARAMS


def test_optimizer_of_another_model():
    with pytest.raises(ProfileError, match=r"optimizer holds a parameter of shape \(4, 8\) that is not one of Linear's parameters"):
        profile(model(), x(), train=True, optimizer=torch.optim.SGD(model().parameters(), lr=0.1))


def test_optimizer_needs_a_training_step():
    net = model()
    with pytest.raises(ProfileError, match="pass train=True with optimizer="):
        profile(net, x(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    with pytest.raises(TypeError, match=r"optimizer must be a torch\.optim\.Optimizer"):
        profile(net, x(), train=True, optimizer="adam")


@pytest.mark.parametrize(
    "make, per_element, counters",
    [
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True), 3, 0),
        # sum += g * g, std = sqrt(sum) + eps, p -= lr * g / std; a step counter per tensor
        (lambda p: torch.optim.Adagrad(p, fused=True), 7, TENSORS),
    ],
    ids=["sgd", "adagrad"],
)
def test_fused_steps_without_a_meta_kernel_run_analytically(make, per_element, counters):
    """PyTorch has no meta kernel for these: an analytic run must not fall back to running them for real."""
    net = model()
    real = profile(net, x(), train=True, optimizer=make(net.parameters()))
    analytic = profile(net, x(), train=True, optimizer=make(net.parameters()), device="meta")
    assert analytic.optimizer_flops == real.optimizer_flops == per_element * PARAMS + counters
    assert (analytic.flops, analytic.peak_memory_bytes) == (real.flops, real.peak_memory_bytes)


def fused_on_cuda(optimizer_class):
    """Whether this PyTorch's ``optimizer_class(fused=True)`` steps CUDA parameters: its device check
    leaves CUDA out where it has no CUDA kernel (Adagrad's in PyTorch 2.11)."""
    return "cuda_unsupported=True" not in inspect.getsource(optimizer_class)


@pytest.mark.parametrize(
    ("make", "op", "per_element", "counters"),
    [
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True), "aten._fused_sgd_", 3, 0),
        # Adagrad's constructor makes its fused step counters on the parameters' device: fake ones here
        (lambda p: torch.optim.Adagrad(p, fused=True), "aten._fused_adagrad_", 7, TENSORS),
    ],
    ids=["sgd", "adagrad"],
)
def test_fused_steps_on_a_gpu_target(make, op, per_element, counters):
    net = model()
    optimizer = make(net.parameters())
    if not fused_on_cuda(type(optimizer)):  # then a real CUDA step refuses it, and so does the run
        with pytest.raises(ProfileError, match=r"`fused=True` requires .* cuda"):
            profile(net, x(), train=True, optimizer=optimizer, target="h100")
        return
    result = profile(net, x(), train=True, optimizer=optimizer, target="h100")
    assert result.optimizer_flops == per_element * PARAMS + counters
    assert [o.op for o in result.predicted.ops if o.phase == "optimizer"] == [op]


def test_an_optimizer_that_needs_a_closure_is_refused_clearly():
    net = model()
    with pytest.raises(ProfileError, match=r"LBFGS\.step needs a closure"):
        profile(net, x(), train=True, optimizer=torch.optim.LBFGS(net.parameters()))


def test_an_optimizer_that_reads_the_weights_values_says_so_in_an_analytic_run():
    # Adafactor scales its step by the parameter's norm, read as a Python number
    net = model()
    with pytest.raises(ProfileError, match=r"the step of Adafactor .* reads the values of a tensor"):
        profile(net, x(), train=True, optimizer=torch.optim.Adafactor(net.parameters()), device="meta")


def test_an_analytic_step_reads_its_step_counts_above_the_fake_mode(monkeypatch):
    """A model stepped on fake tensors before it is profiled (as a 7B model is) holds Adam's step counts as its fake mode's
    constants, whose ``.item()`` the fake mode answers from the constant: the known-values layer answers it so, without
    the way down (every layer and the fake mode's uncached path), with the same figures."""
    mode = FakeTensorMode()
    with mode:
        net, inputs = model(), x()
        optimizer = torch.optim.AdamW(net.parameters(), foreach=True)
        net(inputs).sum().backward()
        optimizer.step()  # the state, the step counts among it, made by the fake mode
        optimizer.zero_grad()
    reads = []
    dispatch = FakeTensorMode.dispatch  # (where every way into the fake mode meets)

    def counted(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            reads.append(func)
        return dispatch(self, func, types, args, kwargs)

    monkeypatch.setattr(FakeTensorMode, "dispatch", counted)
    answered = profile(net, inputs, train=True, optimizer=optimizer)
    assert reads == []
    monkeypatch.setattr(values, "_constant_of", lambda t, followed: None)  # every read down to the fake mode, as before
    gone_down = profile(net, inputs, train=True, optimizer=optimizer)
    assert len(reads) == 2 * TENSORS  # both bias corrections of each tensor read its count
    assert dataclasses.asdict(answered) == dataclasses.asdict(gone_down)
