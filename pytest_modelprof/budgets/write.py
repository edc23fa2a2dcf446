"""Writing baselines back: comments, ordering and hand-written keys kept; atomic; byte-stable."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.items import Table

from .._files import replace_atomically
from ..engine.result import Profile
from .load import BudgetError, Budgets
from .metrics import METRICS


def baseline_values(profile: Profile) -> dict[str, Any]:
    """The baseline entries a profile provides: ``{"gflops": 3.64, "latency_ms": {machine: 12.0}}``."""
    values: dict[str, Any] = {}
    for metric in METRICS.values():
        measured = metric.measure(profile)
        if measured is None:
            continue
        value: float | int = measured if metric.digits else int(measured)
        if metric.per_device:
            if profile.machine:
                values[metric.key] = {profile.machine: value}
        else:
            values[metric.key] = value
    return values


def updated_text(text: str, updates: Mapping[str, dict[str, Any]], remove: Iterable[str] = ()) -> str:
    """``text`` with the baselines of ``updates`` written and the profiles in ``remove`` dropped.

    Only baseline values change; a value equal to the one written is left as written.
    New profiles are appended in name order.
    """
    document = tomlkit.parse(text)
    profiles = document.get("profiles")
    if profiles is None:
        profiles = tomlkit.table(is_super_table=True)
        document.add("profiles", profiles)
    for name in remove:
        if name in profiles:
            del profiles[name]
    for name in sorted(updates, key=lambda n: (n in profiles, n)):
        entry = profiles.get(name)
        if entry is None:
            entry = tomlkit.table()
            profiles.add(name, entry)
        baseline = entry.get("baseline")
        if baseline is None:
            baseline = tomlkit.table()
            entry.add("baseline", baseline)
            _merge(baseline, updates[name])
            baseline.add(tomlkit.nl())
        else:
            _merge(baseline, updates[name])
    return tomlkit.dumps(document)


def _merge(table: Table | Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, dict):
            inner = table.get(key)
            if inner is None:  # per-machine values: one line, { machine = value }
                inner = tomlkit.inline_table()
                table.add(key, inner)
            _merge(inner, value)
        elif table.get(key) != value:
            table[key] = value


def is_read_only(path: Path) -> bool:
    mode = path.stat().st_mode
    return not os.access(path, os.W_OK) or not mode & stat.S_IWUSR


def write_atomically(path: Path, text: str) -> bool:
    """Replace ``path`` with ``text`` through a temporary file and a rename; False if unchanged."""
    if path.exists():
        if path.read_text(encoding="utf-8") == text:
            return False
        if is_read_only(path):
            raise BudgetError(path, None, "is read-only: baselines cannot be updated (make it writable, or run without --modelprof-update)")
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, text)
    return True


def update_files(
    budgets: Budgets, measured: Mapping[str, Profile], place_new: Callable[[str], Path], remove: Iterable[str] = ()
) -> list[Path]:
    """Write the baselines of ``measured`` (and drop ``remove``); return the files changed.

    Profiles already in a file are updated there; a new one goes to ``place_new(name)``.
    Every target is checked before any is written, so a refusal leaves all files as they were.
    """
    plans: dict[Path, tuple[dict[str, dict[str, Any]], list[str]]] = {}
    for name, profile in measured.items():
        known = budgets.profiles.get(name)
        path = known.path if known else place_new(name)
        plans.setdefault(path, ({}, []))[0][name] = baseline_values(profile)
    for name in remove:
        plans.setdefault(budgets.profiles[name].path, ({}, []))[1].append(name)
    texts = {}
    for path, (updates, removed) in sorted(plans.items()):
        original = path.read_text(encoding="utf-8") if path.exists() else ""
        texts[path] = updated_text(original, updates, removed)
        if path.exists() and texts[path] != original and is_read_only(path):
            raise BudgetError(path, None, "is read-only: baselines cannot be updated (make it writable, or run without --modelprof-update)")
    return [path for path, text in texts.items() if write_atomically(path, text)]
