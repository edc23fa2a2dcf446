"""Which profiles the plugin times, and what it writes and reports about their latency."""

import json

import pytest
import tomlkit
from conftest import write_budget
from test_plugin_json import validate

from pytest_modelprof import machine_name
from pytest_modelprof.engine.timing import latency as timing

FAST = "--modelprof-time-budget=0.2"


def profile_json(pytester, name="test_models.py_test_small-"):
    files = [p for p in (pytester.path / "out").iterdir() if p.name.startswith(name)]
    return json.loads(files[0].read_text())


def test_a_profile_is_timed_when_its_budget_holds_a_latency_limit(project):
    write_budget(project, '[profiles."test_models.py::test_small"]\nmax_latency_ms = { cpu = 10000.0 }\n')
    result = project.runpytest(FAST, "--modelprof-json=out")
    result.assert_outcomes(passed=1)
    document = profile_json(project)
    validate(document, "profile.schema.json")
    latency = document["profile"]["latency"]
    assert latency["machine"] == machine_name(__import__("torch").device("cpu"))
    assert len(latency["samples"]) >= 3 and len(latency["calibration"]) == len(latency["samples"])
    assert document["findings"][0]["limit"] == "max_latency_ms" and document["findings"][0]["interval"] is not None
    result.stdout.fnmatch_lines(["*latency ms*", "*test_models.py::test_small*ok"])


def test_a_profile_without_latency_in_its_budget_is_not_timed(project):
    write_budget(project, '[profiles."test_models.py::test_small"]\nmax_gflops = 1.0\n')
    project.runpytest(FAST, "--modelprof-json=out").assert_outcomes(passed=1)
    assert profile_json(project)["profile"]["latency"] is None


def test_latency_modes_all_and_none(project):
    write_budget(project, '[profiles."test_models.py::test_small"]\nmax_latency_ms = { cpu = 10000.0 }\n')
    project.runpytest(FAST, "--modelprof-json=out", "--modelprof-latency=none").assert_outcomes(passed=1)
    assert profile_json(project)["profile"]["latency"] is None
    write_budget(project, '[profiles."test_models.py::test_small"]\nmax_gflops = 1.0\n')
    project.runpytest(FAST, "--modelprof-json=out", "--modelprof-latency=all").assert_outcomes(passed=1)
    assert profile_json(project)["profile"]["latency"] is not None


@pytest.fixture
def idle_cpu(monkeypatch):
    """The scheduler reports no waiting (whatever else this machine runs meanwhile)."""
    monkeypatch.setattr(timing, "cpu_wait_counters", lambda: None)


@pytest.fixture
def shared_cpu(monkeypatch):
    """The scheduler reports the run's threads waiting as long as they run (two busy neighbours on two cores)."""
    ticks = iter(range(1, 10**6))

    def counters():
        tick = next(ticks) * 10**9
        return tick, tick

    monkeypatch.setattr(timing, "cpu_wait_counters", counters)


def test_the_update_records_latency_and_calibration_for_this_machine(project, idle_cpu):
    path = write_budget(project, '[profiles."test_models.py::test_small"]\nmax_latency_ms = { cpu = 10000.0 }  # generous\n')
    project.runpytest(FAST, "--modelprof-update").assert_outcomes(passed=1)
    text = path.read_text()
    assert "max_latency_ms = { cpu = 10000.0 }  # generous" in text
    baseline = tomlkit.parse(text).unwrap()["profiles"]["test_models.py::test_small"]["baseline"]
    machine = machine_name(__import__("torch").device("cpu"))
    assert set(baseline["latency_ms"]) == {machine} and baseline["latency_ms"][machine] > 0
    assert set(baseline["calibration_ms"]) == {machine} and baseline["calibration_ms"][machine] > 0


def test_an_update_on_a_shared_cpu_keeps_the_recorded_latency_baseline(project, shared_cpu):
    machine = machine_name(__import__("torch").device("cpu"))
    text = (
        f'[profiles."test_models.py::test_small".baseline]\nlatency_ms = {{ {machine} = 0.05 }}\ncalibration_ms = {{ {machine} = 1.0 }}\n'
    )
    path = write_budget(project, text)
    result = project.runpytest(FAST, "--modelprof-update")
    result.assert_outcomes(passed=1)
    baseline = tomlkit.parse(path.read_text()).unwrap()["profiles"]["test_models.py::test_small"]["baseline"]
    assert baseline["latency_ms"] == {machine: 0.05} and baseline["calibration_ms"] == {machine: 1.0}
    assert baseline["gflops"] > 0  # the exact figures are recorded all the same
    result.stdout.fnmatch_lines(["*test_small: latency_ms: not recorded as a baseline (any recorded one is kept): the CPU was shared*"])


def test_a_comparison_on_a_shared_cpu_is_inconclusive_and_passes_under_w_error(project, shared_cpu):
    machine = machine_name(__import__("torch").device("cpu"))
    write_budget(
        project,
        f'[profiles."test_models.py::test_small".baseline]\nlatency_ms = {{ {machine} = 0.000001 }}\ncalibration_ms = {{ {machine} = 1.0 }}\n',
    )
    result = project.runpytest(FAST, "-W", "error", "--modelprof-time-budget=0.01")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_models.py::test_small * inconclusive",
            "*test_small: latency_ms: inconclusive: not compared with the baseline: the CPU was shared*",
            "*test_small: latency: the timing budget of 0.01 s allows * repeats *: the CPU was shared during the warm-up",
        ]
    )


def test_a_baseline_of_another_machine_is_reported_not_failed(project):
    write_budget(
        project,
        '[profiles."test_models.py::test_small".baseline]\nlatency_ms = { cpu-other-64t = 0.0001 }\ncalibration_ms = { cpu-other-64t = 1.0 }\n',
    )
    result = project.runpytest(FAST)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*test_small: latency_ms: no baseline for this machine (cpu-*; recorded for cpu-other-64t): not compared*"]
    )


def test_a_test_can_ask_for_timing_options(project):
    project.makepyfile(
        test_models="""
        import torch
        from torch import nn
        from pytest_modelprof import Timing

        def test_small(model_profile):
            result = model_profile(nn.Linear(4, 4), torch.ones(3, 4), latency=Timing(repeats=7, layers=True))
            assert result.latency.runs == 7
            assert result.module("").forward_seconds > 0
        """
    )
    project.runpytest("--modelprof-json=out").assert_outcomes(passed=1)
    document = profile_json(project)
    validate(document, "profile.schema.json")  # with module and operator times
    assert document["profile"]["op_times"]


def test_a_bad_time_budget_is_a_usage_error(project):
    result = project.runpytest("--modelprof-time-budget=soon")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--modelprof-time-budget expects a positive number of seconds, got 'soon'*"])
    result = project.runpytest("--modelprof-latency=sometimes")
    result.stderr.fnmatch_lines(["*--modelprof-latency expects one of auto, all, none, got 'sometimes'*"])
