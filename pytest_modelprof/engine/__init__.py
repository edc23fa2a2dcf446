"""The profiling engine: knows PyTorch, knows nothing of pytest."""

from .flops import register_flop_formula, unregister_flop_formula
from .formulas import OpCost
from .result import ModuleStats, OpStats, Profile
from .run import ProfileError, profile

__all__ = [
    "ModuleStats",
    "OpCost",
    "OpStats",
    "Profile",
    "ProfileError",
    "profile",
    "register_flop_formula",
    "unregister_flop_formula",
]
