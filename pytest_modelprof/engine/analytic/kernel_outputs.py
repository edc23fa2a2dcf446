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
  returns the two bias gradients as two tensors, where PyTorch's meta kernel returns one tensor
  twice, which autograd then copies; and every gradient in float32, also for bfloat16 (which
  autograd then casts), where PyTorch 2.11's meta kernel gives them the input's dtype.
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
- **products of two dtypes** (``mm``, ``addmm``, ``mv``, ``convolution``): the CPU and CUDA kernels
  refuse a float32 matrix times a bfloat16 one, and a convolution whose weight or bias is not of
  its input's dtype, which PyTorch's meta kernels take; the run refuses them as they do (what a
  custom ``autograd.Function`` meets in a backward pass that autocast does not cover, on CUDA,
  which keeps more ops in float32, more often than on the CPU).
- **normalisations of mixed precision on the CPU** (layer, group and batch norm): the CPU kernels take
  parameters of another dtype than the input only as float32 for a bfloat16 or float16 input, and
  refuse the rest (a float32 input with bfloat16 weights), which the meta kernels take; CUDA's take them.
- **layouts**: some meta kernels lay out their output like a non-contiguous input where the
  real kernel makes it contiguous (or the other way round), and what follows then copies in
  one run and not in the other (a ``reshape`` of a transposed gradient): the normalisations'
  outputs and gradients (batch norm: the input's suggested memory format, channels-last kept,
  anything else contiguous; layer norm's input gradient: contiguous; group norm's: as batch
  norm on the CPU, contiguous on CUDA), ``log_softmax``'s gradient, ``log_sigmoid`` on the CPU
  and the Huber loss's gradient (contiguous), and dropout's gradient on the CPU (the incoming
  gradient's layout), ``nan_to_num`` (its input's) and a number raised to a tensor's powers
  (contiguous). :data:`LAYOUTS`; each checked against the CPU kernels in
  tests/test_kernel_outputs.py.
- **elementwise outputs and views**: ATen lays out an elementwise op's output in its
  TensorIterator, by the operands' strides, where a number or a 0-dim tensor counts as an
  operand (:func:`elementwise_strides`), and strides a view by ``computeStride``
  (:func:`view_strides`). PyTorch's Python references, which fake tensors run, differ where
  dimensions have size 1 or an operand has none: an attention output viewed back as an image
  at batch 1 and halved is channels-last to them and not to the real kernels, and the
  convolution after it then lays out (and a ``contiguous()`` copies) in one run only.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch._ops import HigherOrderOperator
from torch._prims_common import make_contiguous_strides_for, suggest_memory_format
from torch._subclasses.fake_tensor import FakeTensor

from ..ops import REDUCED_LOSSES, REGISTRY, bound_arguments, reorder_dimensions
from ..ops.iteration import non_overlapping_and_dense
from .layers import Layer

aten = torch.ops.aten

_VIEWS = frozenset({aten.view.default, aten._unsafe_view.default})
# elementwise ops whose kernels make their output in a TensorIterator (structured kernels), by name
_ITERATED = frozenset(packet.__name__ for packet, info in REGISTRY.items() if info.iterated)
# a pointwise op's number arguments that its kernels wrap into a 0-dim tensor operand (``gt.Scalar``'s other,
# ``rsub.Scalar``'s, ``where.ScalarOther``'s); the rest are parameters of a one-operand kernel (``alpha``,
# ``pow``'s exponent, ``clamp``'s bounds)
_WRAPPED = frozenset({"self", "other"})

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
    "nan_to_num.default": ("like", "self", False),  # empty_like its input (aten/src/ATen/native/UnaryOps.cpp)
    "pow.Scalar": ("contiguous", None, False),  # a number to a tensor's powers: the structured meta's output
}
LAYOUTS: dict[Any, tuple[str, str | None, bool]] = {
    getattr(getattr(aten, packet), overload): rule
    for name, rule in _LAYOUT_RULES.items()
    for packet, _, overload in [name.partition(".")]
    if hasattr(aten, packet) and overload in getattr(aten, packet).overloads()
}

# the matrix products whose kernels (CPU and CUDA) take two operands of one dtype only: the operands' positions
_ONE_DTYPE = {aten.mm.default: (0, 1), aten.addmm.default: (1, 2), aten._addmm_activation.default: (1, 2), aten.mv.default: (0, 1)}
# normalisations whose CPU kernels check their parameters' dtypes (aten/src/ATen/native/mixed_data_type.h):
# the input's position, the parameters' (weight, bias, and batch norm's running statistics)
_NORMS = {
    aten.native_layer_norm.default: (0, (2, 3)),
    aten.native_group_norm.default: (0, (1, 2)),
    aten.native_batch_norm.default: (0, (1, 2, 3, 4)),
    aten._native_batch_norm_legit.default: (0, (1, 2, 3, 4)),
    aten._native_batch_norm_legit_no_training.default: (0, (1, 2, 3, 4)),
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


def _onednn_lstm_gradients(out: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """``mkldnn_rnn_layer_backward``'s gradients as the CPU kernel returns them: each its own tensor, in float32."""
    made: list[torch.Tensor] = []
    for grad in out:
        if grad.dtype != torch.float32 or any(grad is other for other in out[: len(made)]):
            grad = torch.empty_like(grad, dtype=torch.float32)
        made.append(grad)
    return tuple(made)


class KernelOutputs(Layer):
    """Gives the outputs the module's notes list the storage and layout their kernels give them (fake tensors only)."""

    def handle(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        acts = _ACTING.get(func)
        if acts is None:
            acts = _ACTING[func] = _acts_on(func)
        if acts is _NOT:
            return self.below(func, types, args, kwargs)  # most ops: the meta kernel's outputs are the kernel's
        if acts is _ITERATING:  # an elementwise op (the common case of the rest): the last branch below, alone
            out = self.below(func, types, args, kwargs)
            if isinstance(out, FakeTensor) and not _all_contiguous(out, args) and any(isinstance(a, FakeTensor) for a in args[:3]):
                _restride(out, elementwise_strides(func, args, kwargs or {}, tuple(out.shape)))
            return out
        kwargs = kwargs or {}
        fake = any(isinstance(a, FakeTensor) for a in args[:3])  # a number may come first (pow.Scalar)
        if fake and func in _ONE_DTYPE:
            first, second = (args[i] for i in _ONE_DTYPE[func])
            if first.dtype != second.dtype:  # ATen's words (aten/src/ATen/native/LinearAlgebra.cpp, cuda/Blas.cpp)
                raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {first.dtype} != {second.dtype}")
        if fake and func is aten.convolution.default:
            for name, parameter in (("weight", args[1]), ("bias", args[2])):  # Convolution.cpp's check_input_same_type_as_parameters
                if parameter is not None and parameter.dtype != args[0].dtype:
                    raise RuntimeError(f"Input type ({args[0].dtype}) and {name} type ({parameter.dtype}) should be the same")
        if fake and func in _NORMS and args[0].device.type == "cpu":
            _check_mixed_cpu_norm(args, *_NORMS[func])
        if fake and func is _GROUPED_MM and args[0].dtype not in (torch.bfloat16, torch.float16):
            return _grouped_mm(*args, **kwargs)
        out = self.below(func, types, args, kwargs)
        if not fake:
            return out
        if func is aten.mkldnn_rnn_layer.default and torch.is_grad_enabled():
            bound = bound_arguments(func, args, kwargs)
            x, cx = bound["input"], bound["cx_"]
            # ATen hands the kernel its input time-major, batch_first or not
            seq, batch, width = x.shape
            size = onednn_lstm_workspace_bytes(seq, batch, width, bound["hidden_size"], x.element_size(), cx.element_size())
            out = (*out[:3], x.new_empty(size, dtype=torch.uint8))
        elif func is aten.mkldnn_rnn_layer_backward.default:
            out = _onednn_lstm_gradients(out)
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
        elif func.overloadpacket.__name__ in _ITERATED and isinstance(out, FakeTensor) and not _all_contiguous(out, args):
            _restride(out, elementwise_strides(func, args, kwargs, tuple(out.shape)))
        elif func in _VIEWS and isinstance(out, FakeTensor) and not args[0].is_contiguous():
            _restride(out, view_strides(tuple(args[0].shape), tuple(args[0].stride()), tuple(out.shape)))
        return out


def _restride(out: torch.Tensor, strides: tuple[int, ...] | None) -> None:
    """``out`` (the same tensor) given ``strides`` where they are known and not its own already."""
    if strides is not None and strides != tuple(out.stride()):
        out.as_strided_(out.shape, strides, out.storage_offset())


def _acts_on(func: Any) -> object:
    """What :class:`KernelOutputs` does for ``func`` (the branches of its ``handle``): nothing, only lay out an elementwise
    op's output (``_ITERATING``), or the rest (``_ACTING_OTHERWISE``)."""
    if isinstance(func, HigherOrderOperator) or not hasattr(func, "overloadpacket"):
        return _NOT
    otherwise = (
        func in _ONE_DTYPE
        or func in _NORMS
        or func in REDUCED_LOSSES
        or func in EMBEDDING_BAGS
        or func in LAYOUTS
        or func in _VIEWS
        or func in _SIZED_BY_KERNELS
        or (_GROUPED_MM is not None and func is _GROUPED_MM)
    )
    if otherwise:
        return _ACTING_OTHERWISE
    return _ITERATING if func.overloadpacket.__name__ in _ITERATED else _NOT


_SIZED_BY_KERNELS = frozenset(
    {
        aten.convolution.default,
        aten.mkldnn_rnn_layer.default,
        aten.mkldnn_rnn_layer_backward.default,
        aten.im2col.default,
        aten.col2im.default,
    }
)
_NOT, _ITERATING, _ACTING_OTHERWISE = object(), object(), object()
_ACTING: dict[Any, object] = {}  # op -> _acts_on(op), worked out once


def _all_contiguous(out: torch.Tensor, args: Any) -> bool:
    """Whether an elementwise op's output and tensor operands are all laid out row-major, strides and all (size-1
    dimensions included, which ``is_contiguous`` overlooks): TensorIterator then keeps the dimensions in order, and
    the output is laid out as the meta kernel laid it out (the common case)."""
    return _row_major(out) and all(_row_major(a) for a in args if isinstance(a, torch.Tensor))


def _row_major(t: torch.Tensor) -> bool:
    shape = t.shape
    try:
        return t.stride() == _row_major_strides(shape)
    except TypeError:  # a symbolic size (unhashable)
        return t.stride() == _strides_of(shape)


@functools.lru_cache(maxsize=4096)
def _row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return _strides_of(shape)


def _strides_of(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a dense row-major tensor of ``shape``, size-1 dimensions included."""
    strides, expected = [], 1
    for size in reversed(shape):
        strides.append(expected)
        expected *= size
    return tuple(reversed(strides))


def _check_mixed_cpu_norm(args: Any, input_at: int, parameters_at: tuple[int, ...]) -> None:
    """The CPU kernels' ``is_mixed_type`` and ``check_mixed_data_type``: parameters of another dtype than the
    input must all be float32, and the input bfloat16 or float16."""
    x = args[input_at]
    parameters = [args[i] for i in parameters_at if i < len(args) and isinstance(args[i], torch.Tensor)]
    if all(p.dtype == x.dtype for p in parameters):
        return
    if any(p.dtype != torch.float32 for p in parameters):
        raise RuntimeError("mixed dtype (CPU): expect parameter to have scalar type of Float")
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise RuntimeError("mixed dtype (CPU): all inputs must share same datatype.")


def elementwise_strides(func: Any, args: Any, kwargs: dict[str, Any], shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides of a pointwise op's output as ATen's TensorIterator gives them (aten/src/ATen/TensorIterator.cpp),
    None where the op has no tensor operand or lays out as it is asked. Its operands are the arguments of
    tensor type, a Python number among them being a 0-dim tensor (the dispatcher wraps it), and the numbers
    its kernels wrap (:data:`_WRAPPED`). Where all have the output's shape, the fast
    setup: contiguous, channels-last, or the operands' common strides where they are dense; otherwise the
    dimensions sorted by the operands' strides (``reorder_dimensions``), the output dense in that order.
    PyTorch's Python reference differs where an operand has 0 dimensions or where dimensions have size 1
    (``a / 2`` on a transposed attention output: the real kernel keeps its layout, the fake one makes it
    channels-last), and the next op then copies in one run and not in the other."""
    schema = func._schema
    if any(argument.name == "memory_format" for argument in schema.arguments):
        return None  # laid out as it asks (clone, _to_copy)
    bound = bound_arguments(func, args, kwargs)
    operands: list[tuple[tuple[int, ...], tuple[int, ...], Any]] = []
    for argument in schema.arguments:
        value = bound.get(argument.name)
        if isinstance(argument.type, torch.TensorType) and isinstance(value, torch.Tensor):
            operands.append((tuple(value.shape), tuple(value.stride()), value))
        elif isinstance(value, (bool, int, float, complex)) and (
            isinstance(argument.type, torch.TensorType) or (isinstance(argument.type, torch.NumberType) and argument.name in _WRAPPED)
        ):
            operands.append(((), (), None))
    ndim = len(shape)
    broadcast = all(
        len(operand_shape) <= ndim and all(size in (1, shape[ndim - len(operand_shape) + i]) for i, size in enumerate(operand_shape))
        for operand_shape, _, _ in operands
    )
    if not operands or not shape or not broadcast or schema.is_mutable or math.prod(shape) == 0:
        return None  # not one output over its operands' broadcast shape (glu halves its input), or no elements
    if all(operand_shape == shape for operand_shape, _, _ in operands):
        tensors = [t for _, _, t in operands]
        if all(t.is_contiguous() for t in tensors):
            return tuple(make_contiguous_strides_for(shape))
        if ndim == 4 and all(t.is_contiguous(memory_format=torch.channels_last) for t in tensors):  # 2-d channels-last only
            _, c, h, w = shape
            return (h * w * c, 1, w * c, c)
        if all(non_overlapping_and_dense(t) for t in tensors) and len({stride for _, stride, _ in operands}) == 1:
            return operands[0][1]
    # each operand's strides over the output's dimensions, 0 where it is broadcast
    strides = []
    for operand_shape, operand_stride, _ in operands:
        offset = ndim - len(operand_shape)
        strides.append(
            [0] * offset + [0 if size == 1 and shape[offset + i] != 1 else operand_stride[i] for i, size in enumerate(operand_shape)]
        )

    def should_swap(dim0: int, dim1: int) -> int:
        for stride in strides:
            stride0, stride1 = stride[dim0], stride[dim1]
            if stride0 == 0 or stride1 == 0:
                continue
            if stride0 != stride1:
                return -1 if stride0 < stride1 else 1
            if shape[dim0] > shape[dim1]:  # equal strides: the smaller dimension goes first
                return 1
        return 0

    result = [0] * ndim
    step = 1
    for dim in reorder_dimensions(ndim, should_swap):
        result[dim] = step
        step *= shape[dim]
    return tuple(result)


def view_strides(shape: tuple[int, ...], stride: tuple[int, ...], new_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides ATen gives a view of a ``shape`` tensor with ``stride`` as ``new_shape``
    (aten/src/ATen/TensorUtils.cpp, ``computeStride``), None where no view can be made. Fake tensors
    take another rule for dimensions of size 1 (PyTorch's Python reference, ``_reshape_view_helper``),
    which then decides what follows: a channels-last-looking view of a transposed attention output is
    channels-last to the fake run and not to the real one, whose next kernels lay out otherwise."""
    if not shape:
        return (1,) * len(new_shape)
    if math.prod(shape) == 0:
        return stride if shape == new_shape else tuple(make_contiguous_strides_for(new_shape))
    new_stride = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride, tensor_numel, view_numel = stride[-1], 1, 1
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[tensor_d]
        # the end of a chunk of dimensions that are contiguous with each other: lay the view's over it
        if tensor_d == 0 or (shape[tensor_d - 1] != 1 and stride[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_stride[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride, tensor_numel, view_numel = stride[tensor_d - 1], 1, 1
    return tuple(new_stride) if view_d == -1 else None


def _laid_out(func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> Any:
    """``out`` with its first output laid out as the real kernel lays it out (see :data:`LAYOUTS`)."""
    rule, argument, cpu_only = LAYOUTS[func]
    first = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(first, FakeTensor) or (cpu_only and first.device.type != "cpu"):
        return out
    source = bound_arguments(func, args, kwargs)[argument] if argument else first
    if rule == "like":  # ATen's empty_like: a dense input's strides exactly (the fake one's can differ on size-1 dimensions)
        made = (
            torch.empty_strided(source.shape, source.stride(), dtype=first.dtype, device=first.device)
            if non_overlapping_and_dense(source)
            else torch.empty_like(source, dtype=first.dtype)
        )
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
