"""Outputs that a kernel makes otherwise than PyTorch's meta kernel (their storage, their layout), for analytic runs.

A fake tensor's op runs its meta kernel, which gives the outputs' shapes and a storage
that just holds them. Where the real kernel's output owns more (a storage allocated for
one shape and then shrunk, a workspace a library sizes at run time), an analytic run
would count less memory than a real one; where it is laid out otherwise, the ops that
follow copy in one run and not in the other. :class:`KernelOutputs` gives those outputs
the storage and layout their kernels give them:

- **oneDNN's LSTM** (``aten.mkldnn_rnn_layer``, what ``nn.LSTM`` runs on the CPU in float32
  and bfloat16): with autograd recording, the kernel returns the workspace oneDNN keeps for
  the backward pass, ``pd.workspace_desc().get_size()`` bytes
  (aten/src/ATen/native/mkldnn/RNN.cpp). PyTorch's meta kernel returns an empty one. Its
  size is :func:`onednn_lstm_workspace_bytes`. Its backward (``mkldnn_rnn_layer_backward``)
  returns the two bias gradients as two tensors; PyTorch's meta kernel returns one tensor
  twice, which autograd then copies.
- **im2col and col2im** (``F.unfold``, ``F.fold``; CPU and CUDA, aten/src/ATen/native/Im2Col.cpp,
  Col2Im.cpp and their cuda/ versions): the output is made ``empty_like`` the input and then
  resized, so it keeps the input's storage where that is the larger: a fold of overlapping
  patches holds the columns (kernel area times the image), an unfold whose stride passes
  its kernel holds the image.
- **reduced losses** (``mse_loss``, ``smooth_l1_loss``, ``soft_margin_loss``,
  ``binary_cross_entropy`` with ``reduction="mean"`` or ``"sum"``; CPU and CUDA,
  aten/src/ATen/native/Loss.cpp, cuda/Loss.cu): the output is made for the elementwise loss
  (of the broadcast shape) and resized to the scalar, so the loss a training step holds
  through its backward pass keeps the elementwise loss's bytes.
- **embedding bags on the CPU** (aten/src/ATen/native/EmbeddingBag.cpp, ``make_offset2bag_out``): the
  map of each index to its bag is made one longer and then resized, and is skipped on the
  fast path of a sum, which bfloat16 weights take as well as float32 and float16 ones.
- **grouped products in full precision** (``torch._grouped_mm``, the experts of a mixture of
  experts): the CPU and CUDA kernels take float32, PyTorch's meta kernel refuses it; the output
  is made here as those kernels make it.
- **layouts**: some meta kernels lay out their output like a non-contiguous input where the
  real kernel makes it contiguous (or the other way round), and what follows then copies in
  one run and not in the other (a ``reshape`` of a transposed gradient): the normalisations'
  outputs and gradients (batch norm: the input's suggested memory format, channels-last kept,
  anything else contiguous; layer norm's input gradient: contiguous; group norm's: as batch
  norm on the CPU, contiguous on CUDA), ``log_softmax``'s gradient, ``log_sigmoid`` on the CPU
  and the Huber loss's gradient (contiguous), and dropout's gradient on the CPU (the incoming
  gradient's layout). :data:`LAYOUTS`; each checked against the CPU kernels in
  tests/test_kernel_outputs.py.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._prims_common import suggest_memory_format
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

from .formulas import bound_arguments

aten = torch.ops.aten

# losses whose reduced output keeps the storage made for the elementwise loss
REDUCED_LOSSES = frozenset(
    {aten.mse_loss.default, aten.smooth_l1_loss.default, aten.soft_margin_loss.default, aten.binary_cross_entropy.default}
)

EMBEDDING_BAGS = frozenset({aten._embedding_bag.default, aten._embedding_bag_forward_only.default})
SUM = 0  # the embedding bag mode with a fast path

# an op -> how its real kernels lay out its first output: by the suggested memory format of an
# argument, contiguous, or as an argument (empty_like); and whether the rule holds for the CPU only
_LAYOUT_RULES = {
    "native_batch_norm.default": ("suggested", "input", False),
    "_native_batch_norm_legit.default": ("suggested", "input", False),
    "_native_batch_norm_legit.no_stats": ("suggested", "input", False),
    "_native_batch_norm_legit_no_training.default": ("suggested", "input", False),
    "_batch_norm_with_update.default": ("suggested", "input", False),
    "_batch_norm_no_update.default": ("suggested", "input", False),
    "native_batch_norm_backward.default": ("suggested", "input", False),
    "batch_norm_backward.default": ("suggested", "input", False),
    "native_layer_norm_backward.default": ("contiguous", None, False),
    "native_group_norm_backward.default": ("suggested on cpu", "input", False),
    "_log_softmax_backward_data.default": ("contiguous", None, False),
    "huber_loss_backward.default": ("contiguous", None, False),
    "log_sigmoid_forward.default": ("contiguous", None, True),
    "native_dropout_backward.default": ("like", "grad_output", True),
}
LAYOUTS: dict[Any, tuple[str, str | None, bool]] = {
    getattr(getattr(aten, packet), overload): rule
    for name, rule in _LAYOUT_RULES.items()
    for packet, _, overload in [name.partition(".")]
    if hasattr(aten, packet) and overload in getattr(aten, packet).overloads()
}

_GROUPED_MM = getattr(aten, "_grouped_mm", None)
_GROUPED_MM = _GROUPED_MM.default if _GROUPED_MM is not None else None


def _grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> torch.Tensor:
    """The experts' grouped product (``torch._grouped_mm``) in a precision other than 16-bit: its CPU
    and CUDA kernels take it (a loop of products over the groups, aten/src/ATen/native/GroupedMMUtils.h),
    PyTorch's meta kernel refuses it. The output as those kernels make it: sized by the operands'
    shapes, its rows padded to 16 bytes."""
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    if a2 and b2:
        size = [offs.shape[0], mat_a.shape[0], mat_b.shape[1]]
    elif a2:
        size = [mat_a.shape[0], mat_b.shape[-1]]
    elif b2:
        size = [mat_a.shape[1], mat_b.shape[1]]
    else:
        size = [mat_a.shape[0], mat_a.shape[1], mat_b.shape[-1]]
    dtype = out_dtype or mat_a.dtype
    alignment = max(1, 16 // dtype.itemsize)
    padded = -(-size[-1] // alignment) * alignment
    stride = [size[1] * padded, padded, 1] if a2 == b2 else [padded, 1]
    return torch.empty_strided(size, stride, dtype=dtype, device=mat_a.device)


PAGE = 4096  # oneDNN places each part of an RNN workspace at a page boundary
FLOAT = 4  # oneDNN's accumulators (the gradients of the states) are float32


def _leading_dimension(size: int, element: int) -> int:
    """oneDNN's ``rnn_utils::get_good_ld``: a row padded to 64 bytes, and one more 64 bytes where
    the padded row is a multiple of 256 elements (against 4K aliasing)."""
    step = 64 // element
    padded = -(-size // step) * step
    return padded + step if padded % 256 == 0 else padded


def onednn_lstm_workspace_bytes(seq: int, batch: int, input_size: int, hidden: int, element: int, cell_element: int) -> int:
    """The workspace of one oneDNN LSTM layer and direction trained forward (float32 or bfloat16 states
    of ``element`` bytes, cell states of ``cell_element``), as oneDNN lays it out
    (src/cpu/rnn/rnn_utils.hpp, ``set_workspace_sizes``; rnn_utils.cpp, ``set_offsets``): each part
    starts at a page, the whole ends at one.

    - the gates of every step: ``seq · batch`` rows of ``4·hidden``;
    - the hidden state of every step (``ht``): ``seq · batch`` rows of ``hidden``;
    - the input and output states of the layer, ``seq + 1`` steps of ``batch`` rows of ``max(input, hidden)``,
      for the layer and the one above (2);
    - the cell states, the same steps of ``hidden`` (``cell_element`` bytes);
    - the gradients of the layer's and of the step's states (float32, rows of ``max(input, hidden)``) and of
      the cell states (float32, rows of ``hidden``), sized as the states.

    Rows of the states and gates are padded by :func:`_leading_dimension`. Checked against the
    kernel's own workspace on this CPU (oneDNN 3.x, float32 and bfloat16, tests/test_kernel_outputs.py).
    """
    steps = 2 * (seq + 1) * batch  # (layers + 1) · (seq + 1) · batch, one layer per call
    wide = max(input_size, hidden)
    parts = (
        seq * batch * _leading_dimension(4 * hidden, element) * element,
        seq * batch * _leading_dimension(hidden, element) * element,
        steps * _leading_dimension(wide, element) * element,
        steps * hidden * cell_element,
        steps * _leading_dimension(wide, FLOAT) * FLOAT,
        steps * _leading_dimension(wide, FLOAT) * FLOAT,
        steps * hidden * FLOAT,
    )
    return sum(-(-part // PAGE) * PAGE for part in parts)


class KernelOutputs(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Gives the outputs the module's notes list the storage and layout their kernels give them (fake tensors only)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        fake = bool(args) and isinstance(args[0], FakeTensor)
        if fake and func is _GROUPED_MM and args[0].dtype not in (torch.bfloat16, torch.float16):
            return _grouped_mm(*args, **kwargs)
        out = func(*args, **kwargs)
        if not fake:
            return out
        if func is aten.mkldnn_rnn_layer.default and torch.is_grad_enabled():
            bound = bound_arguments(func, args, kwargs)
            x, cx = bound["input"], bound["cx_"]
            # ATen hands the kernel its input time-major, batch_first or not
            seq, batch, width = x.shape
            size = onednn_lstm_workspace_bytes(seq, batch, width, bound["hidden_size"], x.element_size(), cx.element_size())
            out = (*out[:3], x.new_empty(size, dtype=torch.uint8))
        elif func is aten.mkldnn_rnn_layer_backward.default and out[3] is out[4]:
            out = (*out[:4], torch.empty_like(out[3]), *out[5:])
        elif func in (aten.im2col.default, aten.col2im.default):
            made = torch.empty_like(args[0], memory_format=torch.contiguous_format)
            out = made.resize_(out.shape)  # as the kernel: the input's storage, shrunk or grown to the output
        elif func in REDUCED_LOSSES and out.dim() == 0:
            bound = bound_arguments(func, args, kwargs)
            made = args[0].new_empty(torch.broadcast_shapes(bound["self"].shape, bound["target"].shape), dtype=out.dtype)  # type: ignore[no-untyped-call]
            out = made.resize_(())
        elif func in EMBEDDING_BAGS and args[0].device.type == "cpu":
            out = (out[0], _offset2bag(func, args, kwargs, out[0]), *out[2:])
        elif func in LAYOUTS:
            out = _laid_out(func, args, kwargs, out)
        return out


def _laid_out(func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> Any:
    """``out`` with its first output laid out as the real kernel lays it out (see :data:`LAYOUTS`)."""
    rule, argument, cpu_only = LAYOUTS[func]
    first = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(first, FakeTensor) or (cpu_only and first.device.type != "cpu"):
        return out
    source = bound_arguments(func, args, kwargs)[argument] if argument else first
    if rule == "like":
        made = torch.empty_like(source, dtype=first.dtype)
    else:
        suggested = rule == "suggested" or (rule == "suggested on cpu" and first.device.type == "cpu")
        made = torch.empty_like(first, memory_format=suggest_memory_format(source) if suggested else torch.contiguous_format)
    if made.stride() == first.stride():
        return out
    return made if first is out else type(out)((made, *out[1:]))


def _offset2bag(func: Any, args: Any, kwargs: dict[str, Any], output: torch.Tensor) -> torch.Tensor:
    """The CPU kernel's map of indices to bags: none on the fast path of a sum (float32, float16 or
    bfloat16 weights read along rows, no padding index), else one entry per index, made one longer."""
    bound = bound_arguments(func, args, kwargs)
    weight, indices, scale = bound["weight"], bound["indices"], bound["per_sample_weights"]
    offsets: torch.Tensor = bound["offsets"]
    fast = (
        weight.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and weight.stride(1) == 1
        and output.stride(1) == 1
        and bound["padding_idx"] < 0
        and (scale is None or scale.stride(0) == 1)
    )
    if bound["mode"] == SUM and fast:
        return offsets.new_empty(0)
    entries: int = indices.size(0)
    return offsets.new_empty(entries + 1).resize_(entries)
