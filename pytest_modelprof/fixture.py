"""The ``model_profile`` fixture: the object a test calls to profile a model, which hands each
profile to the session (checked against its budget after the test), named after the test and
with the options of its marker, the hooks' FLOP formulas and the plugin's command line."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import torch

from .engine import LatencyWarning, Profile, Timing, profile
from .metrics import TIMED
from .options import option
from .session import ModelprofSession, ProfileNameError

STATE = pytest.StashKey[ModelprofSession]()  # the session of this run: the plugin keeps it in the config's stash
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
