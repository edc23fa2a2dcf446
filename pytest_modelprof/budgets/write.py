"""Writing baselines back: comments, ordering and hand-written keys kept; atomic; byte-stable."""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.items import Float, Table, Trivia

from .._files import replace_atomically
from ..metrics import METRICS
from ..results import Profile
from .load import BudgetError, Budgets


def baseline_values(profile: Profile) -> dict[str, Any]:
    """The baseline entries a profile provides: ``{"gflops": 3.64, "latency_ms": {machine: 12.0}}``.

    A latency measured on a shared CPU (``LatencyReport.disturbance``) provides none: it
    would make a baseline that the same machine, idle, then beats by far.
    """
    values: dict[str, Any] = {}
    for metric in METRICS.values():
        measured = metric.measure(profile)
        if measured is None:
            continue
        value: float | int = measured if metric.digits else int(measured)
        if metric.per_device:
            if profile.machine and not metric.disturbance(profile):
                values[metric.key] = {profile.machine: value}
        else:
            values[metric.key] = value
    return values


def updated_text(text: str, updates: Mapping[str, dict[str, Any]], remove: Iterable[str] = ()) -> str:
    """``text`` with the baselines of ``updates`` written and the profiles in ``remove`` dropped.

    Only baseline values change; a value equal to the one written is left as written.
    New profiles are appended in name order. The text's line endings (LF or CRLF) are kept.
    """
    return _updated(text, updates, remove)[0]


def _updated(text: str, updates: Mapping[str, dict[str, Any]], remove: Iterable[str]) -> tuple[str, set[str]]:
    """The updated text, and the names of the profiles whose entries it changed."""
    newline = "\r\n" if "\r\n" in text else "\n"
    document = tomlkit.parse(text.replace("\r\n", "\n"))
    changed: set[str] = set()
    profiles = document.get("profiles")
    if profiles is None:
        profiles = tomlkit.table(is_super_table=True)
        document.add("profiles", profiles)
    for name in remove:
        if name in profiles:
            del profiles[name]
            changed.add(name)
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
            changed.add(name)
        elif _merge(baseline, updates[name]):
            changed.add(name)
    return tomlkit.dumps(document).replace("\n", newline), changed


def _merge(table: Table | Any, values: dict[str, Any]) -> bool:
    """Write ``values`` into ``table``; whether anything changed."""
    changed = False
    for key, value in values.items():
        if isinstance(value, dict):
            inner = table.get(key)
            if inner is None:  # per-machine values: one line, { machine = value }
                inner = tomlkit.inline_table()
                table.add(key, inner)
            changed |= _merge(inner, value)
        elif table.get(key) != value:
            table[key] = _item(value)
            changed = True
    return changed


def _item(value: float | int) -> Any:
    """A TOML number as people write it: ``0.000048``, not ``4.8e-05`` (the same float when read back)."""
    if not isinstance(value, float) or not math.isfinite(value):
        return value
    text = format(Decimal(repr(value)), "f")
    return Float(value, Trivia(), text if "." in text else text + ".0")


def is_read_only(path: Path) -> bool:
    mode = path.stat().st_mode
    return not os.access(path, os.W_OK) or not mode & stat.S_IWUSR


def write_atomically(path: Path, text: str) -> bool:
    """Replace ``path`` with ``text`` through a temporary file and a rename; False if unchanged.

    A symlinked file is written through to its target (the link stays a link).
    """
    path = Path(os.path.realpath(path))
    if path.exists():
        if read_text(path) == text:
            return False
        if is_read_only(path):
            raise BudgetError(path, None, "is read-only: baselines cannot be updated (make it writable, or run without --modelprof-update)")
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, text)
    return True


def read_text(path: Path) -> str:
    """A budget file's text as written: line endings kept."""
    return path.read_bytes().decode("utf-8")


@dataclass
class Update:
    """What an update wrote: the files changed and the profiles whose entries changed."""

    written: list[Path]
    changed: set[str]


def update_files(budgets: Budgets, measured: Mapping[str, Profile], place_new: Callable[[str], Path], remove: Iterable[str] = ()) -> Update:
    """Write the baselines of ``measured`` (and drop ``remove``).

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
    changed: set[str] = set()
    for path, (updates, removed) in sorted(plans.items()):
        try:
            original = read_text(path) if path.exists() else ""
        except (OSError, UnicodeDecodeError) as error:
            raise BudgetError(path, None, f"cannot be read: {error}") from None
        texts[path], names = _updated(original, updates, removed)
        changed |= names
        if path.exists() and texts[path] != original and is_read_only(path):
            raise BudgetError(path, None, "is read-only: baselines cannot be updated (make it writable, or run without --modelprof-update)")
    return Update([path for path, text in texts.items() if write_atomically(path, text)], changed)
