"""Under pytest-xdist: the same verdicts, one merged summary, and only the controller writes."""

import json

import pytest

pytest.importorskip("xdist")

TESTS = """
import pytest, torch
from torch import nn

@pytest.mark.parametrize("width", [2, 3, 4, 5, 6, 7])
def test_width(model_profile, width):
    model_profile(nn.Linear(width, width), torch.ones(1, width))
"""


@pytest.fixture
def xdist_project(pytester):
    pytester.makepyfile(test_models=TESTS)
    budgets = pytester.mkdir("budgets")
    (budgets / "test_models.toml").write_text('# limits\n[profiles."test_models.py::test_width[5]"]\nmax_params = 10\n')
    return pytester


def test_same_verdicts_and_one_merged_summary(xdist_project):
    serial = xdist_project.runpytest_subprocess("-p", "no:cacheprovider")
    parallel = xdist_project.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--modelprof-json", "artifacts")
    serial.assert_outcomes(passed=5, failed=1)
    parallel.assert_outcomes(passed=5, failed=1)
    text = parallel.stdout.str()
    assert text.count("model budgets") == 1
    for width in range(2, 8):
        assert text.count(f"test_models.py::test_width[{width}]  ") == 1
    parallel.stdout.fnmatch_lines(["*test_width?5? * regressed"])
    session = json.loads((xdist_project.path / "artifacts" / "session.json").read_text())
    assert len(session["profiles"]) == 6
    assert len(list((xdist_project.path / "artifacts").glob("*.json"))) == 7


def test_update_under_xdist_loses_no_entry(xdist_project):
    xdist_project.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--modelprof-update")
    text = (xdist_project.path / "budgets" / "test_models.toml").read_text()
    assert text.startswith("# limits\n")
    for width in range(2, 8):
        assert f'[profiles."test_models.py::test_width[{width}]".baseline]\ngflops = ' in text
    again = xdist_project.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--modelprof-update")
    assert (xdist_project.path / "budgets" / "test_models.toml").read_text() == text
    again.assert_outcomes(passed=5, failed=1)
