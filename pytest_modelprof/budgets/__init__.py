"""Budgets: TOML files of ceilings and baselines, checked against profiles.

Knows nothing of pytest, and of torch only the :class:`~pytest_modelprof.Profile`.
"""

from .check import IMPROVED, NEW, OK, REGRESSED, STALE, UPDATED, Finding, Verdict, check
from .load import BudgetError, Budgets, ProfileBudget, load_budgets
from .metrics import METRICS, Metric, Tolerance
from .write import update_files

__all__ = [
    "IMPROVED",
    "METRICS",
    "NEW",
    "OK",
    "REGRESSED",
    "STALE",
    "UPDATED",
    "BudgetError",
    "Budgets",
    "Finding",
    "Metric",
    "ProfileBudget",
    "Tolerance",
    "Verdict",
    "check",
    "load_budgets",
    "update_files",
]
