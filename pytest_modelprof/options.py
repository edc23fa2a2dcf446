"""What the ``modelprof`` command and the pytest plugin both accept, checked in one place so a
value means the same, and is refused in the same words, on either side: the device a profile
runs on, and the plugin's reading of its options (the command line over the ini file)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .engine.workload import DEVICE_KINDS, device_kind

if TYPE_CHECKING:
    import pytest

DEVICES = "cpu, cuda, cuda:N or meta (analytic)"  # what a device option accepts, as messages say it


class OptionError(ValueError):
    """A value an option cannot take; the message says what was expected."""


def check_device(device: str, *, available: bool = False) -> str:
    """``device`` when profiles can run on it (one of :data:`DEVICES`); with ``available``, a CUDA
    device must also be on this machine. Raises :class:`OptionError` saying what was expected."""
    kind = device_kind(device)
    if kind is None:
        raise OptionError(f"unknown device {device!r}: expected {DEVICES}")
    if kind not in DEVICE_KINDS:
        raise OptionError(f"unsupported device {device!r}: expected {DEVICES}")
    if available and kind == "cuda" and not torch.cuda.is_available():
        raise OptionError(f"device {device!r} is not available on this machine (no CUDA GPU)")
    return device


def ini_key(name: str) -> str:
    """The plugin option ``name``'s key: ``modelprof_<name>`` in the ini file and in pytest's option namespace."""
    return f"modelprof_{name.replace('-', '_')}"


def option(config: pytest.Config, name: str) -> Any:
    """A plugin option (``--modelprof-<name>``): the command line's value if given, else the ini file's."""
    key = ini_key(name)
    value = config.getoption(key)
    return value if value is not None else config.getini(key)
