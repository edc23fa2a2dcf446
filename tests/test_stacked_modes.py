"""The analytic run's dispatch modes, run as one mode (engine/analytic/layers.py)."""

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from models import TinyCNN
from pytest_modelprof import profile
from pytest_modelprof.engine.analytic.layers import Layer, Stacked
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


def test_an_analytic_run_has_one_engine_mode_beneath_its_meters(monkeypatch):
    # the known values, the kernels' outputs and a router's masks are layers of one mode between the meters'
    # dispatcher and the fake mode; each sees every op
    seen = {}

    class Probe(nn.Module):
        def forward(self, x):
            seen["stack"] = [type(mode) for mode in _get_current_dispatch_mode_stack()]
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
    assert seen["stack"] == [FakeTensorMode, Stacked, Dispatcher]
    assert aten.mul.Tensor in handled and aten.convolution.default in handled
    assert routed == handled  # (an inference step that reads no value: every op is passed on, to the bottom layer)
    assert result.flops == profile(nn.Sequential(Probe(), TinyCNN()), torch.randn(2, 3, 16, 16)).flops
