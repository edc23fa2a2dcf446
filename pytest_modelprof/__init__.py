"""pytest-modelprof: FLOPs, memory and latency budgets for PyTorch models.

The Python API works without pytest::

    from pytest_modelprof import profile
    result = profile(model, torch.randn(1, 3, 224, 224), device="meta")
    print(result.gflops, result.params)
"""

from .engine import (
    FormulaError,
    ModuleStats,
    OpCost,
    OpStats,
    Profile,
    ProfileError,
    profile,
    register_flop_formula,
    unregister_flop_formula,
)

__all__ = [
    "FormulaError",
    "ModuleStats",
    "OpCost",
    "OpStats",
    "Profile",
    "ProfileError",
    "profile",
    "register_flop_formula",
    "unregister_flop_formula",
]
