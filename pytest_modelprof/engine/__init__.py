"""The profiling engine: knows PyTorch, knows nothing of pytest."""

from ..results import LatencyReport, MemoryReport, ModuleOp, ModuleStats, OpStats, OpTime, Profile
from .errors import FormulaError, ProfileError
from .flops import register_flop_formula, unregister_flop_formula
from .formulas import OpCost
from .monitor import IterationMemory, MemoryGrowthWarning, MemoryMonitor
from .run import profile
from .timing import LatencyWarning, Timing, calibration_workload, machine_name

__all__ = [
    "FormulaError",
    "IterationMemory",
    "LatencyReport",
    "LatencyWarning",
    "MemoryGrowthWarning",
    "MemoryMonitor",
    "MemoryReport",
    "ModuleOp",
    "ModuleStats",
    "OpCost",
    "OpStats",
    "OpTime",
    "Profile",
    "ProfileError",
    "Timing",
    "calibration_workload",
    "machine_name",
    "profile",
    "register_flop_formula",
    "unregister_flop_formula",
]
