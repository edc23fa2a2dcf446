"""pytest-modelprof: FLOPs, memory and latency budgets for PyTorch models.

The Python API works without pytest::

    from pytest_modelprof import profile
    result = profile(model, torch.randn(1, 3, 224, 224), device="meta")
    print(result.gflops, result.params)
"""

from . import engine
from .engine import *  # noqa: F403  (the public API is the engine's)

__all__ = engine.__all__
