"""Kernel choices CUDA makes by asking the device, made here for a target GPU instead.

An analytic CUDA-target run takes most of CUDA's decisions from PyTorch itself: fake
tensors that claim ``cuda:0`` go through the CUDA dispatch keys (autocast's CUDA op
lists, cuDNN batch norm, the optimizers' foreach defaults). A few choices read the GPU's
properties at run time; without a GPU, PyTorch falls back to its slowest path. Those are
answered here from the target's :class:`~.gpus.GPUSpec`:

- **the attention backend** of ``scaled_dot_product_attention``
  (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp):
  the first backend, in PyTorch's priority order, that is enabled
  (``torch.backends.cuda.enable_*_sdp``, ``torch.nn.attention.sdpa_kernel``) and whose
  constraints the call meets. On compute capability 9.0 and 10.0 cuDNN comes first
  (``TORCH_CUDNN_SDPA_PREFERRED``, on by default; measured: torch 2.11 on an H100 runs
  cuDNN attention for bfloat16 heads of 64, with and without dropout).
- **recurrent layers** (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``): CUDA runs them as one cuDNN
  kernel, ``aten._cudnn_rnn``, chosen (with its dropout state) by code that needs a device;
  :func:`recurrent` calls it as that code does, and :class:`CudnnRnn` gives the op and its
  backward the outputs cuDNN gives them, with the training *reserve* (what cuDNN keeps for
  the backward pass) sized as ``cudnnGetRNNTrainingReserveSize`` sized it for an LSTM on an
  H100 (per step and sequence: each layer's four gates and cell state, and the output of
  every layer but the last: 369,099,008 bytes for 2 layers of 1024, 256 steps of 32, fp32;
  GRU and plain RNN by the same structure, unmeasured). The weights' gradients come in one
  buffer, as cuDNN writes them.
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..backward import in_backward
from .gpus import GPUSpec

MATH, FLASH, EFFICIENT, CUDNN = 0, 1, 2, 3  # torch.nn.attention.SDPBackend's values
aten = torch.ops.aten
_HALF = (torch.float16, torch.bfloat16)
_DEFAULT_ORDER = [FLASH, EFFICIENT, MATH, CUDNN]


def sdp_backend(
    gpu: GPUSpec,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> int:
    """The ``SDPBackend`` value PyTorch would choose on ``gpu`` for these arguments."""
    enabled = {
        FLASH: torch._C._get_flash_sdp_enabled(),
        EFFICIENT: torch._C._get_mem_efficient_sdp_enabled(),
        MATH: torch._C._get_math_sdp_enabled(),
        CUDNN: torch._C._get_cudnn_sdp_enabled(),
    }
    order = [int(b) for b in torch._C._get_sdp_priority_order() if int(b) in enabled]
    if order == _DEFAULT_ORDER and _prefers_cudnn(gpu):
        order = [CUDNN, FLASH, EFFICIENT, MATH]
    for backend in order:
        if enabled[backend] and _fits(backend, gpu, query, key, value, attn_mask, enable_gqa):
            return backend
    return -1  # SDPBackend.ERROR: PyTorch raises "No available kernel"


def _prefers_cudnn(gpu: GPUSpec) -> bool:
    return gpu.compute_capability in ((9, 0), (10, 0)) and os.environ.get("TORCH_CUDNN_SDPA_PREFERRED", "1") != "0"


def _fits(
    backend: int,
    gpu: GPUSpec,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    enable_gqa: bool,
) -> bool:
    if backend == MATH:
        return True
    tensors = (query, key, value)
    if any(t.dim() != 4 or t.is_nested for t in tensors) or len({t.dtype for t in tensors}) != 1:
        return False
    dtype, head_dim, value_dim = query.dtype, query.shape[-1], value.shape[-1]
    same_heads = query.shape[1] == key.shape[1] == value.shape[1]
    if backend == FLASH:
        return (
            gpu.compute_capability >= (8, 0)
            and dtype in _HALF
            and attn_mask is None
            and max(head_dim, value_dim) <= 256
            and head_dim % 8 == 0
            and value_dim % 8 == 0
        )
    if backend == EFFICIENT:
        alignment = 8 if dtype in _HALF else 4
        return (
            gpu.compute_capability >= (5, 0)
            and dtype in (torch.float32, *_HALF)
            and (dtype != torch.bfloat16 or gpu.compute_capability >= (8, 0))
            and not (enable_gqa and not same_heads)
            and head_dim % alignment == 0
            and value_dim % alignment == 0
        )
    # cuDNN
    return (
        gpu.compute_capability >= (8, 0)
        and dtype in _HALF
        and not (enable_gqa and not same_heads)
        and max(head_dim, value_dim) <= 128
        and head_dim % 8 == 0
        and value_dim % 8 == 0
    )


class _Attention(TorchFunctionMode):
    """Calls of ``scaled_dot_product_attention`` through a reference taken at import time."""

    def __init__(self, attention: Any) -> None:
        super().__init__()
        self.attention = attention

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is _STOCK_SDPA:
            return self.attention(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


_STOCK_SDPA = F.scaled_dot_product_attention


class CudaKernels:
    """While a fake CUDA-target run steps (a context manager): the choices above, as ``gpu`` would make them.

    ``scaled_dot_product_attention`` makes its choice inside one C++ function, without a
    dispatched op to answer; so ``torch.nn.functional.scaled_dot_product_attention`` is
    replaced for the run (and calls through a reference taken at import time are caught by
    a TorchFunctionMode) by :meth:`attention`, which does what that function does for the
    chosen backend: cast to autocast's dtype (it is on autocast's lower-precision list), call
    the backend's op (whose autograd formula runs its backward kernel), return its output.
    """

    def __init__(self, gpu: GPUSpec) -> None:
        self.gpu = gpu

    def __enter__(self) -> CudaKernels:
        self._stock = F.scaled_dot_product_attention
        self._exits = contextlib.ExitStack()
        F.scaled_dot_product_attention = self.attention
        self._exits.callback(setattr, F, "scaled_dot_product_attention", self._stock)
        for name, mode in RNN_MODES.items():
            stock = getattr(torch._VF, name)
            setattr(torch._VF, name, recurrent(stock, mode))
            self._exits.callback(delattr, torch._VF, name)
        self._exits.enter_context(CudnnRnn())
        self._exits.enter_context(_Attention(self.attention))
        # nn.LSTM's flatten_parameters() reads data pointers of CUDA weights (fake ones: all
        # alike, so it keeps the weights as they are); FakeTensor warns of that read
        self._exits.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor", category=UserWarning)
        return self

    def __exit__(self, *exc: object) -> None:
        self._exits.close()

    def attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if torch.is_autocast_enabled("cuda") and query.is_floating_point():
            dtype = torch.get_autocast_dtype("cuda")
            query, key, value = (t.to(dtype) if t.dtype == torch.float32 else t for t in (query, key, value))
        backend = sdp_backend(self.gpu, query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        logsumexp = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        if attn_mask is not None and attn_mask.dtype == torch.bool and backend in (CUDNN, EFFICIENT):
            attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(~attn_mask, float("-inf"))
        if backend == CUDNN:
            out = aten._scaled_dot_product_cudnn_attention(
                query, key, value, attn_mask, logsumexp, dropout_p, is_causal, False, scale=scale
            )
        elif backend == FLASH:
            out = aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)
        elif backend == EFFICIENT:
            out = aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, logsumexp, dropout_p, is_causal, scale=scale)
        else:
            return self._stock(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        output: torch.Tensor = out[0]
        return output


RNN_MODES = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}  # cuDNN's modes
_GATES = {0: 1, 1: 1, 2: 4, 3: 3}
RESERVE_ALIGNMENT = 256


def recurrent(stock: Any, mode: int) -> Any:
    """``torch._VF.lstm`` (and its kin) as CUDA runs them on fake CUDA tensors: ``aten._cudnn_rnn``."""

    def run(input: torch.Tensor, *args: Any) -> Any:
        if input.device.type != "cuda" or (isinstance(args[0], torch.Tensor) and args[0].dim() == 1):
            return stock(input, *args)  # not CUDA, or a packed sequence (batch sizes first)
        hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first = args
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
                input, params, stride0, None, h, c, mode, hidden, proj, num_layers, batch_first, dropout, train, bidirectional, [], None
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
    per_step = directions * (layers * (_GATES[mode] + (1 if mode == 2 else 0)) + (layers - 1)) * hidden
    return seq * batch * per_step * element + RESERVE_ALIGNMENT


class CudnnRnn(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Outputs of ``aten._cudnn_rnn`` and its backward as cuDNN makes them (fake tensors only).

    The backward node clones the reserve unless the engine has told it that its saved
    tensors will be released (``will_release_variables``, which the Python backward pass
    cannot call): that clone of a reserve is answered with the reserve itself.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._reserves: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is aten._cudnn_rnn.default:
            out = self._forward(*args, **kwargs)
            self._reserves[id(out[3])] = out[3]
            return out
        if func is aten._cudnn_rnn_backward.default:
            return self._backward(*args, **kwargs)
        if func is aten.clone.default and self._reserves.get(id(args[0])) is args[0] and in_backward():
            return args[0]
        return func(*args, **kwargs)

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
        batch, seq = (input.shape[0], input.shape[1]) if batch_first else (input.shape[1], input.shape[0])
        out = proj_size or hidden_size
        output = input.new_empty((batch, seq, out * directions) if batch_first else (seq, batch, out * directions))
        hy = hx.new_empty((num_layers * directions, batch, out))
        cy = cx.new_empty((num_layers * directions, batch, hidden_size)) if cx is not None else input.new_empty(0)
        size = reserve_bytes(mode, seq, batch, hidden_size, num_layers, directions, input.element_size()) if train else 0
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
        grad_input = torch.empty_like(input) if output_mask[0] else None
        grad_hx = torch.empty_like(hx) if output_mask[1] else None
        grad_cx = torch.empty_like(cx) if output_mask[2] and cx is not None else None
        grad_weights: list[torch.Tensor] = []
        if output_mask[3]:
            flat = input.new_empty(sum(w.numel() for w in weight), dtype=weight[0].dtype)  # one buffer, as cuDNN writes it
            offset = 0
            for w in weight:
                grad_weights.append(flat[offset : offset + w.numel()].view(w.shape))
                offset += w.numel()
        return grad_input, grad_hx, grad_cx, grad_weights
