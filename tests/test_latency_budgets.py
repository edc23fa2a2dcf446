"""How a latency is held against its budget: through a confidence interval, at the baseline's machine speed.

The profiles here carry synthetic repeats, so each decision is checked on figures
chosen by hand (no timing noise in these tests).
"""

import re

import pytest

from pytest_modelprof import LatencyReport, Profile
from pytest_modelprof.budgets import IMPROVED, INCONCLUSIVE, OK, REGRESSED, check, load_budgets
from pytest_modelprof.budgets.write import baseline_values, updated_text

MACHINE = "cpu-test-2t"
BUDGET = f"""\
[profiles."net"]
max_latency_ms = {{ cpu = 20.0 }}

[profiles."net".baseline]
latency_ms = {{ {MACHINE} = 10.0 }}
calibration_ms = {{ {MACHINE} = 1.0 }}
"""


def timed(samples_ms, calibration_ms=None, machine=MACHINE, cpu_wait=0.005):
    """A profile whose repeats took ``samples_ms``, each beside a calibration of ``calibration_ms``,
    while the run's threads waited ``cpu_wait`` of their runnable time for a CPU."""
    samples = [s / 1e3 for s in samples_ms]
    calibration = [c / 1e3 for c in calibration_ms] if calibration_ms is not None else []
    report = LatencyReport(device="cpu", machine=machine, samples=samples, calibration=calibration, batch_size=1, cpu_wait=cpu_wait)
    return Profile(model="Net", train=False, device="cpu", analytic=False, latency=report, latency_seconds=report.median, machine=machine)


@pytest.fixture
def budget(tmp_path):
    (tmp_path / "b.toml").write_text(BUDGET)
    return load_budgets(tmp_path).profiles["net"]


def spread(centre, n=30, width=0.04):
    """``n`` values spread evenly over centre * (1 +- width)."""
    return [centre * (1 - width + 2 * width * i / (n - 1)) for i in range(n)]


def finding(verdict, limit):
    return next(f for f in verdict.findings if f.limit.startswith(limit))


def test_a_slower_machine_slows_the_calibration_too_and_passes(budget):
    # everything 60% slower today: the model and the calibration beside it alike
    verdict = check(timed(spread(16.0), spread(1.6)), "net", budget)
    assert verdict.status == OK
    result = finding(verdict, "baseline.latency_ms")
    assert result.measured == pytest.approx(10.0, rel=0.01)
    assert "at the baseline's machine speed: raw 16 ms, calibration x1.600" in result.message()


def test_a_slower_model_on_the_same_machine_fails(budget):
    verdict = check(timed(spread(12.5), [1.0] * 30), "net", budget)
    assert verdict.status == REGRESSED
    result = finding(verdict, "baseline.latency_ms")
    assert result.allowed == pytest.approx(11.0)  # the default latency tolerance: 10%
    low, high = result.interval
    assert 11.0 < low < 12.5 < high
    assert "latency_ms: measured 12.5 ms (median; 95% interval" in result.message()


def test_an_interval_across_the_limit_is_inconclusive_not_ok(budget):
    # median 11.3 ms, but the repeats spread 11.3 +- 20%: neither a regression shown nor a pass
    verdict = check(timed(spread(11.3, width=0.2), [1.0] * 30), "net", budget)
    result = finding(verdict, "baseline.latency_ms")
    assert result.measured > result.allowed
    assert result.interval[0] < result.allowed < result.interval[1]
    assert result.status == INCONCLUSIVE and verdict.status == INCONCLUSIVE
    [note] = verdict.notes
    assert re.fullmatch(
        r"latency_ms: inconclusive: the 95% interval of the median, 10\.\d+-12\.\d+ ms, reaches across the limit of 11 ms; "
        r"more repeats \(--modelprof-time-budget\) or a quieter machine decide it \[.*b\.toml:5\]",
        note,
    )


def test_a_median_under_the_limit_with_an_interval_across_it_is_inconclusive_too(budget):
    verdict = check(timed(spread(10.8, width=0.2), [1.0] * 30), "net", budget)
    assert verdict.status == INCONCLUSIVE


def test_on_a_shared_cpu_a_baseline_comparison_is_inconclusive_whatever_the_times(budget):
    # two busy neighbours on two cores: the model's threads wait, the small calibration much less
    for samples in (spread(16.0), spread(10.0), spread(8.0)):
        verdict = check(timed(samples, [1.0] * 30, cpu_wait=0.5), "net", budget)
        result = finding(verdict, "baseline.latency_ms")
        assert result.status == INCONCLUSIVE and verdict.status == INCONCLUSIVE
        assert result.reason.startswith("not compared with the baseline: the CPU was shared: the run's threads waited for a CPU 50%")


def test_on_a_shared_cpu_a_ceiling_passes_only_when_the_times_stay_under_it(budget):
    under = check(timed(spread(5.0), spread(0.5), cpu_wait=0.5), "net", budget)
    assert finding(under, "max_latency_ms").status == OK  # waiting only adds time: under is under
    over = check(timed(spread(30.0), spread(3.0), cpu_wait=0.5), "net", budget)
    assert finding(over, "max_latency_ms").status == INCONCLUSIVE
    assert over.status == INCONCLUSIVE and over.regressions == []


def test_a_disturbed_latency_is_not_recorded_as_a_baseline():
    profile = timed([10.0, 10.2, 9.8], [1.0, 1.02, 0.98], cpu_wait=0.4)
    values = baseline_values(profile)
    assert "latency_ms" not in values and "calibration_ms" not in values


def test_a_clearly_faster_model_is_an_improvement(budget):
    verdict = check(timed(spread(8.0), [1.0] * 30), "net", budget)
    assert verdict.status == IMPROVED


def test_without_a_recorded_calibration_raw_times_are_compared(budget, tmp_path):
    (tmp_path / "b.toml").write_text(BUDGET.replace(f"calibration_ms = {{ {MACHINE} = 1.0 }}\n", ""))
    budget = load_budgets(tmp_path).profiles["net"]
    assert check(timed(spread(16.0), spread(1.6)), "net", budget).status == REGRESSED
    assert check(timed(spread(10.2), spread(1.0)), "net", budget).status == OK


def test_the_ceiling_fails_only_when_the_whole_interval_is_above_it(budget):
    across = check(timed(spread(20.5, width=0.1), spread(2.0)), "net", budget)
    assert across.regressions == [] and finding(across, "max_latency_ms").status == INCONCLUSIVE
    over = check(timed(spread(24.0), spread(2.4)), "net", budget)
    assert [f.limit for f in over.regressions] == ["max_latency_ms"]  # the baseline passes at this machine speed


def test_another_machine_is_reported_not_failed(budget):
    verdict = check(timed(spread(50.0), spread(1.0), machine="cpu-laptop-8t"), "net", budget)
    assert [f.limit for f in verdict.findings] == ["max_latency_ms"]
    assert verdict.notes == [
        f"latency_ms: no baseline for this machine (cpu-laptop-8t; recorded for {MACHINE}): not compared; "
        f"pytest --modelprof-update records one [{budget.path}:5]"
    ]


def test_the_update_records_the_calibration_beside_the_latency(budget):
    profile = timed([10.0, 10.2, 9.8], [1.0, 1.02, 0.98])
    values = baseline_values(profile)
    assert values["latency_ms"] == {MACHINE: 10.0}
    assert values["calibration_ms"] == {MACHINE: pytest.approx(1.0, rel=0.02)}
    text = updated_text(BUDGET, {"net": values})
    assert check(profile, "net", load_budgets_text(text, budget.path.parent)).status == OK


def load_budgets_text(text, directory):
    (directory / "b.toml").write_text(text)
    return load_budgets(directory).profiles["net"]


def test_calibration_is_a_reference_not_a_limit(tmp_path):
    (tmp_path / "b.toml").write_text('[profiles."net"]\nmax_calibration_ms = 1.0\n')
    with pytest.raises(Exception, match=r"b.toml:2: .*max_calibration_ms"):
        load_budgets(tmp_path)
