"""pytest-modelprof: FLOPs, memory and latency budgets for PyTorch models.

The Python API works without pytest::

    from pytest_modelprof import profile
    result = profile(model, torch.randn(1, 3, 224, 224), device="meta")
    print(result.gflops, result.params)

The engine (and torch with it) is imported on first use of a name that needs it:
``pytest_modelprof.budgets``, ``pytest_modelprof.report`` and ``pytest_modelprof.results``
import no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .results import Collective, LatencyReport, MemoryReport, ModuleOp, ModuleStats, OpStats, OpTime, Profile

if TYPE_CHECKING:
    from .engine import (
        FormulaError,
        IterationMemory,
        LatencyWarning,
        MemoryGrowthWarning,
        MemoryMonitor,
        Meter,
        Op,
        OpCost,
        ProfileError,
        Timing,
        calibration_workload,
        machine_name,
        profile,
        profile_ranks,
        register_flop_formula,
        unregister_flop_formula,
    )
    from .engine.targets.catalog import GPUS
    from .engine.targets.gpus import GPUSpec

__all__ = [
    "GPUS",
    "Collective",
    "FormulaError",
    "GPUSpec",
    "IterationMemory",
    "LatencyReport",
    "LatencyWarning",
    "MemoryGrowthWarning",
    "MemoryMonitor",
    "MemoryReport",
    "Meter",
    "ModuleOp",
    "ModuleStats",
    "Op",
    "OpCost",
    "OpStats",
    "OpTime",
    "Profile",
    "ProfileError",
    "Timing",
    "calibration_workload",
    "machine_name",
    "profile",
    "profile_ranks",
    "register_flop_formula",
    "unregister_flop_formula",
]


def __getattr__(name: str) -> Any:
    # called only for names not defined here: the results are, the engine's names load it
    if name in __all__:
        return getattr(importlib.import_module(".engine", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
