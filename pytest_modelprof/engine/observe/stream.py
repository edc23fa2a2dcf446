"""What a run shows its meters: each dispatched op as an :class:`Op` (with where it ran), and
:class:`Meter`, the interface a meter implements, whose methods do nothing until a subclass
overrides them. The dispatcher (:mod:`.dispatch`) calls only the methods a meter overrides
(:func:`overrides`), so a run pays only for what its meters use. The meters themselves, and how to
write one, are in :mod:`..meters`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

    from ...results import ModuleStats, Phase, Profile
    from ..analytic.fake import RunTensors
    from .modules import StackKey


class Op(NamedTuple):
    """One dispatched ATen op, after it ran, and where it ran."""

    func: Any  # the OpOverload, e.g. torch.ops.aten.mm.default
    name: str  # its overload packet, e.g. "aten.mm"
    args: Any
    kwargs: dict[str, Any]
    out: Any
    phase: Phase
    key: StackKey  # the module stack, outermost first ("" is the model); () outside the model
    node: Any  # the autograd node it runs for in the backward pass, else None


Place = Callable[["Phase", "StackKey"], tuple["Phase", "StackKey"]]
"""Where a replayed recording's ops go: the phase and module stack they were recorded under -> those they
count under now (a memo's recording of one call, replayed for another module at another path)."""


class Meter:
    """Base of the meters: every method is a no-op until a subclass overrides it."""

    def start(self, run: RunTensors, target: torch.device) -> None:
        """The run is about to step: ``run`` holds the tensors the model uses, on ``target``."""

    def op(self, op: Op) -> None:
        """An op ran."""

    def saved(self, tensor: torch.Tensor, key: StackKey) -> None:
        """Autograd saved ``tensor`` for the backward pass while the modules of ``key`` ran."""

    def region(self, name: str) -> None:
        """The step moved on: ``"loss"``, ``"optimizer"`` or ``"end"``."""

    def stop(self) -> None:
        """The run is over (also after an error): let go of what follows the run's tensors."""

    def contribute(self, profile: Profile, modules: dict[str, ModuleStats]) -> None:
        """Write this meter's figures into ``profile`` and its module rows (path -> stats)."""

    def wants_decomposition(self, func: Any) -> bool:
        """Whether ``func`` should reach the meters as the ops of its decomposition (where it has one)."""
        return False

    # Replaying repeated module calls (see :mod:`.memo`, :mod:`.blocks`): only when every meter can.
    replayable = False

    def start_capture(self) -> None:
        """Start recording what the next ops contribute, with the phase and module stack of each."""

    def end_capture(self) -> Any:
        """Stop recording; the recording."""

    def replay(self, recording: Any, place: Place) -> None:
        """Add a recording again, each op under the phase and module stack ``place`` gives for those it was
        recorded under, as if it ran there."""

    def closes(self, recording: Any, outputs: list[torch.Tensor]) -> bool:
        """Whether a recorded block call (:mod:`.blocks`) left nothing behind but ``outputs``, the tensors it made
        and returned: a recording that says otherwise is not replayed."""
        return True

    def made(self, recording: Any, outputs: list[torch.Tensor]) -> None:
        """A replayed block call made ``outputs`` (empty, as the recorded call's were)."""


def overrides(meter: Meter, method: str) -> bool:
    """Whether ``meter``'s class overrides :class:`Meter`'s ``method``."""
    return getattr(type(meter), method) is not getattr(Meter, method)
