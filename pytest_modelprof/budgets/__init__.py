"""Budgets: TOML files of ceilings and baselines, checked against profiles.

Knows nothing of pytest, and of torch only the :class:`~pytest_modelprof.Profile`.
"""

from ..metrics import METRICS, Metric, Tolerance
from .check import IMPROVED, INCONCLUSIVE, NEW, OK, REGRESSED, STALE, UNCHANGED, UPDATED, Finding, Verdict, check
from .load import BudgetError, Budgets, ProfileBudget, load_budgets
from .write import Update, update_files

__all__ = [
    "IMPROVED",
    "INCONCLUSIVE",
    "METRICS",
    "NEW",
    "OK",
    "REGRESSED",
    "STALE",
    "UNCHANGED",
    "UPDATED",
    "BudgetError",
    "Budgets",
    "Finding",
    "Metric",
    "ProfileBudget",
    "Tolerance",
    "Update",
    "Verdict",
    "check",
    "load_budgets",
    "update_files",
]
