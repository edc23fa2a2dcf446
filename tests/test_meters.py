"""Meters are peers on one stream of dispatched ops: a meter of the user's is one class, the
engine's meters run alone or together, and what one measures does not depend on the others."""

import gc
import sys
from collections import Counter

import pytest
import torch
from torch import nn

from pytest_modelprof import Meter, ProfileError, profile
from pytest_modelprof.budgets import METRICS
from pytest_modelprof.engine.run import _no_full_collections

N, A, B, C = 16, 32, 64, 8


def stack():
    return nn.Sequential(nn.Linear(A, B, bias=False), nn.ReLU(), nn.Linear(B, C, bias=False))


class OpsPerModule(Meter):
    """The toy meter: how many ops ran in each module, by phase; and the step's regions."""

    def __init__(self):
        self.counts = Counter()
        self.regions = []

    def op(self, op):
        self.counts[op.phase, op.key[-1] if op.key else None, op.name] += 1

    def region(self, name):
        self.regions.append(name)


@pytest.mark.parametrize("device", [None, "meta"], ids=["real", "analytic"])
def test_a_meter_of_one_class_sees_every_op_with_phase_and_module(device):
    toy = OpsPerModule()
    result = profile(stack(), torch.randn(N, A), train=True, device=device, meters=[toy])
    # forward: each Linear without bias is one aten.mm (after the weight's transpose), ReLU one aten.relu
    assert toy.counts["forward", "0", "aten.mm"] == 1
    assert toy.counts["forward", "1", "aten.relu"] == 1
    assert toy.counts["forward", "2", "aten.mm"] == 1
    # backward: the second Linear needs the gradients of its input and its weight, the first only
    # its weight's (the input needs no gradient)
    assert toy.counts["backward", "2", "aten.mm"] == 2
    assert toy.counts["backward", "0", "aten.mm"] == 1
    assert toy.counts["backward", "1", "aten.threshold_backward"] == 1
    assert toy.regions == ["loss", "end"]
    # the engine's meters saw the same stream: the toy's counts are the operator table's calls
    for row in result.ops:
        mine = sum(n for (phase, _, name), n in toy.counts.items() if (phase, name) == (row.phase, row.op))
        assert mine == row.calls, row


def test_a_meter_hears_the_optimizer_region():
    toy = OpsPerModule()
    model = stack()
    profile(model, torch.randn(N, A), train=True, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), meters=[toy])
    assert toy.regions == ["loss", "optimizer", "end"]
    assert any(phase == "optimizer" for phase, _, _ in toy.counts)


def test_a_meter_alone_runs_without_the_engine_s_meters():
    toy = OpsPerModule()
    result = profile(stack(), torch.randn(N, A), flops=False, memory=False, meters=[toy])
    assert sum(toy.counts.values()) >= 3
    assert not result.flops_counted and result.memory is None and result.ops == []


def test_meters_must_be_meters():
    with pytest.raises(TypeError, match=r"meters= takes instances of pytest_modelprof\.engine\.meters\.Meter, got Counter"):
        profile(stack(), torch.randn(N, A), meters=[Counter()])


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_memory_alone_measures_what_it_measures_beside_the_flop_meter(train):
    both = profile(stack(), torch.randn(N, A), train=train)
    alone = profile(stack(), torch.randn(N, A), train=train, flops=False)
    assert alone.memory == both.memory
    assert alone.peak_activation_bytes == both.peak_activation_bytes
    assert [m.activation_bytes for m in alone.modules] == [m.activation_bytes for m in both.modules]
    # FLOPs were not measured: said so, never a zero that looks like a measurement
    assert not alone.flops_counted and both.flops_counted
    assert alone.uncounted == {}
    assert METRICS["gflops"].measure(alone) is None
    assert METRICS["gflops"].measure(both) == both.flops / 1e9
    # its operator table still says what each op allocated, with calls and no FLOPs
    mm = [row for row in alone.ops if row.op == "aten.mm" and row.phase == "forward"]
    assert [(r.calls, r.flops, r.allocated_bytes) for r in mm] == [(2, 0, 4 * N * (B + C))]


def test_flops_alone_measure_what_they_measure_beside_the_memory_meter():
    both = profile(stack(), torch.randn(N, A), train=True)
    alone = profile(stack(), torch.randn(N, A), train=True, memory=False)
    assert alone.memory is None and alone.peak_memory_bytes is None
    forward = 2 * N * A * B + N * B + 2 * N * B * C  # mm, relu (1 per element), mm
    loss = N * C  # the sum: 1 per element summed
    backward = 2 * (2 * N * B * C) + N * B + 2 * N * A * B  # the second Linear's two products, threshold_backward, the first's weight
    assert alone.flops == both.flops == forward + loss + backward
    # (the memory meter's saved-tensors hook moves autograd's detach of a saved tensor from the forward
    # pass to the backward pass: the 0-FLOP rows of data movement can differ, the counted ones cannot)
    assert [(r.op, r.phase, r.calls, r.flops) for r in alone.ops if r.flops] == [
        (r.op, r.phase, r.calls, r.flops) for r in both.ops if r.flops
    ]


class Thresholds(Meter):
    """The collector's thresholds while each op runs."""

    def __init__(self):
        self.seen = set()

    def op(self, op):
        self.seen.add(gc.get_threshold())


class Raises(nn.Module):
    def forward(self, x):
        raise ValueError("no")


# Python 3.14's incremental collector has no third threshold (it reads 0 and ignores what is set)
THIRD_THRESHOLD = sys.version_info < (3, 14)


@pytest.mark.parametrize("device", [None, "meta"], ids=["real", "analytic"])
def test_a_run_holds_off_full_collections_and_gives_the_thresholds_back(device):
    # a full collection goes over every object of the process; while a run goes on, none is set off
    before = gc.get_threshold()
    gc.set_threshold(500, 7, 9)  # a process's own thresholds
    try:
        own = gc.get_threshold()
        watch = Thresholds()
        profile(stack(), torch.randn(N, A), train=True, device=device, meters=[watch])
        assert watch.seen and all(t[:2] == (500, 7) for t in watch.seen)
        if THIRD_THRESHOLD:
            assert all(t[2] > 1_000_000 for t in watch.seen)
        assert gc.get_threshold() == own
        with pytest.raises(ProfileError, match="raised ValueError: no"):
            profile(Raises(), torch.randn(N, A), device=device)
        assert gc.get_threshold() == own
    finally:
        gc.set_threshold(*before)


def test_runs_under_way_together_give_the_thresholds_back_when_the_last_ends():
    # runs on two threads (or one within another) that end in either order
    own = gc.get_threshold()
    first, second = _no_full_collections(), _no_full_collections()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    if THIRD_THRESHOLD:
        assert gc.get_threshold()[2] > 1_000_000  # the second is still under way
    second.__exit__(None, None, None)
    assert gc.get_threshold() == own
