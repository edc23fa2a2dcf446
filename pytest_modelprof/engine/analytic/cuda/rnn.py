"""cuDNN's recurrent layers and CTC on a target GPU.

Recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``): CUDA runs them as one cuDNN
kernel, ``aten._cudnn_rnn``, chosen (with its dropout state) by code that needs a device;
:func:`recurrent` calls it as that code does, and :class:`CudaOps` gives the op and its
backward the outputs cuDNN gives them, with the training *reserve* (what cuDNN keeps for
the backward pass) sized as ``cudnnGetRNNTrainingReserveSize`` sized it for an LSTM on an
H100 (per step and sequence: each layer's four gates and cell state, and the output of
every layer but the last: 369,099,008 bytes for 2 layers of 1024, 256 steps of 32, fp32;
GRU and plain RNN by the same structure, unmeasured). The weights' gradients come in one
buffer, as cuDNN writes them. The cells (``nn.LSTMCell``, ``nn.GRUCell``) run their gates'
elementwise part as one fused kernel (``_thnn_fused_lstm_cell``, ``_thnn_fused_gru_cell``)
chosen by device type alone; their outputs and the workspace they keep for the backward
pass are made here where PyTorch has no working meta kernel.

CTC: ``ctc_loss`` asks ``_use_cudnn_ctc_loss`` whether cuDNN's kernel takes the call
(aten/src/ATen/native/cudnn/LossCTC.cpp), which reads the lengths: answered here from the
arguments and the lengths' known values.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.utils._python_dispatch import _disable_current_modes

from ...targets.recurrent import GATES
from ..backward import in_backward
from ..layers import Layer

aten = torch.ops.aten

_USE_MIOPEN_CTC = getattr(aten, "_use_miopen_ctc_loss", None)  # asked by ctc_loss on CUDA (newer releases)

RNN_MODES = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}  # cuDNN's modes
RESERVE_ALIGNMENT = 256


def recurrent(stock: Any, mode: int) -> Any:
    """``torch._VF.lstm`` (and its kin) as CUDA runs them on fake CUDA tensors: ``aten._cudnn_rnn``."""

    def run(input: torch.Tensor, *args: Any) -> Any:
        if input.device.type != "cuda":
            return stock(input, *args)
        if isinstance(args[0], torch.Tensor) and args[0].dim() == 1:
            # a packed sequence: its batch sizes (a CPU tensor of known numbers, engine/analytic/values.py) first
            batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional = args
            sizes, batch_first = [int(n) for n in batch_sizes.tolist()], False
        else:
            hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
            sizes = []
        h, c = hx if mode == 2 else (hx, None)  # an LSTM's state is (h, c)
        hidden = c.shape[-1] if c is not None else h.shape[-1]
        proj = h.shape[-1] if c is not None and h.shape[-1] != hidden else 0
        stride0 = (4 if has_biases else 2) + (1 if proj else 0)
        with contextlib.ExitStack() as stack:
            if torch.is_autocast_enabled("cuda") and input.is_floating_point():
                # autocast's own kernel for _cudnn_rnn (_cudnn_rnn_cast_reflatten) flattens the weights
                # through cuDNN: the same casts here (the weights' low-precision copy is kept for the
                # backward pass, as its flat buffer is), and autocast off for the call
                dtype = torch.get_autocast_dtype("cuda")
                input, h = input.to(dtype), h.to(dtype)
                c = c.to(dtype) if c is not None else None
                params = [p.to(dtype) for p in params]
                stack.enter_context(_autocast_off())
            output, hy, cy, _, _ = aten._cudnn_rnn(
                input, params, stride0, None, h, c, mode, hidden, proj, num_layers, batch_first, dropout, train, bidirectional, sizes, None
            )
        return (output, hy, cy) if mode == 2 else (output, hy)

    return run


@contextlib.contextmanager
def _autocast_off() -> Any:
    enabled = torch.is_autocast_enabled("cuda")
    torch.set_autocast_enabled("cuda", False)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", enabled)


def reserve_bytes(mode: int, seq: int, batch: int, hidden: int, layers: int, directions: int, element: int) -> int:
    """cuDNN's training reserve for a recurrent layer (see the module's notes)."""
    per_step = directions * (layers * (GATES[mode] + (1 if mode == 2 else 0)) + (layers - 1)) * hidden
    return seq * batch * per_step * element + RESERVE_ALIGNMENT


class CudaOps(Layer):  # type: ignore[no-untyped-call]
    """CUDA's ops that fake tensors cannot run as the GPU would (fake tensors only): ``aten._cudnn_rnn``
    and its backward, with the outputs cuDNN makes; the fused LSTM cell; the choice of CTC's kernel
    (``_use_cudnn_ctc_loss``, which reads the lengths' values: ``values`` gives those the run knows).

    The backward node clones the reserve unless the engine has told it that its saved
    tensors will be released (``will_release_variables``, which the Python backward pass
    cannot call): that clone of a reserve is answered with the reserve itself.
    """

    def __init__(self, values: Callable[[torch.Tensor], torch.Tensor | None] = lambda t: None) -> None:
        super().__init__()
        self._reserves: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._values = values

    def handle(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if isinstance(func, HigherOrderOperator):
            return self.below(func, types, args, kwargs)
        kwargs = kwargs or {}
        if func is aten._cudnn_rnn.default:
            out = self._forward(*args, **kwargs)
            self._reserves[id(out[3])] = out[3]
            return out
        if func is aten._cudnn_rnn_backward.default:
            return self._backward(*args, **kwargs)
        if func is aten.clone.default and self._reserves.get(id(args[0])) is args[0] and in_backward():
            return args[0]
        if func is aten._thnn_fused_lstm_cell.default:
            # nn.LSTMCell's fused kernel (RNN.cu): hy, cy and the activated gates, kept for the
            # backward pass (PyTorch's meta kernel fails for a cell without biases)
            input_gates, cx = args[0], args[2]
            return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (cx, cx, input_gates))
        if func.overloadpacket is aten._use_cudnn_ctc_loss:
            return self._cudnn_ctc(func, *args, **kwargs)
        if func.overloadpacket is _USE_MIOPEN_CTC:
            return False  # ROCm's kernel: never on an NVIDIA GPU
        return self.below(func, types, args, kwargs)

    def _cudnn_ctc(
        self, func: Any, log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: Any, target_lengths: Any, blank: int
    ) -> bool:
        """Whether CUDA's ``ctc_loss`` takes cuDNN's kernel (aten/src/ATen/native/cudnn/LossCTC.cpp,
        ``_use_cudnn_ctc_loss``): blank 0, fp32 log-probabilities, concatenated int32 targets, every
        target shorter than 256 and no longer than its input; with lengths given as lists, the
        targets on the CPU and every input the full length."""
        tensors = func is aten._use_cudnn_ctc_loss.Tensor
        use = (
            torch.backends.cudnn.enabled
            and blank == 0
            and targets.dim() == 1
            and log_probs.dtype == torch.float32
            and targets.dtype == torch.int32
            and log_probs.device.type == "cuda"
            and targets.is_contiguous()
            and log_probs.dim() == 3
        )
        if tensors:
            use = use and input_lengths.dtype == target_lengths.dtype == torch.int32
        else:
            use = use and targets.device.type == "cpu"
        if not use:
            return False
        if tensors:
            known = [self._values(t) for t in (input_lengths, target_lengths)]
            if any(k is None for k in known):
                raise DataDependentOutputException(func)  # the choice reads the lengths: values the run lacks
            with _disable_current_modes():
                input_lengths, target_lengths = (k.tolist() for k in known if k is not None)
        elif any(n != log_probs.shape[0] for n in input_lengths):
            return False
        return all(t < 256 and t <= i for t, i in zip(target_lengths, input_lengths))

    @staticmethod
    def _forward(
        input: torch.Tensor,
        weight: list[torch.Tensor],
        weight_stride0: int,
        weight_buf: torch.Tensor | None,
        hx: torch.Tensor,
        cx: torch.Tensor | None,
        mode: int,
        hidden_size: int,
        proj_size: int,
        num_layers: int,
        batch_first: bool,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_sizes: list[int],
        dropout_state: torch.Tensor | None,
    ) -> tuple[torch.Tensor, ...]:
        directions = 2 if bidirectional else 1
        out = proj_size or hidden_size
        if batch_sizes:  # packed: [rows, features], the steps' rows one after the other
            batch = batch_sizes[0]
            output = input.new_empty((input.shape[0], out * directions))
            rows = input.shape[0]  # the reserve holds each step's rows (sized as unpacked, per row: unmeasured)
        else:
            batch, seq = (input.shape[0], input.shape[1]) if batch_first else (input.shape[1], input.shape[0])
            output = input.new_empty((batch, seq, out * directions) if batch_first else (seq, batch, out * directions))
            rows = seq * batch
        hy = hx.new_empty((num_layers * directions, batch, out))
        cy = cx.new_empty((num_layers * directions, batch, hidden_size)) if cx is not None else input.new_empty(0)
        size = reserve_bytes(mode, 1, rows, hidden_size, num_layers, directions, input.element_size()) if train else 0
        reserve = input.new_empty(size, dtype=torch.uint8)
        return output, hy, cy, reserve, weight_buf if weight_buf is not None else input.new_empty(0)

    @staticmethod
    def _backward(
        input: torch.Tensor,
        weight: list[torch.Tensor],
        weight_stride0: int,
        weight_buf: torch.Tensor,
        hx: torch.Tensor,
        cx: torch.Tensor | None,
        *rest: Any,
    ) -> tuple[Any, ...]:
        output_mask = rest[-1]
        # the input's and the initial states' gradients are computed whether asked for or not
        # (cuDNN's backward-data call is what the weights' needs); autograd drops those not asked for
        grad_input = torch.empty_like(input)
        grad_hx = torch.empty_like(hx)
        grad_cx = torch.empty_like(cx) if cx is not None else None
        grad_weights: list[torch.Tensor] = []
        if output_mask[3]:
            flat = input.new_empty(sum(w.numel() for w in weight), dtype=weight[0].dtype)  # one buffer, as cuDNN writes it
            offset = 0
            for w in weight:
                grad_weights.append(flat[offset : offset + w.numel()].view(w.shape))
                offset += w.numel()
        return grad_input, grad_hx, grad_cx, grad_weights
