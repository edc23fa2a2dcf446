"""The results and the budget and report code read plain data: no torch needed to load them."""

import json
import subprocess
import sys
from pathlib import Path

from pytest_modelprof.metrics import LIMITED


def test_budgets_reports_and_results_import_no_torch():
    code = (
        "import sys, pytest_modelprof, pytest_modelprof.budgets, pytest_modelprof.report, pytest_modelprof.results, pytest_modelprof.metrics; "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_engine_loads_on_first_use_of_its_names():
    code = "import sys, pytest_modelprof; pytest_modelprof.profile; assert 'torch' in sys.modules; print(pytest_modelprof.Timing().budget)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2.0"


def test_the_schema_names_the_metrics_of_the_table():
    schema = json.loads((Path(__file__).parents[1] / "pytest_modelprof" / "schema" / "profile.schema.json").read_text())
    finding = next(d for d in schema["$defs"].values() if "metric" in d.get("properties", {}))
    assert finding["properties"]["metric"]["enum"] == list(LIMITED)


def test_the_package_lists_the_engine_s_public_names():
    # pytest_modelprof keeps its own list (to load the engine, and torch, only on first use): the same names
    import pytest_modelprof
    import pytest_modelprof.engine

    assert sorted(pytest_modelprof.__all__) == sorted(pytest_modelprof.engine.__all__)
