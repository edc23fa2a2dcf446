"""Under pytest-xdist: the same verdicts, one merged summary, and only the controller writes."""

import json

import pytest
import xdist  # noqa: F401  (the test extra installs it: a broken install fails here, it does not skip)

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


def test_one_name_made_on_two_workers_fails_the_session_naming_both_tests(pytester):
    for module in ("test_one", "test_two"):
        pytester.makepyfile(
            **{
                module: """
                import torch
                from torch import nn

                def test_named(model_profile):
                    model_profile(nn.Linear(2, 2), torch.ones(1, 2), name="shared")
                """
            }
        )
    pytester.mkdir("budgets")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", "--modelprof-update")
    text = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in text
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # on two workers the session fails at its end; on one, the second test fails: either way both are named
    assert "test_one.py::test_named" in text and "test_two.py::test_named" in text
    assert "a profile named 'shared' was" in text
    if "was made by" in text:  # on two workers: neither profile is written as a baseline
        assert not list((pytester.path / "budgets").glob("*.toml"))
