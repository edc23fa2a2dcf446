"""The analytic run's dispatch modes, run as one mode (engine/analytic/layers.py)."""

import contextlib
import sys

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from models import TinyCNN
from pytest_modelprof import profile
from pytest_modelprof.engine.analytic.kernel_outputs import KernelOutputs
from pytest_modelprof.engine.analytic.layers import Layer, Stacked, called, into_fake_mode
from pytest_modelprof.engine.analytic.routing import Routing
from pytest_modelprof.engine.analytic.values import KnownValues
from pytest_modelprof.engine.observe.dispatch import Dispatcher

aten = torch.ops.aten


class Recording(Layer):
    """Notes each op it passes on, and what comes back up through it."""

    def __init__(self, name, log):
        super().__init__()
        self.name, self.log = name, log

    def handle(self, func, types, args, kwargs):
        self.log.append((self.name, "down", func))
        out = self.below(func, types, args, kwargs)
        self.log.append((self.name, "up", func))
        return out

    def started(self):
        self.log.append((self.name, "started", None))

    def stopped(self):
        self.log.append((self.name, "stopped", None))


def test_stacked_layers_see_an_op_in_the_order_separate_modes_would():
    def run(stacked):
        log = []
        top, bottom = Recording("top", log), Recording("bottom", log)
        with FakeTensorMode() as mode:
            x = mode.from_tensor(torch.ones(3))
            if stacked:
                with Stacked(top, bottom):
                    y = x.mul(2)
            else:  # entered as modes of their own: the last entered sits on top
                with bottom, top:
                    y = x.mul(2)
        assert y.shape == (3,) and type(y).__name__ == "FakeTensor"
        return log

    stacked, separate = run(True), run(False)
    ops = [entry for entry in separate if entry[2] is not None]
    assert ops == [
        ("top", "down", aten.mul.Tensor),
        ("bottom", "down", aten.mul.Tensor),
        ("bottom", "up", aten.mul.Tensor),
        ("top", "up", aten.mul.Tensor),
    ]
    assert [entry for entry in stacked if entry[2] is not None] == ops
    assert [entry[:2] for entry in stacked if entry[2] is None] == [
        ("top", "started"),
        ("bottom", "started"),
        ("bottom", "stopped"),
        ("top", "stopped"),
    ]


def test_an_analytic_run_has_one_engine_mode_above_the_fake_mode(monkeypatch):
    # the meters' dispatcher, the known values, the kernels' outputs and a router's masks are layers of one mode
    # above the fake mode, the dispatcher on top; each sees every op
    seen = {}

    class Probe(nn.Module):
        def forward(self, x):
            stack = _get_current_dispatch_mode_stack()
            seen.setdefault("stack", [type(mode) for mode in stack])  # (the analytic run's: the first)
            seen.setdefault("layers", [type(layer) for layer in getattr(stack[-1], "layers", ())])
            return x * 2

    handled = []
    stock = KnownValues.handle

    def handle(self, func, types, args, kwargs):
        handled.append(func)
        return stock(self, func, types, args, kwargs)

    routed = []
    stock_routing = Routing.handle

    def route(self, func, types, args, kwargs):
        routed.append(func)
        return stock_routing(self, func, types, args, kwargs)

    monkeypatch.setattr(KnownValues, "handle", handle)
    monkeypatch.setattr(Routing, "handle", route)
    result = profile(nn.Sequential(Probe(), TinyCNN()), torch.randn(2, 3, 16, 16), device="meta")
    assert seen["stack"] == [FakeTensorMode, Stacked]
    assert seen["layers"] == [Dispatcher, KnownValues, KernelOutputs, Routing]
    assert aten.mul.Tensor in handled and aten.convolution.default in handled
    assert routed == handled  # (an inference step that reads no value: every op is passed on, to the bottom layer)
    assert result.flops == profile(nn.Sequential(Probe(), TinyCNN()), torch.randn(2, 3, 16, 16)).flops


def test_a_layer_topped_on_an_entered_stack_sees_ops_first_until_lifted():
    log = []
    top, bottom, joining = Recording("top", log), Recording("bottom", log), Recording("joining", log)
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.ones(3))
        stacked = Stacked(top, bottom)
        with stacked:
            with stacked.topped(joining):
                x.mul(2)
                stacked.lift(joining)  # (a memo's replay: the op runs unseen by it)
                x.add(1)
                stacked.put(joining)
                x.sub(1)
            x.div(2)
    downs = [(name, func) for name, way, func in log if way == "down"]
    assert downs == [
        ("joining", aten.mul.Tensor),
        ("top", aten.mul.Tensor),
        ("bottom", aten.mul.Tensor),
        ("top", aten.add.Tensor),
        ("bottom", aten.add.Tensor),
        ("joining", aten.sub.Tensor),
        ("top", aten.sub.Tensor),
        ("bottom", aten.sub.Tensor),
        ("top", aten.div.Tensor),
        ("bottom", aten.div.Tensor),
    ]
    # the joining layer set itself up: the stack starts and stops only its own layers
    assert [entry[0] for entry in log if entry[1] in ("started", "stopped")] == ["top", "bottom", "bottom", "top"]
    with pytest.raises(ValueError, match="only a layer put on top"):
        stacked.lift(top)


def test_the_dispatcher_stays_a_mode_of_its_own_where_another_mode_sits_between(monkeypatch):
    # a mode entered between the analytic modes and the meters must see the ops between them, as before
    seen = {}
    stock = Dispatcher.attached

    class Between(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.setdefault("between", []).append(func)
            return func(*args, **(kwargs or {}))

    def attached(self, saved=None):
        with Between():
            with stock(self, saved):
                seen["stack"] = [type(mode) for mode in _get_current_dispatch_mode_stack()]
                yield

    monkeypatch.setattr(Dispatcher, "attached", contextlib.contextmanager(attached))
    result = profile(TinyCNN(), torch.randn(2, 3, 16, 16), device="meta")
    assert seen["stack"] == [FakeTensorMode, Stacked, Between, Dispatcher]
    assert aten.convolution.default in seen["between"]
    assert result.flops == profile(TinyCNN(), torch.randn(2, 3, 16, 16)).flops


class CallerNoting(FakeTensorMode):
    """A fake mode that notes the Python function that called its dispatch (C++ calls it from ``OpOverload.__call__``)."""

    def __init__(self):
        super().__init__()
        self.callers = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        frame = sys._getframe(1)
        while frame.f_code.co_filename.endswith(("_dynamo/eval_frame.py", "torch/_compile.py")):  # (the mode's wrapper)
            frame = frame.f_back
        self.callers.append((func, frame.f_code.co_name))
        return super().__torch_dispatch__(func, types, args, kwargs)


class Keeping(Layer):
    """Keeps what the layers beneath hand back for each op."""

    def __init__(self):
        super().__init__()
        self.outputs = {}

    def handle(self, func, types, args, kwargs):
        self.outputs[func] = out = self.below(func, types, args, kwargs)
        return out


def test_the_bottom_layer_calls_the_fake_mode_as_the_dispatcher_would_without_going_through_it():
    def run(bottom_of):
        keeping = Keeping()
        with CallerNoting() as mode:
            x = mode.from_tensor(torch.randn(4, 3, 5, 5))
            weight, bias = mode.from_tensor(torch.ones(3)), mode.from_tensor(torch.zeros(3))
            with Stacked(keeping, bottom=bottom_of(mode)):
                x.mul(2)
                x.split(2)
                aten.native_batch_norm.default(x, weight, bias, None, None, True, 0.1, 1e-5)  # (a decomposition)
        kept = keeping.outputs
        return mode.callers, (kept[aten.split.Tensor], kept[aten.native_batch_norm.default], kept[aten.mul.Tensor])

    direct, (pieces, normed, product) = run(into_fake_mode)
    through, (pieces_c, normed_c, product_c) = run(lambda mode: called)
    # the same outputs, in the containers the dispatcher gives back: a list for split's Tensor[], a tuple for several
    assert type(pieces) is type(pieces_c) is list and [p.shape for p in pieces] == [p.shape for p in pieces_c]
    assert type(normed) is type(normed_c) is tuple and [t.shape for t in normed] == [t.shape for t in normed_c]
    assert product.shape == product_c.shape and product.stride() == product_c.stride()
    ops = (aten.split.Tensor, aten.native_batch_norm.default, aten.mul.Tensor)
    first = [next(caller for func, caller in direct if func is op) for op in ops]  # (a decomposition's ops follow)
    assert first == ["below"] * 3  # called from Python
    first = [next(caller for func, caller in through if func is op) for op in ops]
    assert first == ["__call__"] * 3  # through the dispatcher (OpOverload.__call__)


def test_the_bottom_layer_goes_through_the_dispatcher_where_another_mode_sits_beneath_it():
    seen = []

    class Beneath(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with CallerNoting() as mode:
        x = mode.from_tensor(torch.ones(3))
        with Beneath(), Stacked(Recording("only", []), bottom=into_fake_mode(mode)):
            x.mul(2)
    assert seen == [aten.mul.Tensor]
    assert [caller for func, caller in mode.callers if func is aten.mul.Tensor] == ["__call__"]


@torch.library.custom_op("modelprof_stacked::widen", mutates_args=())
def widen(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x], dim=1)


@widen.register_fake
def _widen_fake(x):
    return x.new_empty(x.shape[0], x.shape[1])  # a fake kernel of the wrong shape: the rule below is what fake modes use


@torch.library.register_torch_dispatch("modelprof_stacked::widen", FakeTensorMode)
def _widen_rule(mode, func, types, args, kwargs):
    _widen_rule.calls += 1
    with mode:
        return torch.empty(args[0].shape[0], 2 * args[0].shape[1], device=args[0].device)


_widen_rule.calls = 0


class Widening(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return torch.ops.modelprof_stacked.widen(self.linear(x)).sum(-1) * 2


def test_an_op_with_a_rule_for_fake_modes_goes_through_the_dispatcher_which_calls_the_rule():
    x = torch.randn(4, 8)
    real = profile(Widening(), x)
    analytic = profile(Widening(), x, device="meta")
    assert _widen_rule.calls == 1
    assert analytic.flops == real.flops  # the rule's (N, 2D) output, summed and doubled, as the real kernel's
