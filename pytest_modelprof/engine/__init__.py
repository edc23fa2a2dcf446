"""The profiling engine: knows PyTorch, knows nothing of pytest."""

from .errors import FormulaError, ProfileError
from .flops import register_flop_formula, unregister_flop_formula
from .formulas import OpCost
from .result import ModuleOp, ModuleStats, OpStats, Profile
from .run import profile

__all__ = [
    "FormulaError",
    "ModuleOp",
    "ModuleStats",
    "OpCost",
    "OpStats",
    "Profile",
    "ProfileError",
    "profile",
    "register_flop_formula",
    "unregister_flop_formula",
]
