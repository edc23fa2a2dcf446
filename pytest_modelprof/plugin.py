"""pytest wiring: hook specifications and the formulas plugins contribute.

The engine knows nothing of pytest; this module only connects the two.
"""

from __future__ import annotations

from typing import Any

import pytest

from . import hookspecs
from .engine import register_flop_formula, unregister_flop_formula

_FORMULAS_KEY = pytest.StashKey[list[Any]]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_sessionstart(session: pytest.Session) -> None:
    registered: list[Any] = []
    for formulas in session.config.hook.pytest_modelprof_flop_formulas():
        for op, formula in (formulas or {}).items():
            register_flop_formula(op, formula)
            registered.append(op)
    session.config.stash[_FORMULAS_KEY] = registered


def pytest_sessionfinish(session: pytest.Session) -> None:
    for op in session.config.stash.get(_FORMULAS_KEY, []):
        unregister_flop_formula(op)
