"""Replays the counted ops of repeated calls of stock leaf modules.

A FLOP meter pays a Python call for every op it sees, and most ops of a deep model
run inside a few kinds of stock leaf module (``nn.Linear``, ``nn.Conv2d``,
``nn.LayerNorm``, ...) that the model calls again and again with the same shapes:
the twelve blocks of a GPT-2, the six identical bottlenecks of a ResNet stage. Such
a call runs the same ops with the same costs whenever its *signature* is the same:
the module's exact type and configuration (its non-tensor attributes, the train/eval
flag among them), the metadata (type, dtype, device, shape, strides, requires_grad,
conj bit) of its parameters, buffers and its one positional input, and the grad and
inference modes. The first call with a signature is dispatched and counted as usual,
and its rows are recorded; a later call with the same signature runs with the meter
suspended, and the recorded rows are added under the module stack it runs in.

The memo is used only where that holds exactly: runs whose meters can all record and
replay what an op contributes (the FLOP meter can; the memory meter needs every op's
outputs, so a run that follows memory dispatches every op), in the forward pass, with
the dispatcher the first to see each op (on top of the mode stack, or the top layer of
the analytic modes' stacked mode), no autocast and no functorch transform active, no
hooks on the module and no global module hooks but the tracker's, and the module's
``forward`` not replaced. A
module of any other type, or a call that passes keyword arguments, is simply
dispatched, and so is every later call of a type whose first recorded call
dispatched at most one op (a convolution, an activation): its signature costs about
what dispatching that op does. The memo lives for one run, so nothing it records
outlives the formulas it was counted with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.modules import module as _module_globals

from ..analytic.backward import in_backward

if TYPE_CHECKING:
    from .dispatch import Dispatcher
    from .modules import StackKey

# Stock modules whose forward takes one input and runs ops fixed by the signature above.
# (Not nn.ConvTranspose*d: its forward takes output_size, which a global pre-hook cannot see.)
STOCK_LEAVES: frozenset[type[nn.Module]] = frozenset(
    {
        nn.Linear,
        nn.Conv1d,
        nn.Conv2d,
        nn.Conv3d,
        nn.Embedding,
        nn.LayerNorm,
        nn.GroupNorm,
        nn.RMSNorm,
        nn.BatchNorm1d,
        nn.BatchNorm2d,
        nn.BatchNorm3d,
        nn.InstanceNorm1d,
        nn.InstanceNorm2d,
        nn.InstanceNorm3d,
        nn.LocalResponseNorm,
        nn.ReLU,
        nn.ReLU6,
        nn.LeakyReLU,
        nn.PReLU,
        nn.ELU,
        nn.SELU,
        nn.GELU,
        nn.SiLU,
        nn.Mish,
        nn.Hardswish,
        nn.Hardsigmoid,
        nn.Hardtanh,
        nn.Sigmoid,
        nn.Tanh,
        nn.Softplus,
        nn.Softmax,
        nn.LogSoftmax,
        nn.Dropout,
        nn.Dropout1d,
        nn.Dropout2d,
        nn.Dropout3d,
        nn.Identity,
        nn.Flatten,
        nn.MaxPool1d,
        nn.MaxPool2d,
        nn.MaxPool3d,
        nn.AvgPool1d,
        nn.AvgPool2d,
        nn.AvgPool3d,
        nn.AdaptiveAvgPool1d,
        nn.AdaptiveAvgPool2d,
        nn.AdaptiveAvgPool3d,
        nn.AdaptiveMaxPool1d,
        nn.AdaptiveMaxPool2d,
        nn.AdaptiveMaxPool3d,
        nn.Upsample,
    }
)

_PLAIN_TENSORS = frozenset({torch.Tensor, nn.Parameter, torch._subclasses.fake_tensor.FakeTensor})
_SIMPLE = (bool, int, float, str, type(None))

# each meter's recording of one call
Recording = tuple[Any, ...]


def _tensor_signature(t: Any) -> Any:
    if type(t) not in _PLAIN_TENSORS or t.layout is not torch.strided:
        raise _NotReplayable
    return (type(t), t.dtype, t.device, tuple(t.shape), t.stride(), t.requires_grad, t.is_conj())


def _config(module: nn.Module) -> tuple[tuple[str, Any], ...]:
    items = []
    for name, value in module.__dict__.items():
        if name[0] == "_":
            continue
        if isinstance(value, tuple):
            if not all(isinstance(v, _SIMPLE) for v in value):
                raise _NotReplayable
        elif not isinstance(value, _SIMPLE):
            raise _NotReplayable  # a tensor, a list or an object kept as a plain attribute
        items.append((name, value))
    return tuple(items)


class _NotReplayable(Exception):
    pass


class LeafMemo:
    """Records and replays what the meters make of stock leaf-module calls, for one run."""

    def __init__(self, dispatcher: Dispatcher, hooks: int) -> None:
        """``hooks``: how many global forward pre-hooks (and as many forward hooks) are the tracker's own."""
        self.dispatcher = dispatcher
        self.recorded: dict[Any, Recording] = {}
        # types whose recorded call dispatched at most one op: replaying them saves
        # less than their signatures cost (a convolution, an activation)
        self._single_op_types: set[type] = set()
        self._hooks = hooks
        # the call under way: (module, its signature, the recording it replays (None while
        # recording), the stack key it runs under)
        self._active: tuple[nn.Module, Any, Recording | None, StackKey] | None = None

    def _signature(self, module: nn.Module, args: tuple[Any, ...]) -> Any:
        """The signature of a call of a stock leaf module, or None when it must be dispatched."""
        if (
            len(args) != 1
            or module._forward_pre_hooks
            or module._forward_hooks
            or module._backward_hooks
            or module._backward_pre_hooks
            or "forward" in module.__dict__
            or len(_module_globals._global_forward_pre_hooks) != self._hooks
            or len(_module_globals._global_forward_hooks) != self._hooks
            or _module_globals._global_backward_hooks
            or _module_globals._global_backward_pre_hooks
            or torch._C._is_any_autocast_enabled()
            or torch._C._functorch.peek_interpreter_stack() is not None
        ):
            return None
        try:
            return (
                type(module),
                _config(module),
                tuple(None if p is None else _tensor_signature(p) for p in module._parameters.values()),
                tuple(None if b is None else _tensor_signature(b) for b in module._buffers.values()),
                _tensor_signature(args[0]),
                torch.is_grad_enabled(),
                torch.is_inference_mode_enabled(),
            )
        except (_NotReplayable, RuntimeError):
            return None

    def enter(self, module: nn.Module, args: tuple[Any, ...], key: StackKey) -> None:
        """Called as ``module`` starts, once the tracker has pushed its frame."""
        dispatcher = self.dispatcher
        if (
            type(module) not in STOCK_LEAVES  # containers and custom modules: the common case, first
            or self._active is not None
            or dispatcher.capturing  # a block (see blocks.py) is being recorded: its every op is watched
            or type(module) in self._single_op_types
            or dispatcher.region != "forward"
            or in_backward()
        ):
            return
        signature = self._signature(module, args)
        if signature is None:
            return
        try:
            recording = self.recorded.get(signature)
        except TypeError:  # an unhashable symbolic size
            return
        if recording is None:
            dispatcher.start_capture()
            self._active = (module, signature, None, key)
            return
        if not dispatcher.on_top():
            return  # another mode is on top: its ops must go through it and us as usual
        dispatcher.suspend()
        self._active = (module, signature, recording, key)

    def exit(self, module: nn.Module) -> None:
        """Called as ``module`` returns, before the tracker pops its frame."""
        active = self._active
        if active is None or active[0] is not module:
            return
        self._active = None
        _, signature, recording, key = active
        dispatcher = self.dispatcher
        if recording is None:
            ops, self.recorded[signature] = dispatcher.end_capture()
            if ops <= 1:
                self._single_op_types.add(type(module))
            return
        dispatcher.resume()
        dispatcher.replay(recording, lambda phase, _: (phase, key))
