import pytest
import torch

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)
