"""Latency, throughput and per-module times on the CPU, checked against torch's own timers."""

import json
import math
import statistics
import warnings

import pytest
import torch
from torch import nn
from torch.utils.benchmark import Timer

from pytest_modelprof import LatencyWarning, ProfileError, Timing, machine_name, profile
from pytest_modelprof.engine import stats

QUICK = Timing(budget=0.3, warmup=1, min_repeats=5)


class MatMul(nn.Module):
    """A known workload: one 384 x 384 matrix product (2 * 384**3 FLOPs)."""

    def __init__(self, size=384):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(size, size))

    def forward(self, x):
        return torch.mm(x, self.weight)


class ConvStack(nn.Module):
    """Convolutions heavy enough that the profiler's per-op cost is small beside them."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))

    def forward(self, x):
        return self.head(self.body(self.stem(x)))


# statistics --------------------------------------------------------------------


def test_statistics_agree_with_the_standard_library():
    values = [3.0, 1.0, 4.0, 1.5, 5.0, 9.0, 2.0, 6.0]
    assert stats.median(values) == statistics.median(values)
    low, _, high = statistics.quantiles(values, n=4, method="inclusive")
    assert stats.iqr(values) == pytest.approx(high - low)
    assert stats.std(values) == pytest.approx(statistics.stdev(values))
    assert stats.mean(values) == pytest.approx(statistics.fmean(values))


@pytest.mark.parametrize(("n", "rank"), [(6, 1), (10, 2), (20, 6), (50, 18)])
def test_median_interval_uses_the_binomial_order_statistics(n, rank):
    # 95% intervals for the median from the binomial table: the rank-th smallest and largest values
    assert stats.median_interval(list(range(n)), 0.95) == (rank - 1, n - rank)


def test_median_interval_covers_the_median_at_its_confidence():
    import random

    rng = random.Random(0)
    trials, n = 2000, 25
    misses = 0
    for _ in range(trials):
        low, high = stats.median_interval([rng.lognormvariate(0, 1) for _ in range(n)], 0.9)
        misses += not low <= 1.0 <= high  # the median of a lognormal(0, 1) is e**0 = 1
    assert misses / trials < 0.1 + 0.02


# latency -----------------------------------------------------------------------


def test_latency_of_a_matrix_product_agrees_with_torch_benchmark_timer():
    model, x = MatMul(512).eval(), torch.randn(512, 512)
    timer = Timer("model(x)", globals={"model": model, "x": x}, num_threads=torch.get_num_threads())

    def theirs():
        # many short blocks (blocked_autorange takes 2 or 3 long ones in this time: a noisy median)
        with torch.no_grad():
            return statistics.median(timer.timeit(number=4).median for _ in range(15))

    def ours():
        return profile(model, x, memory=False, latency=Timing(budget=0.1, calibrate=False)).latency_seconds

    ratios = []
    for pair in range(25):  # adjacent pairs, each going first in turn, so that the machine's drift reaches both alike
        if pair % 2:
            other, mine = theirs(), ours()
        else:
            mine, other = ours(), theirs()
        ratios.append(mine / other)
    # the first second is left out: after memory-heavy tests this machine settles for a while
    # (the first pairs measured 1.8, 1.2, 1.1 before settling near 1.0)
    assert statistics.median(ratios[4:]) == pytest.approx(1.0, rel=0.05)


def test_latency_statistics_throughput_and_flop_rate():
    result = profile(MatMul(), torch.randn(64, 384), latency=QUICK)
    report = result.latency
    assert report.runs >= QUICK.min_repeats and report.calls_per_sample >= 1
    assert report.min <= report.median <= max(report.samples)
    assert report.iqr >= 0 and report.std >= 0 and report.mean > 0
    assert result.latency_seconds == report.median
    assert report.throughput == pytest.approx(64 / report.median)
    assert result.flops == 2 * 64 * 384 * 384
    assert result.flops_per_second == pytest.approx(result.flops / report.median)
    assert len(report.calibration) == report.runs
    assert result.machine == report.machine == machine_name(torch.device("cpu"))
    low, high = report.interval()
    assert low <= report.median <= high
    assert report.calibration_seconds is not None
    assert statistics.median(report.ratios) * report.calibration_seconds == pytest.approx(report.median)


def test_a_training_step_takes_longer_than_its_forward_pass():
    model, x = ConvStack(), torch.randn(2, 3, 32, 32)
    inference = profile(model, x, memory=False, latency=QUICK)
    step = profile(model, x, memory=False, train=True, latency=QUICK)
    assert step.latency_seconds > 1.5 * inference.latency_seconds


def test_tiny_calls_are_batched_into_measurable_repeats():
    result = profile(nn.Identity(), torch.ones(1), memory=False, latency=QUICK)
    assert result.latency.calls_per_sample > 1
    assert result.latency_seconds < 1e-3


def test_machine_names_the_cpu_and_its_threads():
    threads = torch.get_num_threads()
    name = machine_name(torch.device("cpu"))
    assert name.startswith("cpu-") and name.endswith(f"-{threads}t")
    assert all(c.isalnum() or c == "-" for c in name)
    torch.set_num_threads(1)
    try:
        assert machine_name(torch.device("cpu")).endswith("-1t")
    finally:
        torch.set_num_threads(threads)


def test_timing_leaves_the_model_and_optimizer_as_they_were():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 10))
    model.train()
    optimizer = torch.optim.Adam(model.parameters())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profile(model, torch.randn(2, 3, 16, 16), train=True, optimizer=optimizer, memory=False, latency=QUICK)
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert optimizer.state == {} or all(not s for s in optimizer.state.values())
    assert not torch.nn.modules.module._global_forward_hooks and not torch.nn.modules.module._global_forward_pre_hooks


# per-module and per-operator times ---------------------------------------------------


def mlp():
    block = lambda: nn.Sequential(nn.Linear(1024, 1024), nn.ReLU())  # noqa: E731
    return nn.Sequential(block(), block(), nn.Linear(1024, 1024))


def test_module_times_add_up_to_the_model_latency():
    # Both are measured at different moments of a noisy machine: take the median of a few
    # rounds, each timing the model and then profiling its layers.
    # operators of several milliseconds: the profiler's few microseconds per operator stay small beside them
    model, x = mlp(), torch.randn(512, 1024)
    rounds = [profile(model, x, memory=False, latency=Timing(budget=0.5, layers=True, layer_repeats=9)) for _ in range(7)]
    for result in rounds:
        root = result.module("")
        assert sum(m.self_forward_seconds for m in result.modules) == pytest.approx(root.forward_seconds, rel=0.05)
        first = result.module("0")
        assert first.self_forward_seconds < 0.1 * first.forward_seconds  # a container's own time is its hooks'
        linears = [o for o in result.op_times if o.op == "aten::linear"]
        assert sorted(o.module for o in linears) == ["0.0", "1.0", "2"]
        assert all(o.calls == 1 and o.phase == "forward" for o in linears)
    children = statistics.median(sum(m.forward_seconds for m in r.modules if m.depth == 1) / r.latency_seconds for r in rounds)
    assert children == pytest.approx(1.0, rel=0.10)
    assert statistics.median(r.module("").forward_seconds / r.latency_seconds for r in rounds) == pytest.approx(1.0, rel=0.10)


def test_backward_time_goes_to_the_module_that_ran_forward():
    result = profile(ConvStack(), torch.randn(2, 3, 32, 32), memory=False, train=True, latency=Timing(budget=0.5, layers=True))
    root = result.module("")
    assert root.backward_seconds > 0
    assert sum(m.self_backward_seconds for m in result.modules) == pytest.approx(root.backward_seconds)
    for path in ("stem.0", "body.0", "body.2", "head.2"):
        assert result.module(path).backward_seconds > 0, path
    backward_ops = {(o.op, o.module) for o in result.op_times if o.phase == "backward"}
    assert ("aten::convolution_backward", "body.2") in backward_ops
    assert ("aten::mm", "head.2") in backward_ops
    loss = [o for o in result.op_times if o.phase == "other"]
    assert any(o.op == "aten::sum" for o in loss)  # the default loss runs outside the model


def test_trace_is_written_for_chrome_and_perfetto(tmp_path):
    trace = tmp_path / "trace.json"
    profile(ConvStack(), torch.randn(1, 3, 16, 16), memory=False, latency=Timing(budget=0.2, layers=True, layer_repeats=1, trace=trace))
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert "modelprof::body.0" in names and "aten::conv2d" in names


# what cannot be timed, or not cleanly ----------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"repeats": 0}, "repeats must be a whole number of at least 1"),
        ({"budget": 0}, "positive number of seconds"),
        ({"budget": math.nan}, "positive number of seconds"),
        ({"min_repeats": 0}, "min_repeats"),
        ({"warmup": -1}, "warmup"),
    ],
)
def test_bad_timing_options(options, message):
    with pytest.raises(ValueError, match=message):
        Timing(**options)


def test_a_budget_shorter_than_one_call_is_refused():
    with pytest.raises(ProfileError, match=r"timing budget of 1e-06 s is shorter than one call .* give at least"):
        profile(ConvStack(), torch.randn(2, 3, 32, 32), memory=False, latency=Timing(budget=1e-6))


def test_a_budget_too_small_for_the_minimum_repeats_warns():
    with pytest.warns(LatencyWarning, match="ran min_repeats=50"):
        result = profile(ConvStack(), torch.randn(2, 3, 32, 32), memory=False, latency=Timing(budget=0.01, min_repeats=50))
    assert result.latency.runs == 50
    assert any("min_repeats" in w for w in result.latency.warnings)


def test_analytic_runs_cannot_be_timed():
    with pytest.raises(ProfileError, match="latency needs real tensors"):
        profile(MatMul(), torch.randn(4, 384), device="meta", latency=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on machines without a GPU")
def test_an_unavailable_device_is_an_error():
    with pytest.raises(ProfileError, match="CUDA is not available"):
        profile(MatMul(), torch.randn(4, 384), device="cuda", latency=True)


def test_dropout_in_train_mode_is_warned_about():
    model = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5))
    with pytest.warns(LatencyWarning, match=r"draws random numbers in train mode \(dropout\?\): aten.bernoulli_"):
        profile(model, torch.randn(4, 16), memory=False, train=True, latency=QUICK)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # eval mode: dropout is off, nothing to warn about
        profile(model, torch.randn(4, 16), memory=False, latency=QUICK)


class Counter(nn.Module):
    """Keeps state between calls: its output changes with every call."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count += 1
        return x * self.count


class Branchy(nn.Module):
    """Runs a different path on every other call."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x.exp() if self.calls % 2 else x.sin().cos()


@pytest.mark.parametrize(
    ("model", "message"), [(Counter(), "output changed between two calls"), (Branchy(), "different operators on two calls")]
)
def test_a_model_that_changes_between_calls_is_warned_about(model, message):
    with pytest.warns(LatencyWarning, match=message):
        result = profile(model, torch.randn(8), memory=False, latency=QUICK)
    assert any(message in w for w in result.latency.warnings)
