"""pytest wiring only: options, ini keys, the marker, and the hooks that hand profiles to the
session and report it. The ``model_profile`` fixture is :mod:`.fixture`'s (imported here, so
pytest finds it in this plugin); the engine and the budget code know nothing of pytest."""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from . import ci, hookspecs
from .budgets import BudgetError, load_budgets
from .engine import Timing
from .fixture import STATE
from .fixture import model_profile as model_profile
from .options import OptionError, check_device, ini_key, option
from .report.tables import format_collectives, format_tree_table
from .report.text import format_header
from .session import ModelprofSession

DEFAULT_BUDGETS = "budgets"
LATENCY_MODES = ("auto", "all", "none")

# (name, kind, help): each is --modelprof-<name> on the command line and modelprof_<name> in the ini file
OPTIONS = (
    ("budgets", "path", f"directory of budget files (*.toml); default: {DEFAULT_BUDGETS}/ under the rootdir"),
    ("update", "bool", "write the measured figures as the new baselines (ceilings, comments and formatting are kept)"),
    ("prune", "bool", "with --modelprof-update: remove stale budget entries (no test made them in a full run)"),
    ("strict", "bool", "fail tests whose profiles have no budget entry"),
    ("json", "path", "directory to write one JSON file per profile and a session summary into"),
    ("device", "string", "device every profile runs on unless a test says otherwise: cpu, cuda, or meta (analytic)"),
    ("tree", "string", "after the summary, print each profile's module tree down to this depth"),
    (
        "latency",
        "string",
        "which profiles are timed: auto (those asking latency=True or whose budget holds a latency limit "
        "or baseline; the default), all (every profile on real tensors), none",
    ),
    ("time-budget", "string", "seconds of timed repeats per timed profile (default: 2)"),
)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("modelprof", "model budgets (pytest-modelprof)")
    for name, kind, text in OPTIONS:
        flag = f"--modelprof-{name}"
        key = ini_key(name)
        if kind == "bool":
            group.addoption(flag, action="store_true", default=None, dest=key, help=text)
            parser.addini(key, text, type="bool", default=False)
        else:
            group.addoption(flag, default=None, dest=key, metavar=name.upper().replace("-", "_"), help=text)
            parser.addini(key, text, default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "modelprof(train=False, loss_fn=None, device=None): options for the model_profile calls of this test",
    )
    depth = option(config, "tree")
    if depth and not str(depth).isdigit():
        raise pytest.UsageError(f"--modelprof-tree expects a depth (0, 1, 2, ...), got {depth!r}")
    latency = option(config, "latency") or "auto"
    if latency not in LATENCY_MODES:
        raise pytest.UsageError(f"--modelprof-latency expects one of {', '.join(LATENCY_MODES)}, got {latency!r}")
    try:
        Timing(budget=float(option(config, "time-budget") or Timing.budget))
    except ValueError:
        raise pytest.UsageError(
            f"--modelprof-time-budget expects a positive number of seconds, got {option(config, 'time-budget')!r}"
        ) from None
    device = option(config, "device")
    if device:
        try:
            check_device(device)
        except OptionError as error:
            raise pytest.UsageError(f"--modelprof-device: {error}") from None
    _check_json_directory(option(config, "json"), config.invocation_params.dir)
    configured = option(config, "budgets")
    directory = Path(configured) if configured else config.rootpath / DEFAULT_BUDGETS
    if not directory.is_absolute():
        directory = config.invocation_params.dir / directory
    try:
        budgets = load_budgets(directory, required=bool(configured), root=config.rootpath)
    except BudgetError as error:
        raise pytest.UsageError(f"pytest-modelprof: {error}") from None
    config.stash[STATE] = ModelprofSession(
        budgets, update=option(config, "update"), prune=option(config, "prune"), strict=option(config, "strict")
    )
    config.pluginmanager.register(OutcomeHooks(config.stash[STATE]), "modelprof-outcomes")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(config), "modelprof-xdist")


def _check_json_directory(value: str | None, base: Path) -> None:
    """The artifact directory must be a directory that can be made and written, known before any test runs."""
    if not value:
        return
    directory = base / value
    if directory.exists() and not directory.is_dir():
        raise pytest.UsageError(f"--modelprof-json {value}: is a file; expected a directory for the JSON artifacts")
    existing = directory
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise pytest.UsageError(f"--modelprof-json {value}: {existing} is a file, so the directory cannot be made")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise pytest.UsageError(f"--modelprof-json {value}: {existing} is not writable")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    result = yield
    failures = item.config.stash[STATE].failures(item.nodeid)
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> Generator[None, None, None]:
    """What was collected (around every plugin's selection: ``-k``, ``-m``, pytest-split) and what is left to run."""
    coverage = config.stash[STATE].coverage
    coverage.scope = _scope(config)
    coverage.collected.update(item.nodeid for item in items)
    result = yield
    coverage.selected.update(item.nodeid for item in items)
    return result


def _scope(config: pytest.Config) -> list[str]:
    """The paths this run collected in full, relative to the rootdir ("" for all of it)."""
    scope = []
    for arg in config.args:
        path, _, selection = arg.partition("::")
        if selection:
            continue  # one test (or class) of a file: the file is not collected in full
        try:
            relative = (config.invocation_params.dir / path).resolve().relative_to(config.rootpath.resolve())
        except (ValueError, OSError):
            continue
        scope.append("" if str(relative) == "." else relative.as_posix())
    return scope


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:  # collected, not run (also when deselected outside pytest_collection_modifyitems)
        coverage = items[0].config.stash[STATE].coverage
        coverage.collected.update(item.nodeid for item in items)
        coverage.selected.difference_update(item.nodeid for item in items)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = config.stash[STATE]
    for reason, applies in (
        ("stopped early", bool(session.shouldfail or session.shouldstop)),
        ("interrupted", exitstatus == pytest.ExitCode.INTERRUPTED),
        ("--collect-only", bool(config.option.collectonly)),
        ("--lf", bool(getattr(config.option, "lf", False))),
    ):
        if applies:
            state.coverage.stop(reason)
    if hasattr(config, "workerinput"):  # an xdist worker: the controller merges and writes
        config.workeroutput["modelprof"] = state.worker_output()  # type: ignore[attr-defined]
        return
    state.finish()
    directory = option(config, "json")
    if directory:
        state.write_json(config.invocation_params.dir / directory)
    if state.errors:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if ci.in_github_actions() and (state.records or state.stale):
        ci.append_budget_table(state.rows())


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash[STATE]
    if hasattr(config, "workerinput") or not (state.records or state.stale or state.errors):
        return
    write = terminalreporter.write_line
    terminalreporter.section("model budgets")
    for line in state.summary(config.rootpath):
        write(line, red=line.startswith("ERROR: "))
    if ci.in_github_actions():
        for line in ci.error_annotations(state.verdicts(), config.rootpath):
            write(line)
    depth = option(config, "tree")
    if depth:
        for record in sorted(state.records.values(), key=lambda r: r.name):
            write("")
            text = format_header(record.profile) + "\n\n" + format_tree_table(record.profile, depth=int(depth))
            if record.profile.world_size is not None:
                text += "\n\n" + format_collectives(record.profile)
            for line in text.splitlines():
                write(line)


class OutcomeHooks:
    """Which tests passed and whether collection failed: what tells a stale budget entry
    from one whose test did not get to run (on the xdist controller, from the workers' reports)."""

    def __init__(self, state: ModelprofSession) -> None:
        self.coverage = state.coverage

    @pytest.hookimpl
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.coverage.stop(f"collection error in {report.nodeid or 'the rootdir'}")

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.coverage.report(report.nodeid, report.when, report.outcome)


class XdistHooks:
    """Controller side of pytest-xdist: merge what each worker profiled."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        output = getattr(node, "workeroutput", {}).get("modelprof")
        if error or not output:  # a worker that crashed: what it would have collected is unknown
            self.config.stash[STATE].coverage.stop(f"xdist worker {getattr(getattr(node, 'gateway', None), 'id', '?')} went down")
        if output:
            self.config.stash[STATE].merge_worker(output)
