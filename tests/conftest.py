import pytest
import torch
from torch import nn

from pytest_modelprof import profile

pytest_plugins = ["pytester"]

# pytester's in-process runs forget the modules first imported inside them; torch
# imports some of its internals lazily, and importing those twice fails. Import them
# once here, before any pytester run, by profiling in every mode.
for _device in (None, "meta"):
    profile(nn.Sequential(nn.Linear(2, 2), nn.LSTM(2, 2)), torch.ones(1, 1, 2), device=_device, train=True)


@pytest.fixture
def pytester(pytester, monkeypatch):
    """pytester, with pytest-benchmark (where installed) kept out of its runs: inside an xdist
    worker it warns at start-up that xdist is active, which -W error turns into an INTERNALERROR."""
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:benchmark")
    return pytester


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


# A test module for pytester runs. nn.Linear(4, 4) on a (3, 4) input costs
# 2 * 3 * 4 * 4 multiply-adds + 3 * 4 bias adds = 108 FLOPs, and has 20 parameters.
SMALL_MODEL_TESTS = """
import torch
from torch import nn


def test_small(model_profile):
    result = model_profile(nn.Linear(4, 4), torch.ones(3, 4))
    assert result.flops == 108
"""
SMALL_GFLOPS = 108e-9
SMALL_GFLOPS_TEXT = "0.000000108"  # as a budget file holds it


@pytest.fixture
def project(pytester):
    """A pytester project with one profiled test and an empty budgets/ directory."""
    pytester.makepyfile(test_models=SMALL_MODEL_TESTS)
    pytester.mkdir("budgets")
    return pytester


def write_budget(pytester, text, name="test_models.toml"):
    path = pytester.path / "budgets" / name
    path.write_text(text)
    return path
