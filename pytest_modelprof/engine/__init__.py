"""The profiling engine: knows PyTorch, knows nothing of pytest."""

from ..results import Collective, LatencyReport, MemoryReport, ModuleOp, ModuleStats, OpStats, OpTime, Profile
from .errors import FormulaError, ProfileError
from .formulas import OpCost, register_flop_formula, unregister_flop_formula
from .meters import Meter, Op
from .monitor import IterationMemory, MemoryGrowthWarning, MemoryMonitor
from .run import profile, profile_ranks
from .targets.catalog import GPUS
from .targets.gpus import GPUSpec
from .timing.latency import LatencyWarning, Timing, calibration_workload, machine_name

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
