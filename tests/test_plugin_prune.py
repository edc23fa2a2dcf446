"""--modelprof-prune removes only entries that no collected test can make in a complete run.

A test that was skipped, failed, errored or xfailed is still collected: its entries
stay. A deselected, stopped, interrupted or partly collected run prunes nothing that
it did not see run.
"""

import pytest
from conftest import write_budget

TESTS = """
import pytest, torch
from torch import nn

def test_small(model_profile):
    model_profile(nn.Linear(4, 4), torch.ones(3, 4))

@pytest.mark.skip(reason="off today")
def test_skipped(model_profile):
    model_profile(nn.Linear(4, 4), torch.ones(3, 4))

def test_skips_itself(model_profile):
    pytest.skip("needs a GPU")

def test_fails(model_profile):
    assert False, "a bug before the profile"

@pytest.fixture
def broken():
    raise RuntimeError("setup failed")

def test_errors(broken, model_profile):
    model_profile(nn.Linear(4, 4), torch.ones(3, 4))

@pytest.mark.xfail(reason="known bug")
def test_xfails(model_profile):
    assert False
"""

KEPT = ["test_small", "test_skipped", "test_skips_itself", "test_fails", "test_errors", "test_xfails"]


def budget_text(names):
    return "".join(f'[profiles."{name}".baseline]\nparams = 20\n\n' for name in names)


@pytest.fixture
def suite(pytester):
    pytester.makepyfile(test_models=TESTS)
    pytester.mkdir("budgets")
    names = [f"test_models.py::{test}" for test in KEPT] + ["test_models.py::test_small#2", "test_models.py::test_gone", "chosen name"]
    return write_budget(pytester, budget_text(names))


def entries(path):
    return [line.split('"')[1] for line in path.read_text().splitlines() if line.startswith("[profiles.")]


def test_a_full_run_prunes_only_what_no_collected_test_can_make(pytester, suite):
    result = pytester.runpytest("--modelprof-update", "--modelprof-prune")
    result.assert_outcomes(passed=1, skipped=2, failed=1, errors=1, xfailed=1)
    # test_small passed and made one profile: its #2 is stale; test_gone was not collected;
    # a chosen name could come from any test, so it is never pruned by itself
    assert entries(suite) == [f"test_models.py::{test}" for test in KEPT] + ["chosen name"]


@pytest.mark.parametrize(
    "args",
    [("-x",), ("-k", "small or fails"), ("--maxfail=1",), ("test_models.py::test_small",), ("--collect-only",)],
    ids=["stop at first failure", "deselection", "maxfail", "one test named", "collect only"],
)
def test_an_incomplete_run_keeps_entries_of_tests_it_did_not_collect(pytester, suite, args):
    pytester.runpytest("--modelprof-update", "--modelprof-prune", "-p", "no:cacheprovider", *args)
    assert "test_models.py::test_gone" in entries(suite)
    assert "test_models.py::test_fails" in entries(suite)


def test_a_collection_error_keeps_every_entry_it_did_not_see(pytester, suite):
    pytester.makepyfile(test_broken="import no_such_module\n")
    result = pytester.runpytest("--modelprof-update", "--modelprof-prune")
    assert result.ret == pytest.ExitCode.INTERRUPTED  # pytest stops on collection errors
    assert "test_models.py::test_gone" in entries(suite)


def test_a_collection_error_under_continue_on_collection_errors_keeps_them_too(pytester, suite):
    pytester.makepyfile(test_broken="import no_such_module\n")
    pytester.runpytest("--modelprof-update", "--modelprof-prune", "--continue-on-collection-errors")
    assert "test_models.py::test_gone" in entries(suite)
    assert "test_models.py::test_small#2" not in entries(suite)  # test_small itself ran and passed


def test_an_interrupted_run_keeps_them(pytester, suite):
    pytester.makepyfile(test_stop="def test_interrupt():\n    raise KeyboardInterrupt\n")
    result = pytester.runpytest_subprocess("--modelprof-update", "--modelprof-prune")  # (in-process, it would stop this run too)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert "test_models.py::test_gone" in entries(suite)


def test_a_run_of_another_directory_keeps_entries_of_this_one(pytester, suite):
    pytester.mkpydir("other")
    (pytester.path / "other" / "test_other.py").write_text("def test_nothing():\n    pass\n")
    pytester.runpytest("other", "--modelprof-update", "--modelprof-prune")
    assert "test_models.py::test_gone" in entries(suite)


def test_stale_entries_are_listed_without_update(pytester, suite):
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["*test_models.py::test_gone * stale", "*test_models.py::test_small#2 * stale"])
    assert "test_fails * stale" not in result.stdout.str()
    assert not [line for line in result.stdout.lines if "stale" in line and ("test_fails" in line or "test_skipped" in line)]
