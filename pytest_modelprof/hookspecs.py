"""Hooks that plugins implement to extend pytest-modelprof (``pytest_modelprof_*``).

They are added to pytest's plugin manager by :func:`pytest_modelprof.plugin.pytest_addhooks`;
a plugin implements them like any pytest hook (a function of that name in a
``conftest.py`` or in a module registered under the ``pytest11`` entry point).
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec
def pytest_modelprof_flop_formulas() -> dict[Any, Any] | None:
    """Return FLOP formulas for custom ops, as ``{op: formula}``.

    Each ``op`` is an operator such as ``torch.ops.mylib.fused_gelu``; each formula is
    called as ``formula(*args, out_val=output, **kwargs)`` and returns FLOPs (an
    ``int``), ``OpCost(flops, macs)``, or ``None`` when a call cannot be counted (see
    :func:`pytest_modelprof.register_flop_formula`). They count the profiles that the
    ``model_profile`` fixture makes in the tests this hook is visible to: a hook in a
    ``conftest.py`` counts for the tests of its directory and below (the closest
    ``conftest.py`` wins an op), one in a plugin for every test. Nothing is registered
    for the process, so one directory's formulas never change another's figures.
    """
