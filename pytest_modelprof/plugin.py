"""pytest wiring only: options, ini keys, the marker, the ``model_profile`` fixture and
the hooks that hand profiles to the session. The engine and the budget code know
nothing of pytest."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Generator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import torch

from . import ci, hookspecs
from .budgets import BudgetError, load_budgets
from .engine import LatencyWarning, Profile, Timing, profile
from .engine.workload import DEVICE_KINDS, device_kind
from .metrics import TIMED
from .report.tables import format_collectives, format_tree_table
from .report.text import format_header
from .session import ModelprofSession, ProfileNameError

STATE = pytest.StashKey[ModelprofSession]()
DEFAULT_BUDGETS = "budgets"
PROFILE_OPTIONS = (
    "train",
    "loss_fn",
    "device",
    "optimizer",
    "memory",
    "no_grad",
    "set_to_none",
    "autocast",
    "latency",
    "flops",
    "formulas",
    "meters",
    "target",
    "world_size",
    "parallelize",
    "rank",
    "mesh",
)
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
        key = f"modelprof_{name.replace('-', '_')}"
        if kind == "bool":
            group.addoption(flag, action="store_true", default=None, dest=key, help=text)
            parser.addini(key, text, type="bool", default=False)
        else:
            group.addoption(flag, default=None, dest=key, metavar=name.upper().replace("-", "_"), help=text)
            parser.addini(key, text, default="")


def option(config: pytest.Config, name: str) -> Any:
    """A modelprof option: the command line's value if given, else the ini file's."""
    key = f"modelprof_{name.replace('-', '_')}"
    value = config.getoption(key)
    return value if value is not None else config.getini(key)


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
    _check_device(option(config, "device"))
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


def _check_device(value: str | None) -> None:
    if value and device_kind(value) not in DEVICE_KINDS:
        raise pytest.UsageError(f"--modelprof-device expects cpu, cuda, cuda:N or meta (analytic), got {value!r}")


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


class ModelProfiler:
    """What the ``model_profile`` fixture returns: call it to profile a model."""

    def __init__(
        self,
        state: ModelprofSession,
        nodeid: str,
        defaults: dict[str, Any],
        latency: str = "auto",
        timing: Timing | None = None,
        full_trace: bool = False,
        formulas: dict[Any, Any] | None = None,
        device: str | None = None,
    ) -> None:
        self._device = device  # --modelprof-device: where profiles run unless the test says
        self._full_trace = full_trace
        self._formulas = formulas or {}
        self._state = state
        self._nodeid = nodeid
        self._defaults = defaults
        self._latency = latency
        self._timing = timing or Timing()
        self._made = 0

    def __call__(self, model: Any, inputs: Any = (), *, name: str | None = None, **options: Any) -> Profile:
        """Profile ``model`` on ``inputs`` and return the :class:`Profile`.

        ``name`` is the profile's key in the budget files; by default the test's node id
        (``#2``, ``#3``... for later unnamed profiles of the same test). ``options`` are
        :func:`pytest_modelprof.profile`'s: ``train``, ``loss_fn``, ``device``, ``optimizer``,
        ``memory``, ``no_grad``, ``set_to_none``, ``autocast``, ``latency``, ``flops``, ``formulas``
        (added to those of the ``pytest_modelprof_flop_formulas`` hooks this test sees), ``meters``. Unless the test
        says ``latency=``, a profile is timed when its budget holds a latency limit or
        baseline (``--modelprof-latency`` changes that).
        """
        __tracebackhide__ = True
        _check_options(options)
        name = self._name(name)
        # FLOP formulas: the hooks' (conftest files' and plugins'), the marker's, the call's; the last wins an op
        formulas = {**self._formulas, **(self._defaults.get("formulas") or {}), **(options.get("formulas") or {})}
        options = {**self._defaults, **options, "formulas": formulas}
        if self._device and options.get("device") is None and options.get("target") is None:
            options["device"] = self._device  # --modelprof-device; a target GPU says where it runs itself
        options["latency"] = self._timed(name, options)
        try:
            with warnings.catch_warnings():
                # what makes a latency unclear goes to the summary with the verdict (LatencyReport.warnings):
                # a warning here would fail a passing test under -W error
                warnings.simplefilter("ignore", LatencyWarning)
                result = profile(model, inputs, **options)
        except Exception as error:
            if self._full_trace:
                raise
            # the user's frames only: the test, and the model's line that raised (not the engine's or torch's)
            raise error.with_traceback(user_frames(error)) from None
        result.name = name
        self._state.record(name, self._nodeid, result)
        return result

    def _name(self, name: str | None) -> str:
        """The profile's name: as given, else the test's node id (``#2``... for later ones); unused so far."""
        __tracebackhide__ = True
        self._made += 1
        if name is None:
            name = self._nodeid if self._made == 1 else f"{self._nodeid}#{self._made}"
        earlier = self._state.records.get(name)
        if earlier is not None:
            raise ProfileNameError(name, earlier.nodeid, self._nodeid)
        return name

    def record(self, result: Profile, *, name: str | None = None) -> Profile:
        """Hold a profile made elsewhere against its budget, e.g. ``MemoryMonitor.profile()``
        after a few iterations of a real training loop. Named as ``__call__`` names."""
        __tracebackhide__ = True
        if not isinstance(result, Profile):
            raise TypeError(f"model_profile.record() expects a pytest_modelprof.Profile, got {type(result).__name__}")
        name = self._name(name or result.name)
        result.name = name
        self._state.record(name, self._nodeid, result)
        return result

    def _timed(self, name: str, options: dict[str, Any]) -> Any:
        """What to pass as ``latency=``, by the test's request, the budget and ``--modelprof-latency``."""
        if self._latency == "none" or str(options.get("device", "")) == "meta":
            return False
        if options.get("target") is not None and str(options.get("device", "")) != "cuda":
            return False  # an analytic GPU-target run: nothing runs to time
        if "latency" in options:
            return self._timing if options["latency"] is True else options["latency"]
        if self._latency == "all":
            return self._timing
        budget = self._state.budgets.profiles.get(name)
        return self._timing if budget is not None and any(budget.mentions(key) for key in TIMED) else False


_INTERNAL = tuple(str(Path(module.__file__ or "").parent) + os.sep for module in (torch, sys.modules[__package__]))


def user_frames(error: BaseException) -> TracebackType | None:
    """The frames of ``error``'s traceback outside torch and this package, the user's code
    (chained causes included: the model's own exception behind a ProfileError)."""
    frames: list[TracebackType] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        tb = current.__traceback__
        while tb is not None:
            if not tb.tb_frame.f_code.co_filename.startswith(_INTERNAL) and all(f.tb_frame is not tb.tb_frame for f in frames):
                frames.append(tb)
            tb = tb.tb_next
        current = current.__cause__
    chain = None
    for tb in reversed(frames):
        chain = TracebackType(chain, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
    return chain


def _check_options(options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(PROFILE_OPTIONS))
    if unknown:
        raise TypeError(f"unknown model_profile option {unknown[0]!r}; expected name= or one of: {', '.join(PROFILE_OPTIONS)}")


def _hooked_formulas(item: pytest.Item) -> dict[Any, Any]:
    """The FLOP formulas of the ``pytest_modelprof_flop_formulas`` hooks that ``item`` sees (plugins,
    and the conftest files of its directory and above; the closest one wins an op)."""
    formulas: dict[Any, Any] = {}
    for contributed in reversed(item.ihook.pytest_modelprof_flop_formulas()):  # pluggy calls the closest first
        formulas.update(contributed or {})
    return formulas


@pytest.fixture
def model_profile(request: pytest.FixtureRequest) -> ModelProfiler:
    """Profile models in a test and hold each profile against its budget.

    ``model_profile(model, inputs, name=None, train=False, loss_fn=None, device=None, optimizer=None)``
    returns a :class:`pytest_modelprof.Profile`. After the test, every profile it made
    is checked against the budget files; a profile over budget fails the test.
    """
    defaults: dict[str, Any] = {}
    marker = request.node.get_closest_marker("modelprof")
    if marker is not None:
        if marker.args:
            raise TypeError("@pytest.mark.modelprof takes keyword options only, e.g. @pytest.mark.modelprof(train=True)")
        _check_options(marker.kwargs)
        defaults.update(marker.kwargs)
    seconds = option(request.config, "time-budget")
    timing = Timing(budget=float(seconds)) if seconds else None
    return ModelProfiler(
        request.config.stash[STATE],
        request.node.nodeid,
        defaults,
        option(request.config, "latency") or "auto",
        timing,
        full_trace=bool(request.config.option.fulltrace) or request.config.option.tbstyle == "native",
        formulas=_hooked_formulas(request.node),
        device=option(request.config, "device") or None,
    )


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
