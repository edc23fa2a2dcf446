"""The budget model for memory and latency figures, held against hand-written budgets.

These metrics are filled by the memory and latency meters; here profiles carry them
directly, so the budget logic is checked on its own.
"""

import pytest

from pytest_modelprof import Profile
from pytest_modelprof.budgets import IMPROVED, NEW, OK, REGRESSED, check, load_budgets
from pytest_modelprof.budgets.write import updated_text
from pytest_modelprof.report.summary import format_markdown, format_table, summary_row

BUDGET = """\
[profiles."net"]
max_peak_memory_mb = 500.0
max_latency_ms = { cpu = 20.0, cuda = 2.0 }
tolerance = { latency_ms = "1.5 ms", peak_activation_mb = "5%" }

[profiles."net".baseline]
peak_activation_mb = 100.0
latency_ms = { "cpu: test machine" = 10.0 }
"""


def measured(device="cpu", peak=400e6, activations=100e6, latency=0.010, machine="cpu: test machine"):
    return Profile(
        model="Net",
        train=False,
        device=device,
        analytic=False,
        params=10,
        peak_memory_bytes=int(peak),
        peak_activation_bytes=int(activations),
        latency_seconds=latency,
        machine=machine,
    )


@pytest.fixture
def budget(tmp_path):
    (tmp_path / "b.toml").write_text(BUDGET)
    return load_budgets(tmp_path).profiles["net"]


def test_everything_within_budget(budget):
    assert check(measured(), "net", budget).status == OK


def test_megabytes_are_decimal(budget):
    verdict = check(measured(peak=500_001_000), "net", budget)
    assert verdict.status == REGRESSED
    assert verdict.regressions[0].message().startswith("peak_memory_mb: measured 500.001 MB, allowed 500 MB (max_peak_memory_mb)")
    assert check(measured(peak=500_000_000), "net", budget).status == OK


def test_latency_ceiling_is_per_device(budget):
    assert check(measured(latency=0.019, machine="cpu: laptop"), "net", budget).status == OK
    assert check(measured(latency=0.021, machine="cpu: laptop"), "net", budget).status == REGRESSED
    cuda = check(measured(device="cuda:0", latency=0.003, machine="cuda: H100"), "net", budget)
    assert cuda.status == REGRESSED
    assert cuda.regressions[0].limit == "max_latency_ms"
    assert cuda.regressions[0].line == 3


def test_latency_baseline_is_per_machine_with_absolute_tolerance(budget):
    slower = check(measured(latency=0.0116), "net", budget)
    assert slower.status == REGRESSED
    assert "allowed 11.5 ms (baseline 10 ms + 1.5 ms): +16.00% (+1.6 ms) vs baseline" in slower.regressions[-1].message()
    assert check(measured(latency=0.0114), "net", budget).status == OK
    # another machine has no baseline: only the ceiling applies
    assert check(measured(latency=0.019, machine="cpu: laptop"), "net", budget).status == OK


def test_clear_improvement(budget):
    assert check(measured(activations=90e6), "net", budget).status == IMPROVED


def test_no_budget_is_new():
    assert check(measured(), "net", None).status == NEW


def test_update_writes_memory_and_per_machine_latency():
    text = updated_text(BUDGET, {"net": {"peak_activation_mb": 99.5, "latency_ms": {"cpu: laptop": 12.5}}})
    expected = BUDGET.replace("peak_activation_mb = 100.0", "peak_activation_mb = 99.5").replace(
        '{ "cpu: test machine" = 10.0 }', '{ "cpu: test machine" = 10.0, "cpu: laptop" = 12.5}'
    )
    assert text == expected  # the other machine's baseline and every hand-written line kept


def test_summary_shows_memory_and_latency_when_measured(budget):
    row = summary_row(check(measured(), "net", budget), measured(), None)
    header, line = format_table([row])
    assert header.split() == ["profile", "GFLOPs", "params", "peak", "MB", "latency", "ms", "status"]
    assert line.split() == ["net", "0", "10", "400", "10", "ok"]
    assert "| net | 0 | 10 | 400 | 10 | ok |" in format_markdown([row])


def test_default_tolerances_apply_when_a_budget_gives_none(tmp_path):
    # memory baselines default to 2%, latency to 10%: a default that reads "2%" but allows 0% is a defect
    (tmp_path / "b.toml").write_text('[profiles."net".baseline]\npeak_memory_mb = 100.0\nlatency_ms = { "cpu: test machine" = 10.0 }\n')
    budget = load_budgets(tmp_path).profiles["net"]
    assert check(measured(peak=101.9e6, latency=0.0109), "net", budget).status == OK
    over = check(measured(peak=102.1e6, latency=0.0111), "net", budget)
    assert {f.limit for f in over.regressions} == {"baseline.peak_memory_mb", "baseline.latency_ms.cpu: test machine"}
    assert "allowed 102 MB (baseline 100 MB + 2%)" in over.regressions[0].message()


PER_TARGET = """\
[profiles."net"]
max_peak_memory_mb = { h100 = 4200.0, l4 = 2000.0, cpu = 500.0 }
"""


def on_target(target, peak):
    profile = measured(device="cuda:0" if target else "cpu", peak=peak)
    profile.target = target
    return profile


def test_memory_ceilings_per_target_gpu(tmp_path):
    (tmp_path / "b.toml").write_text(PER_TARGET)
    budget = load_budgets(tmp_path).profiles["net"]
    assert check(on_target("h100", 4100e6), "net", budget).status == OK
    verdict = check(on_target("l4", 4100e6), "net", budget)
    assert verdict.status == REGRESSED
    assert verdict.regressions[0].message().startswith("peak_memory_mb: measured 4,100 MB, allowed 2,000 MB (max_peak_memory_mb)")
    assert check(on_target(None, 499e6), "net", budget).status == OK  # no target: the device kind's ceiling
    assert check(on_target(None, 501e6), "net", budget).status == REGRESSED
    # a target the table does not name is not checked, and the verdict says so
    unnamed = check(on_target("a100-80gb", 9e9), "net", budget)
    assert unnamed.status == OK
    assert any("max_peak_memory_mb: no ceiling for a100-80gb (given for cpu, h100, l4): not checked" in note for note in unnamed.notes)
