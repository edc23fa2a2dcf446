"""The mode stack of an analytic run: every dispatch mode and patch a step on fake tensors runs under, in one place.

A dispatch mode entered later sits above one entered earlier: an op the model calls reaches the
run's meters first (their dispatcher is entered by the run, above everything here), then the
modes below from the last entered to the first, and the fake mode last. :func:`analytic_modes`
enters them in this order, from the bottom of the stack up:

1. **the fake mode**, beneath everything: the run's tensors are its fake tensors, and an op that
   reaches it runs its meta kernel. :func:`~.fake.quiet_meta_failures` keeps the failure its
   meta kernel logs from reaching stderr (the engine reports the error with its module);
2. :class:`~.routing.Routing`, right above the fake mode: it sizes a router's masks, and gives the
   values it decides (the experts a balanced router hits) to the known values above it;
3. patches that change no dispatch: ``nn.TransformerEncoder`` off its nested-tensor path (fake
   tensors cannot be nested), and the meta kernels PyTorch lacks (:func:`~.fake.analytic_meta_kernels`);
4. :class:`~.kernel_outputs.KernelOutputs`: the storage and layout a real kernel gives its outputs,
   beneath the target's kernel choices and the values, so that every mode above (the meters
   included) sees an op's outputs as the kernel made them;
5. :class:`~.cuda.CudaKernels`, for a target GPU only: the kernels that GPU would choose
   (attention backend, cuDNN recurrent layers through its layer ``ops``, fused paths, device queries), beneath every meter,
   so the meters count the kernels the target runs; its choices that read values read them from
   the known values, which it is given before they are entered;
6. :class:`~.values.KnownValues`, the topmost mode here, right beneath the meters: it works out the
   values of small tensors made from constants and real inputs, and answers the reads of them;
7. patches that read those values: libraries' eager paths (:func:`~.paths.eager_paths`), modules
   converted in place (:func:`~.fake.conversions_in_place`), and ``F.one_hot`` run as the device's
   kernel (:func:`~.fake.device_one_hot`).

Routing, the kernels' outputs, CUDA's ops (:class:`~.cuda.rnn.CudaOps`, of the target's kernel choices) and the
known values are not four modes but the layers of one, :class:`~.layers.Stacked`, entered in the place of the
known values: an op passes through them in the order above, each handing it to the next in Python (a mode
of its own would cost each op a round trip through C++; see :mod:`.layers`). The meters' dispatcher, entered
by the run right above them, joins them as their top layer for the metered step.

A device query of a fake tensor (``prim.device``: the autograd engine asks it in C++ of every tensor it
records or checks, two in three of a fake step's dispatches) is answered by the first of the engine's modes
it reaches, the meters' dispatcher included, as the fake mode answers it (:func:`..ops.fake_device`).

The workload enters one more guard itself, after the optimizer's state is made and in-place gradients
are zeroed: :func:`attributes_kept`, which keeps what the model records on itself as it runs on fake
tensors from staying on the caller's model.

Each step then enters, above all of these and beneath the meters (``Run.step`` in
:mod:`..workload`): the run's own parameters swapped into the model (``functional_call``), grad mode
and autocast (on a CUDA target, CUDA's autocast op lists, which need no driver), and, where the
backward pass runs in Python (:mod:`.backward`: a CUDA target's), :class:`~.backward.HookGuard`, which
refuses what that backward pass cannot run (hooks on non-leaf tensors, re-entrant checkpoints).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ..targets.gpus import GPUSpec
from .cuda import CudaKernels
from .fake import analytic_meta_kernels, conversions_in_place, device_one_hot, quiet_meta_failures
from .kernel_outputs import KernelOutputs
from .layers import Layer, Stacked, into_fake_mode
from .paths import eager_paths
from .routing import Routing
from .values import KnownValues


class Deciders(NamedTuple):
    """The modes of an analytic run that work out values (the known values, a router's masks): what a
    block memo (:mod:`..observe.blocks`) asks of them before it replays a call without running it."""

    known: KnownValues
    routing: Routing

    def acted(self) -> int:
        """How many reads of values the run has answered, and sizes it decided by values, so far (a count that only grows)."""
        return self.known.reads + self.routing.acted

    def follow(self, t: torch.Tensor) -> bool:
        """Whether the run knows something of ``t``'s values beyond its metadata (other than that they may not be finite)."""
        return self.known.follows(t, finiteness=False) or self.routing.follows(t)

    def unbounded(self, t: torch.Tensor) -> bool:
        """Whether all the run knows of ``t``'s values is that they may not be finite (a mask's -inf went into them)."""
        return self.known.follows(t) and not self.follow(t)


@contextlib.contextmanager
def analytic_modes(
    fake_mode: FakeTensorMode, model: nn.Module, gpu: GPUSpec | None, sources: Iterable[tuple[torch.Tensor, torch.Tensor]]
) -> Iterator[Deciders]:
    """The stack an analytic step of ``model`` runs under (see the module's notes for its order), undone on exit;
    the modes in it that work out values. ``sources``: the run's fake inputs and buffers beside the real tensors they stand for;
    ``gpu``: the target GPU, whose kernel choices the run makes (None: the fake tensors' own device's)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(fake_mode)
        stack.enter_context(quiet_meta_failures())
        routing = Routing()  # the sizes of a router's masks (see routing.py)
        stack.enter_context(_dense_encoders(model))
        stack.enter_context(analytic_meta_kernels())
        outputs = KernelOutputs()  # outputs whose storage the kernel sizes otherwise than the meta kernel
        known = KnownValues(sources, routing.decided, routing.follows)  # values that follow from constants and inputs
        layers: list[Layer] = [known, outputs, routing]
        if gpu is not None:  # the target GPU's kernel choices, beneath every meter
            kernels = stack.enter_context(CudaKernels(gpu, known.value))
            layers.insert(1, kernels.ops)
        stack.enter_context(Stacked(*layers, bottom=into_fake_mode(fake_mode)))  # the four dispatch modes, run as one (see layers.py)
        stack.enter_context(eager_paths(known.value))
        stack.enter_context(conversions_in_place())
        stack.enter_context(device_one_hot(known.value))
        yield Deciders(known, routing)


@contextlib.contextmanager
def _dense_encoders(model: nn.Module) -> Iterator[None]:
    """``nn.TransformerEncoder`` without its nested-tensor path, for an analytic run (fake tensors cannot be
    nested): in eval with a padding mask it then runs on the padded batch, which a real run packs."""
    encoders = [m for m in model.modules() if isinstance(m, nn.TransformerEncoder) and m.use_nested_tensor]
    for encoder in encoders:
        encoder.use_nested_tensor = False
    try:
        yield
    finally:
        for encoder in encoders:
            encoder.use_nested_tensor = True


@contextlib.contextmanager
def attributes_kept(named_modules: list[tuple[str, nn.Module]]) -> Iterator[None]:
    """Each module's own attributes as they were before an analytic run: a model that records its state as it
    runs (RWKV sets ``layers_are_rescaled`` once it has rescaled its weights; models cache tables on
    themselves) changed fake tensors, not the caller's, so the caller's model must not keep the record
    (nor fake tensors). Attributes the run added are removed, those it replaced put back; objects changed in
    place (a module's ``_modules``: a module swapped in) are left as they are. A real run is left as eager
    use leaves it: its parameters may be the caller's own (a training step without an optimizer)."""
    modules = list({id(module): module for _, module in named_modules}.values())
    before = [(vars(module), dict(vars(module))) for module in modules]
    try:
        yield
    finally:
        for now, attributes in before:
            for name in [name for name in now if name not in attributes]:
                del now[name]
            for name, value in attributes.items():
                if now.get(name, _GONE) is not value:
                    now[name] = value


_GONE = object()
