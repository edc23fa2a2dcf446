"""Reading and validating budget files; every error names the file and the line.

A budget file (``budgets/*.toml``) holds one table per profile::

    [profiles."examples/test_models.py::test_resnet18"]
    max_gflops = 4.0                          # hand-written ceilings
    max_params = 12_000_000
    max_latency_ms = { cpu = 80.0, cuda = 4.0 }
    tolerance = "2%"                          # or { gflops = "0%", latency_ms = "15%" }

    [profiles."examples/test_models.py::test_resnet18".baseline]   # --modelprof-update writes these
    gflops = 3.642975
    params = 11689512
"""

from __future__ import annotations

import difflib
import errno
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from ..metrics import LIMITED, METRICS, Tolerance

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

DEVICES = ("cpu", "cuda")
PROFILE_KEYS = sorted([f"max_{key}" for key in LIMITED] + ["tolerance", "baseline"])


class BudgetError(Exception):
    """A budget file or directory that cannot be used, with where and why."""

    def __init__(self, path: Path, line: int | None, message: str, root: Path | None = None) -> None:
        self.path = path
        self.line = line
        self.message = message
        shown = shown_path(path, root)
        super().__init__(f"{shown}:{line}: {message}" if line else f"{shown}: {message}")


def shown_path(path: Path, root: Path | None) -> Path:
    """``path`` relative to ``root`` when it lies inside it (how messages name a file), else as it is."""
    if root is not None:
        try:
            return path.absolute().relative_to(root.absolute())
        except ValueError:
            pass
    return path


@dataclass
class ProfileBudget:
    """The ceilings, baselines and tolerances of one profile, and where each was written."""

    name: str
    path: Path
    line: int
    ceilings: dict[str, float] = field(default_factory=dict)
    device_ceilings: dict[str, dict[str, float]] = field(default_factory=dict)
    baselines: dict[str, float] = field(default_factory=dict)
    machine_baselines: dict[str, dict[str, float]] = field(default_factory=dict)
    tolerances: dict[str, Tolerance] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    root: Path | None = None  # what messages name the file relative to (pytest's rootdir)

    @property
    def shown(self) -> Path:
        """The file as messages name it: relative to the root when inside it."""
        return shown_path(self.path, self.root)

    def tolerance(self, metric: str) -> Tolerance:
        return self.tolerances.get(metric, METRICS[metric].default_tolerance)

    def mentions(self, metric: str) -> bool:
        """Whether any ceiling or baseline of ``metric`` is set."""
        return any(metric in table for table in (self.ceilings, self.device_ceilings, self.baselines, self.machine_baselines))

    def line_of(self, key: str) -> int:
        """The line of ``key`` (``"max_gflops"``, ``"baseline.gflops"``), else of the profile."""
        return self.lines.get(key, self.line)


@dataclass
class Budgets:
    directory: Path
    profiles: dict[str, ProfileBudget] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    root: Path | None = None  # what messages and artifacts name files relative to (pytest's rootdir)


def load_budgets(directory: Path, *, required: bool = False, root: Path | None = None) -> Budgets:
    """Every ``*.toml`` below ``directory``. A missing directory is an error only if ``required``.

    Errors and findings name files relative to ``root`` (pytest's rootdir) when inside it.
    """
    try:
        budgets = _load(directory, required, root)
    except BudgetError as error:
        raise BudgetError(error.path, error.line, error.message, root) from None
    budgets.root = root
    for budget in budgets.profiles.values():
        budget.root = root
    return budgets


def _load(directory: Path, required: bool, root: Path | None) -> Budgets:
    if not directory.exists():
        if required:
            raise BudgetError(directory, None, "the budget directory does not exist (create it, or point --modelprof-budgets elsewhere)")
        return Budgets(directory)
    if not directory.is_dir():
        raise BudgetError(directory, None, "expected a directory of budget files (*.toml), found a file")
    budgets = Budgets(directory, files=sorted(directory.rglob("*.toml")))
    for path in budgets.files:
        _check_file(path)
        for budget in read_budget_file(path):
            earlier = budgets.profiles.get(budget.name)
            if earlier is not None:
                raise BudgetError(
                    path,
                    budget.line,
                    f"profile {budget.name!r} is also defined at {shown_path(earlier.path, root)}:{earlier.line}; "
                    "each profile belongs in one file",
                )
            budgets.profiles[budget.name] = budget
    return budgets


def _check_file(path: Path) -> None:
    """A ``*.toml`` under the budget directory that is not a readable file gets a one-line error."""
    if path.is_symlink():
        try:
            path.resolve(strict=True)
        except (RuntimeError, OSError) as error:  # Python < 3.13 reports a symlink loop as a RuntimeError
            if isinstance(error, RuntimeError) or error.errno == errno.ELOOP:
                raise BudgetError(path, None, "is a symlink loop; expected a budget file (*.toml)") from None
            raise BudgetError(path, None, f"is a symlink to {os.readlink(path)}, which does not exist; expected a budget file") from None
    if path.is_dir():
        raise BudgetError(path, None, "is a directory; expected a budget file (rename it, or move it out of the budget directory)")
    if not path.is_file():
        raise BudgetError(path, None, "is not a regular file; expected a budget file (*.toml)")


def read_budget_file(path: Path) -> list[ProfileBudget]:
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise BudgetError(path, None, f"cannot be read: {error.strerror or error}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BudgetError(
            path, raw[: error.start].count(b"\n") + 1, f"is not UTF-8 text (byte 0x{raw[error.start]:02x}); budget files are UTF-8 TOML"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        line = getattr(error, "lineno", None) or _line_from_message(str(error))
        if line is None and "end of document" in str(error):
            line = max(1, len(text.splitlines()))
        raise BudgetError(path, line, f"not valid TOML: {error}") from None
    lines = key_lines(text)
    for key in data:
        if key != "profiles":
            _unknown(path, min((n for k, n in lines.items() if k[0] == key), default=None), key, ["profiles"], "at the top level")
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict):
        raise BudgetError(path, lines.get(("profiles",)), "'profiles' must be a table of [profiles.\"<name>\"] tables")
    return [_read_profile(path, name, table, lines) for name, table in profiles.items()]


def _read_profile(path: Path, name: str, table: Any, lines: dict[tuple[str, ...], int]) -> ProfileBudget:
    where = ("profiles", name)
    budget = ProfileBudget(name, path, lines.get(where, 1))
    if not isinstance(table, dict):
        raise BudgetError(path, budget.line, f"profile {name!r} must be a table, got {_kind(table)}")

    def line(*key: str) -> int:
        return _best_line(lines, (*where, *key), budget.line)

    for key, value in table.items():
        budget.lines[key] = line(key)
        if key == "baseline":
            _read_baselines(path, name, value, budget, line)
        elif key == "tolerance":
            _read_tolerances(path, value, budget, line)
        elif key.startswith("max_") and key[4:] in LIMITED:
            metric = LIMITED[key[4:]]
            if (metric.per_device or metric.per_target) and isinstance(value, dict):
                for device, limit in value.items():
                    if metric.per_device and device not in DEVICES:
                        _unknown(path, line(key, device), device, list(DEVICES), f"in {key}")
                    budget.device_ceilings.setdefault(metric.key, {})[device] = _number(path, line(key, device), f"{key}.{device}", limit)
            else:
                budget.ceilings[metric.key] = _number(path, line(key), key, value)
        else:
            _unknown(path, line(key), key, PROFILE_KEYS, f"in profile {name!r}")
    return budget


def _read_baselines(path: Path, name: str, table: Any, budget: ProfileBudget, line: Any) -> None:
    if not isinstance(table, dict):
        raise BudgetError(path, line("baseline"), f"'baseline' must be a table of metric = value, got {_kind(table)}")
    for key, value in table.items():
        budget.lines[f"baseline.{key}"] = line("baseline", key)
        metric = METRICS.get(key)
        if metric is None:
            _unknown(path, line("baseline", key), key, sorted(METRICS), f"in the baseline of {name!r}")
        elif metric.per_device:
            if not isinstance(value, dict):
                raise BudgetError(path, line("baseline", key), f"baseline.{key} must be a table of machine = value, got {_kind(value)}")
            budget.machine_baselines[key] = {
                machine: _number(path, line("baseline", key, machine), f"baseline.{key}.{machine}", v) for machine, v in value.items()
            }
        else:
            budget.baselines[key] = _number(path, line("baseline", key), f"baseline.{key}", value)


def _read_tolerances(path: Path, value: Any, budget: ProfileBudget, line: Any) -> None:
    """``tolerance = "2%"`` for every metric, or ``tolerance = { gflops = "0.1 GFLOPs", latency_ms = "10%" }``."""
    if isinstance(value, str):
        if "%" not in value:
            raise BudgetError(
                path,
                line("tolerance"),
                f'a tolerance for every metric must be a percentage such as "2%", got {value!r}; '
                'give amounts per metric: tolerance = { gflops = "0.1 GFLOPs" }',
            )
        entries = {key: (value, line("tolerance")) for key in LIMITED}
    elif isinstance(value, dict):
        for key in value:
            if key not in LIMITED:
                _unknown(path, line("tolerance", key), key, sorted(LIMITED), "in tolerance")
        entries = {key: (text, line("tolerance", key)) for key, text in value.items()}
    else:
        raise BudgetError(
            path, line("tolerance"), f'tolerance must be a string such as "2%" or a table of metric = tolerance, got {_kind(value)}'
        )
    for key, (text, at) in entries.items():
        if not isinstance(text, str):
            raise BudgetError(path, at, f'tolerance for {key} must be a string such as "2%", got {_kind(text)}')
        try:
            budget.tolerances[key] = METRICS[key].parse_tolerance(text)
        except ValueError as error:
            raise BudgetError(path, at, f"tolerance for {key}: {error}") from None


def _number(path: Path, line: int, key: str, value: Any) -> float:
    if not is_finite_number(value) or value < 0:
        raise BudgetError(path, line, f"{key} must be a finite, non-negative number, got {_kind(value)}")
    return float(value)


def _unknown(path: Path, line: int | None, key: str, known: list[str], where: str) -> None:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise BudgetError(path, line, f"unknown key {key!r} {where}{hint} (expected one of: {', '.join(known)})")


def _kind(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"a {'table' if isinstance(value, dict) else 'list'}"
    if isinstance(value, int) and not isinstance(value, bool) and not is_finite_number(value):
        return f"an integer of {len(str(abs(value)))} digits, too large for a float"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _line_from_message(message: str) -> int | None:
    marker = "line "
    if marker in message:
        digits = message.split(marker, 1)[1].split(",")[0].split(")")[0]
        if digits.isdigit():
            return int(digits)
    return None


def _best_line(lines: dict[tuple[str, ...], int], key: tuple[str, ...], default: int) -> int:
    while key:
        if key in lines:
            return lines[key]
        key = key[:-1]
    return default


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """1-based line of every table header and key in a TOML text, by full key path."""
    found: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            path = _parsed_path(line)
            if path is not None:
                table = path
                found.setdefault(table, number)
            continue
        if "=" in line:
            path = _parsed_path(line)
            if path is not None:
                for depth in range(1, len(path) + 1):
                    found.setdefault((*table, *path[:depth]), number)
    return found


def _parsed_path(line: str) -> tuple[str, ...] | None:
    """The key path a header or ``key = value`` line names (the innermost keys of an inline table too)."""
    try:
        node: Any = tomlkit.parse(line).unwrap()
    except Exception:  # a line of a multi-line value: not a key
        return None
    path: list[str] = []
    while True:
        if isinstance(node, list) and len(node) == 1:  # [[array.of.tables]]
            node = node[0]
        if not (isinstance(node, dict) and len(node) == 1):
            break
        key, node = next(iter(node.items()))
        path.append(key)
    return tuple(path) if path else None


def is_finite_number(value: object) -> bool:
    """A TOML integer or float that a float can hold: not a bool, not inf or nan, not 1e400 written as an integer."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return abs(value) <= sys.float_info.max
    return math.isfinite(value)
