"""What the model sweeps (hf_sweep.py, timm_sweep.py) do to each model: a real run against an analytic one,
or an analytic run on a target GPU, told in one line; and a time limit per model."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from pytest_modelprof import profile


def compare(model: torch.nn.Module, inputs: Any, train: bool, loss_fn: Callable[[Any], torch.Tensor] | None = None) -> str:
    """ "equal", or where a real CPU run and an analytic one differ (FLOPs, peak, uncounted ops), or which fails."""
    try:  # analytic first: a model that records state as it runs (RWKV's rescaling) then runs the same path twice
        analytic = profile(model, inputs, train=train, device="meta", loss_fn=loss_fn)
    except Exception as error:
        analytic = error
    try:
        real = profile(model, inputs, train=train, loss_fn=loss_fn)
    except Exception as error:
        return f"real run fails ({type(error).__name__})"
    if isinstance(analytic, Exception):
        return f"ANALYTIC RUN FAILS {type(analytic).__name__}: {str(analytic)[:200]}"
    found = []
    if analytic.flops != real.flops:
        found.append(f"FLOPs {analytic.flops / real.flops:.4f}")
    if analytic.peak_memory_bytes != real.peak_memory_bytes:
        found.append(f"peak {analytic.peak_memory_bytes / real.peak_memory_bytes:.4f}")
    if real.uncounted or analytic.uncounted:
        found.append(f"uncounted {sorted({**real.uncounted, **analytic.uncounted})}")
    return ", ".join(found) or "equal"


def on_target(model: torch.nn.Module, inputs: Any, train: bool, target: str, loss_fn: Callable[[Any], torch.Tensor] | None = None) -> str:
    """The step as ``target`` runs it (inference, or a bf16-autocast AdamW training step), analytically: "ok"
    with its peak, what is uncounted, or why it fails (a model that fails on real CPU tensors too is the model's)."""
    optimizer = torch.optim.AdamW(model.parameters()) if train else None
    try:
        result = profile(
            model, inputs, train=train, device="meta", target=target, autocast=torch.bfloat16, optimizer=optimizer, loss_fn=loss_fn
        )
    except Exception as error:
        try:
            profile(model, inputs, train=train, loss_fn=loss_fn, memory=False)
        except Exception as real:
            return f"real run fails ({type(real).__name__})"
        return f"FAILS {type(error).__name__}: {str(error)[:200]}"
    uncounted = f", uncounted {sorted(result.uncounted)}" if result.uncounted else ""
    return f"ok {result.peak_memory_bytes / 2**20:.0f} MiB{uncounted}"


# how a mode's line starts where it did not run for the engine to judge: the model's, not the engine's
_NOT_RUN = ("real run fails", "over ", "small config does not build", "does not build", "no model builds")


def verdict(rows: dict[str, str]) -> str:
    """One model's lines by mode: "good" where every mode that ran gave equal figures (or, on a target, ran with
    nothing uncounted), "bad" where one differs or fails analytically, "skipped" where none ran."""
    ran = [line for line in rows.values() if line and not line.startswith(_NOT_RUN)]
    if not ran:
        return "skipped"
    return "good" if all(line == "equal" or (line.startswith("ok") and "uncounted" not in line) for line in ran) else "bad"


def option(arguments: list[str], name: str) -> str | None:
    """The value of ``name VALUE`` among the command's ``arguments``, taken out of them; None if absent."""
    if name not in arguments:
        return None
    at = arguments.index(name)
    value = arguments[at + 1]
    del arguments[at : at + 2]
    return value


class Timeout(Exception):
    """A model took longer than the sweep gives one."""


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raises :class:`Timeout` in the block after ``seconds`` (SIGALRM: the main thread, on POSIX)."""

    def alarm(*_: Any) -> None:
        raise Timeout

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
