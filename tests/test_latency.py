"""Latency, throughput and per-module times on the CPU.

No test here asserts a relation between wall-clock times (a loaded machine breaks any):
the statistics are checked on synthetic samples, the repeat logic under a scripted clock,
and real timing runs only for what they record, not for how long they took.
"""

import json
import math
import statistics
import time
import warnings

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_modelprof import LatencyReport, LatencyWarning, ProfileError, Timing, machine_name, profile, stats
from pytest_modelprof.engine import run as engine_run
from pytest_modelprof.engine.timing import layers
from pytest_modelprof.engine.timing.latency import cpu_wait_counters, cpu_wait_share, measure_latency

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


def test_latency_statistics_throughput_and_flop_rate():
    result = profile(MatMul(), torch.randn(64, 384), latency=QUICK)
    report = result.latency
    assert report.runs == len(report.samples) >= 1 and report.calls_per_sample >= 1
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


def test_the_calibration_time_is_the_median_latency_over_the_median_ratio():
    # samples 10, 12, 14 ms timed beside calibrations of 1, 1, 2 ms: ratios 10, 12, 7, median 10;
    # the median latency, 12 ms, over that ratio: the calibration as the model's latency sees it
    ms = 1e-3
    report = LatencyReport(device="cpu", machine="a CPU", samples=[10 * ms, 12 * ms, 14 * ms], calibration=[1 * ms, 1 * ms, 2 * ms])
    assert report.ratios == pytest.approx([10, 12, 7])
    assert report.calibration_seconds == pytest.approx(1.2 * ms)
    assert LatencyReport(device="cpu", machine="a CPU", samples=[10 * ms]).calibration_seconds is None


class ScriptedClock:
    """Stands in for the timer: each call of ``time`` returns the next scripted seconds per call
    for the workload or the calibration, without running either (the decisions, not the machine)."""

    def __init__(self, model, calibration):
        self.model, self.calibration = iter(model), iter(calibration)
        self.calls = []

    def time(self, fn, calls):
        self.calls.append(calls)
        return next(self.calibration) if fn.__name__ == "run" else next(self.model)


def scripted(model, calibration, timing, counters=None):
    """measure_latency of a small model under a scripted clock and scripted scheduler counters."""
    clock = ScriptedClock(model, calibration)
    readings = iter(counters or [])
    report = measure_latency(
        lambda: torch.ones(2) * 2,
        torch.device("cpu"),
        timing,
        train=False,
        batch_size=1,
        clock=clock,
        cpu_wait=lambda: next(readings, None),
    )
    return report, clock


def forever(seconds):
    return iter(lambda: seconds, None)


def test_repeats_fill_the_time_budget():
    # 10 ms a call: one call per repeat; calibration 1 ms a call: 5 calls (5 ms), plus one untimed
    report, _ = scripted(forever(10e-3), forever(1e-3), Timing(budget=1.0, warmup=2))
    assert report.calls_per_sample == 1
    assert report.runs == int(1.0 / (10e-3 + 6 * 1e-3))  # 62 repeats of model and calibration
    assert report.samples == [10e-3] * 62 and report.calibration == [1e-3] * 62
    assert report.warnings == []


def test_tiny_calls_are_batched_into_measurable_repeats():
    report, clock = scripted(forever(2e-6), forever(1e-3), Timing(budget=0.5, warmup=1))
    assert report.calls_per_sample == math.ceil(5e-3 / 2e-6)
    assert report.calls_per_sample in clock.calls  # a timed repeat runs them all back to back


def test_a_budget_too_small_for_the_minimum_repeats_runs_them_and_says_so_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report, _ = scripted(forever(0.1), forever(1e-3), Timing(budget=0.5, min_repeats=10, warmup=1))
    assert report.runs == 10
    assert report.warnings == ["the timing budget of 0.5 s allows 4 repeats of 106 ms; ran 10 (1.1 s): min_repeats=10"]


def test_on_a_cpu_shared_in_the_warm_up_the_budget_is_kept():
    # warm-up: the threads ran 1 s and waited 1 s for a CPU (two busy neighbours on two cores)
    counters = [(0, 0), (10**9, 10**9), (10**9, 10**9), (2 * 10**9, 2 * 10**9)]
    report, _ = scripted(forever(0.5), forever(1e-3), Timing(budget=1.0, min_repeats=10, warmup=1), counters)
    assert report.runs == 3
    assert report.warnings == ["the timing budget of 1 s allows 1 repeats of 506 ms; ran 3 (1.5 s): the CPU was shared during the warm-up"]
    assert report.cpu_wait == pytest.approx(0.5)
    assert report.disturbance.startswith("the CPU was shared: the run's threads waited for a CPU 50% of the time")


@pytest.mark.parametrize(("run", "wait", "disturbed"), [(10**9, 4 * 10**6, False), (10**9, 10**8, False), (10**9, 2 * 10**8, True)])
def test_cpu_wait_is_the_share_of_runnable_time_spent_waiting(run, wait, disturbed):
    counters = [(0, 0), (0, 0), (5, 5), (5 + run, 5 + wait)]
    report, _ = scripted(forever(0.01), forever(1e-3), Timing(budget=0.2, warmup=1), counters)
    assert report.cpu_wait == pytest.approx(wait / (run + wait))
    assert (report.disturbance is not None) is disturbed


def test_without_scheduler_counters_nothing_is_called_disturbed():
    report, _ = scripted(forever(0.01), forever(1e-3), Timing(budget=0.2, warmup=1))
    assert report.cpu_wait is None and report.disturbance is None


def test_this_process_cpu_counters_move_as_it_runs():
    before = cpu_wait_counters()
    if before is None:
        pytest.skip("this system has no per-thread scheduler statistics")
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    after = cpu_wait_counters()
    assert after[0] - before[0] >= 0.04e9  # at least the CPU time just spent, in ns
    assert 0.0 <= cpu_wait_share(before, after) <= 1.0


class Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def test_the_timed_training_step_runs_forward_backward_and_the_optimizer(monkeypatch):
    model, x = ConvStack(), torch.randn(2, 3, 16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    recorder = Recorder()

    class RecordingClock:
        def time(self, fn, calls):
            if fn.__name__ == "step" and not recorder.ops:
                with recorder:
                    fn()
            return 1e-3

    real = engine_run.measure_latency
    monkeypatch.setattr(engine_run, "measure_latency", lambda *args, **kwargs: real(*args, clock=RecordingClock(), **kwargs))
    profile(model, x, train=True, optimizer=optimizer, memory=False, latency=QUICK)
    assert "aten.convolution" in recorder.ops and "aten.convolution_backward" in recorder.ops
    assert "aten.addmm" in recorder.ops  # the head's Linear
    assert recorder.ops.count("aten.add_") >= len(list(model.parameters()))  # SGD's updates


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


def test_module_times_nest_and_operators_land_in_their_modules():
    # (how close the layers' sum comes to the latency is a wall-clock relation: benchmarks/latency_vs_timer.py prints it)
    result = profile(mlp(), torch.randn(64, 1024), memory=False, latency=Timing(budget=0.2, layers=True, layer_repeats=3))
    root = result.module("")
    assert sum(m.self_forward_seconds for m in result.modules) == pytest.approx(root.forward_seconds, rel=1e-6)
    for block in ("0", "1"):
        inner = [m for m in result.modules if m.path.startswith(block + ".")]
        assert sum(m.forward_seconds for m in inner) + result.module(block).self_forward_seconds == pytest.approx(
            result.module(block).forward_seconds, rel=1e-6
        )
    linears = [o for o in result.op_times if o.op == "aten::linear"]
    assert sorted(o.module for o in linears) == ["0.0", "1.0", "2"]
    assert all(o.calls == 1 and o.phase == "forward" for o in linears)


class WarnsAtStart(torch.profiler.profile):
    """The profiler as PyTorch 2.11 runs it: it warns as it starts, whatever its schedule (later releases
    warn only as a second cycle starts)."""

    def start(self):
        warnings.warn(
            "Warning: Profiler clears events at the end of each cycle.Only events from the current cycle will be "
            "reported.To keep events across cycles, set acc_events=True.",
            UserWarning,
            stacklevel=2,
        )
        super().start()


@pytest.mark.parametrize("profiler", [torch.profiler.profile, WarnsAtStart], ids=["installed", "2.11"])
def test_layer_timing_raises_no_profiler_warning(monkeypatch, profiler):
    monkeypatch.setattr(layers, "torch_profile", profiler)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a user's -W error
        result = profile(mlp(), torch.randn(4, 1024), memory=False, latency=Timing(budget=0.1, layers=True, layer_repeats=2))
    assert {o.op for o in result.op_times} >= {"aten::linear"}


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
    idle = [(0, 0), (10**9, 10**6)]  # the threads hardly waited for a CPU: the budget itself is too short
    # at least min_repeats=10 repeats of 3 calls of 2 ms (5 ms or more) and 5 + 1 calibration calls of 1 ms
    with pytest.raises(ProfileError, match=r"budget of 0.000001 s is shorter than one call of the workload \(2 ms\): give at least 0.12 s"):
        scripted(forever(2e-3), forever(1e-3), Timing(budget=1e-6, warmup=1), idle)


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


class Attention(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.proj, self.dropout = nn.Linear(16, 48), dropout

    def forward(self, x):
        q, k, v = self.proj(x).view(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)


def test_attention_without_dropout_is_not_called_random_in_train_mode():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = profile(Attention(0.0), torch.randn(2, 8, 16), memory=False, train=True, latency=QUICK)
    assert not any("random" in w for w in result.latency.warnings)
    with pytest.warns(LatencyWarning, match="draws random numbers in train mode"):
        profile(Attention(0.1), torch.randn(2, 8, 16), memory=False, train=True, latency=QUICK)


def test_a_budget_shorter_than_one_call_on_a_shared_cpu_runs_a_few_repeats_instead_of_failing():
    # two busy neighbours on two cores made one call take 0.65 s where 0.3 s was asked for
    counters = [(0, 0), (10**9, 10**9), (10**9, 10**9), (2 * 10**9, 2 * 10**9)]
    report, _ = scripted(forever(0.65), forever(1e-3), Timing(budget=0.3, warmup=1), counters)
    assert report.runs == 3
    assert report.disturbance is not None
    assert report.warnings[0].endswith("ran 3 (2 s): the CPU was shared during the warm-up")
