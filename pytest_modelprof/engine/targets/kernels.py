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
- **the fused inference paths** of ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``
  (torch/nn/modules/activation.py, transformer.py): in eval mode without autograd they call
  ``torch._native_multi_head_attention`` and ``torch._transformer_encoder_layer_fwd`` unless a
  tensor argument "has a torch function", which fake tensors and the engine's own modes
  would: :func:`has_torch_function` answers as a run of plain CUDA tensors would. The two
  ops then run as their CUDA kernels run them (aten/src/ATen/native/transformers/cuda/attention.cu,
  transformer.cpp): one packed projection, the attention backend's kernel when one takes the
  call (self-attention, no weights asked for, no mask, heads of a multiple of 8), otherwise the
  explicit path (projection, bias and scale of q, k and v in one kernel, two batched products,
  a softmax); the encoder layer's feed-forward block with its activation in the first
  product's epilogue.
- **CTC**: ``ctc_loss`` asks ``_use_cudnn_ctc_loss`` whether cuDNN's kernel takes the call
  (aten/src/ATen/native/cudnn/LossCTC.cpp), which reads the lengths: answered here from the
  arguments and the lengths' known values.
- **autocast**: ``torch.autocast("cuda")`` entered inside the model (and by activation
  checkpointing, which recomputes a block under the autocast state of its forward) disables
  itself where no CUDA device is present; on a target it is enabled as on that GPU
  (bfloat16 from compute capability 8.0).
"""

from __future__ import annotations

import contextlib
import os
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from ..backward import HookGuard, in_backward
from ..fake import input_gradient_meta, meta_kernels
from .gpus import GPUSpec
from .scratch import threads_per_sm

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
        if enabled[backend] and _fits(backend, gpu, query, key, value, attn_mask, enable_gqa, is_causal):
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
    is_causal: bool = False,
) -> bool:
    """The constraints of aten/src/ATen/native/transformers/cuda/sdp_utils.cpp that a call's arguments
    and the GPU decide (``can_use_flash_attention`` and its kin)."""
    if backend == MATH:
        return True
    tensors = (query, key, value)
    if any(t.dim() != 4 or t.is_nested for t in tensors) or len({t.dtype for t in tensors}) != 1:
        return False
    if any(t.shape[2] == 0 or t.shape[3] == 0 for t in tensors):  # check_nonzero_sequence_lengths_dense
        return False
    # check_last_dim_stride_equals_1_dense (flash and cuDNN let a last dimension of size 1 have any stride)
    if any(t.stride(-1) != 1 and not (backend != EFFICIENT and t.shape[-1] == 1) for t in tensors):
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
            and not (is_causal and query.shape[2] != key.shape[2])  # check_flash_causal_non_square_seqlens
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
        and key.shape[2] != 1  # check_cudnn_tensor_shapes: no key/value sequence of 1
        and max(query.shape[0], query.shape[1]) <= 65535
        and not (torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled())
    )


class _Functions(TorchFunctionMode):
    """Calls CUDA answers with kernels of its own choosing: ``scaled_dot_product_attention`` through a
    reference taken at import time, and the fused inference ops of the transformer modules."""

    def __init__(self, kernels: CudaKernels) -> None:
        super().__init__()
        self.calls = {
            _STOCK_SDPA: kernels.attention,
            torch._native_multi_head_attention: kernels.multi_head_attention,
            torch._transformer_encoder_layer_fwd: kernels.encoder_layer,
        }

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.calls.get(func, func)(*args, **(kwargs or {}))


def has_torch_function(stock: Any) -> Any:
    """``torch.overrides.has_torch_function`` as a run of plain CUDA tensors answers it: the engine's
    fake tensors and its own modes have no torch function there (others, a user's, still do)."""

    def answer(values: Any) -> bool:
        values = tuple(values)
        modes = torch.overrides._get_current_function_mode_stack()  # type: ignore[no-untyped-call]
        own = all(isinstance(m, _ENGINE_MODES) for m in modes)
        plain = all(type(v) in _PLAIN or isinstance(v, FakeTensor) for v in values if isinstance(v, torch.Tensor))
        return False if own and plain else bool(stock(values))

    return answer


_STOCK_SDPA = F.scaled_dot_product_attention
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_ENGINE_MODES = (_Functions, HookGuard)


@contextlib.contextmanager
def _cuda_autocast_available(gpu: GPUSpec) -> Any:
    """``torch.autocast("cuda")`` as on ``gpu``: its constructor disables it (with a warning) where no
    CUDA device is present, and refuses bfloat16 where the device has no support for it."""
    common = torch.cuda.amp.common
    stock = common.amp_definitely_not_available, torch.cuda.is_bf16_supported
    common.amp_definitely_not_available = lambda: False
    torch.cuda.is_bf16_supported = lambda including_emulation=True: gpu.compute_capability >= (8, 0)
    try:
        yield
    finally:
        common.amp_definitely_not_available, torch.cuda.is_bf16_supported = stock


@contextlib.contextmanager
def _device_queries(gpu: GPUSpec) -> Any:
    """``torch.cuda.get_device_capability``, ``get_device_properties`` and ``get_device_name`` answered as
    ``gpu`` answers them (a model that picks its kernels by the GPU asks them: transformers' experts ask
    the capability before a grouped product); what the spec does not hold is not made up."""
    properties = types.SimpleNamespace(
        name=gpu.name,
        major=gpu.compute_capability[0],
        minor=gpu.compute_capability[1],
        total_memory=gpu.memory_bytes,
        multi_processor_count=gpu.sm_count,
        max_threads_per_multi_processor=threads_per_sm(gpu.compute_capability),
        warp_size=32,
        is_integrated=False,
        is_multi_gpu_board=False,
    )
    cuda = torch.cuda
    stock = cuda.get_device_capability, cuda.get_device_properties, cuda.get_device_name
    cuda.get_device_capability = lambda device=None: gpu.compute_capability
    cuda.get_device_properties = lambda device=None: properties  # type: ignore[assignment,return-value]
    cuda.get_device_name = lambda device=None: gpu.name
    try:
        yield
    finally:
        cuda.get_device_capability, cuda.get_device_properties, cuda.get_device_name = stock


class CudaKernels:
    """While a fake CUDA-target run steps (a context manager): the choices above, as ``gpu`` would make them.

    ``scaled_dot_product_attention`` makes its choice inside one C++ function, without a
    dispatched op to answer; so ``torch.nn.functional.scaled_dot_product_attention`` is
    replaced for the run (and calls through a reference taken at import time are caught by
    a TorchFunctionMode) by :meth:`attention`, which does what that function does for the
    chosen backend: cast to autocast's dtype (it is on autocast's lower-precision list), call
    the backend's op (whose autograd formula runs its backward kernel), return its output.
    """

    def __init__(self, gpu: GPUSpec, values: Callable[[torch.Tensor], torch.Tensor | None] = lambda t: None) -> None:
        self.gpu = gpu
        self.values = values  # the values the run knows (engine/values.py), for choices that read them

    def __enter__(self) -> CudaKernels:
        self._stock = F.scaled_dot_product_attention
        self._exits = contextlib.ExitStack()
        F.scaled_dot_product_attention = self.attention
        self._exits.callback(setattr, F, "scaled_dot_product_attention", self._stock)
        for name, mode in RNN_MODES.items():
            stock = getattr(torch._VF, name)
            setattr(torch._VF, name, recurrent(stock, mode))
            self._exits.callback(delattr, torch._VF, name)
        self._exits.enter_context(CudaOps(self.values))
        self._exits.enter_context(_Functions(self))
        stock_check = torch.overrides.has_torch_function
        torch.overrides.has_torch_function = has_torch_function(stock_check)
        self._exits.callback(setattr, torch.overrides, "has_torch_function", stock_check)
        self._exits.enter_context(meta_kernels(_META))  # ops of the fused paths PyTorch has no meta kernel for
        self._exits.enter_context(_cuda_autocast_available(self.gpu))
        self._exits.enter_context(_device_queries(self.gpu))
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
            if attn_mask is not None and attn_mask.dtype == torch.float32:  # autocast casts every fp32 argument
                attn_mask = attn_mask.to(dtype)
        backend = sdp_backend(self.gpu, query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        # the row log-sum-exps a backward pass needs, also for a mask that needs a gradient
        # (attention.cpp's should_compute_logsumexp)
        logsumexp = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (query, key, value, attn_mask))
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

    def multi_head_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        embed_dim: int,
        num_head: int,
        qkv_weight: torch.Tensor,
        qkv_bias: torch.Tensor,
        proj_weight: torch.Tensor,
        proj_bias: torch.Tensor,
        mask: torch.Tensor | None = None,
        need_weights: bool = True,
        average_attn_weights: bool = True,
        mask_type: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``torch._native_multi_head_attention`` as its CUDA kernel runs it (see the module's notes)."""
        head = embed_dim // num_head
        batch = query.shape[0]
        if query is key and key is value and head % 8 == 0 and not need_weights and mask is None:
            heads = query.view(batch, -1, num_head, head).transpose(1, 2)
            if sdp_backend(self.gpu, heads, heads, heads) in (FLASH, EFFICIENT, CUDNN):
                x = F.linear(query, qkv_weight, qkv_bias)
                q, k, v = (c.view(batch, -1, num_head, head).transpose(1, 2) for c in x.chunk(3, -1))
                y = self.attention(q, k, v)
                return F.linear(y.transpose(1, 2).reshape(batch, -1, embed_dim), proj_weight, proj_bias), None
        qkv = _qkv_projection(query, key, value, embed_dim, qkv_weight)
        q, k, v = aten._transform_bias_rescale_qkv(qkv, qkv_bias, num_head)
        del qkv
        rows, q_len, k_len = batch * num_head, q.shape[2], k.shape[2]
        q_rows = q.reshape(rows, q_len, head)  # a view of q's buffer, which the weighted sum then reuses
        scores = torch.bmm(q_rows, k.reshape(rows, k_len, head).transpose(2, 1)).view(batch, num_head, q_len, k_len)
        if mask is not None:
            scores = aten._masked_softmax(scores, mask.to(torch.bool), scores.dim() - 1, mask_type)
        else:
            scores = aten._softmax.out(scores, scores.dim() - 1, False, out=scores)
        context = torch.bmm(scores.view(rows, q_len, k_len), v.reshape(rows, k_len, head), out=q_rows)
        context = context.view(batch, num_head, q_len, head).permute(0, 2, 1, 3).contiguous()
        out = F.linear(context.view(-1, embed_dim), proj_weight, proj_bias).view(batch, -1, embed_dim)
        if not need_weights:
            return out, None
        if average_attn_weights:
            scores = scores.sum(1)
            scores /= num_head
        return out, scores

    def encoder_layer(
        self,
        src: torch.Tensor,
        embed_dim: int,
        num_heads: int,
        qkv_weight: torch.Tensor,
        qkv_bias: torch.Tensor,
        proj_weight: torch.Tensor,
        proj_bias: torch.Tensor,
        use_gelu: bool,
        norm_first: bool,
        eps: float,
        norm1_weight: torch.Tensor,
        norm1_bias: torch.Tensor,
        norm2_weight: torch.Tensor,
        norm2_bias: torch.Tensor,
        ffn_weight_1: torch.Tensor,
        ffn_bias_1: torch.Tensor,
        ffn_weight_2: torch.Tensor,
        ffn_bias_2: torch.Tensor,
        mask: torch.Tensor | None = None,
        mask_type: int | None = None,
    ) -> torch.Tensor:
        """``torch._transformer_encoder_layer_fwd`` as CUDA runs it (aten/src/ATen/native/transformers/transformer.cpp)."""
        if src.numel() == 0:
            return src.clone()
        shape = (embed_dim,)
        x = F.layer_norm(src, shape, norm1_weight, norm1_bias, eps) if norm_first else src
        x = self.multi_head_attention(
            x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, False, True, mask_type
        )[0]
        x.add_(src)
        if not norm_first:
            x = F.layer_norm(x, shape, norm1_weight, norm1_bias, eps)
        residual = x
        if norm_first:
            x = F.layer_norm(x, shape, norm2_weight, norm2_bias, eps)
        batch, seq = x.shape[:2]
        hidden = torch._addmm_activation(ffn_bias_1, x.reshape(batch * seq, embed_dim), ffn_weight_1.t(), use_gelu=use_gelu)
        x = torch.addmm(ffn_bias_2, hidden, ffn_weight_2.t()).view(batch, seq, -1)
        x.add_(residual)
        if not norm_first:
            x = F.layer_norm(x, shape, norm2_weight, norm2_bias, eps)
        return x


def _qkv_projection(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim: int, weight: torch.Tensor) -> torch.Tensor:
    """The packed input projection, without its bias (added in ``_transform_bias_rescale_qkv``)."""

    def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.mm(x.reshape(-1, x.shape[-1]), w.t()).view(x.shape[0], x.shape[1], -1)

    if key is value:
        if query is key:
            return project(query, weight)
        q_weight, kv_weight = weight.split([embed_dim, 2 * embed_dim])  # type: ignore[no-untyped-call]
        return torch.cat([project(query, q_weight), project(key, kv_weight)], 2)
    return torch.cat([project(t, w) for t, w in zip((query, key, value), weight.chunk(3))], 2)


def _transform_bias_rescale_qkv_meta(qkv: torch.Tensor, bias: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, ...]:
    batch, seq, packed = qkv.shape
    head = packed // 3 // num_heads
    q, k, v = qkv.new_empty((3, batch, num_heads, seq, head)).unbind(0)  # one buffer, as the kernel writes it
    return q, k, v


def _masked_softmax_meta(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, mask_type: int | None = None) -> torch.Tensor:
    return torch.empty_like(x)


def _cudnn_grid_sampler_meta(input: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """aten/src/ATen/native/cudnn/GridSampler.cpp: a contiguous [N, C, H_out, W_out] output."""
    return input.new_empty((input.shape[0], input.shape[1], grid.shape[1], grid.shape[2]))


def _cudnn_grid_sampler_backward_meta(input: torch.Tensor, grid: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both gradients, always (cuDNN has no output mask), contiguous."""
    return input.new_empty(input.shape), grid.new_empty(grid.shape)


GRU_WORKSPACE = 5  # what the fused GRU cell keeps per hidden unit: 3 gates, hx, and hn + its bias


def _fused_gru_cell_meta(
    input_gates: torch.Tensor, hidden_gates: torch.Tensor, hx: torch.Tensor, *biases: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """aten/src/ATen/native/cuda/RNN.cu, ``_thnn_fused_gru_cell_cuda``: hy and the workspace."""
    batch, hidden = hx.shape
    return torch.empty_like(hx, memory_format=torch.contiguous_format), hx.new_empty((batch, GRU_WORKSPACE * hidden))


def _fused_gru_cell_backward_meta(grad_hy: torch.Tensor, workspace: torch.Tensor, has_bias: bool) -> tuple[torch.Tensor | None, ...]:
    """The gates' gradients (input and hidden side), hx's, and the biases' (the gates' sums)."""
    batch, hidden = workspace.shape[0], workspace.shape[1] // GRU_WORKSPACE
    gates = (workspace.new_empty((batch, 3 * hidden)), workspace.new_empty((batch, 3 * hidden)))
    biases = (workspace.new_empty((3 * hidden,)), workspace.new_empty((3 * hidden,))) if has_bias else (None, None)
    return (*gates, torch.empty_like(grad_hy, memory_format=torch.contiguous_format), *biases)


def _cudnn_ctc_loss_meta(log_probs: torch.Tensor, *_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """cuDNN's CTC: the loss per sequence, and the gradient, computed in the forward pass."""
    return log_probs.new_empty((log_probs.shape[1],)), torch.empty_like(log_probs, memory_format=torch.contiguous_format)


# meta kernels of the CUDA ops that PyTorch has none for: those of the fused paths; cuDNN's grid
# sampler, which ``grid_sample`` calls on CUDA for bilinear, zero-padded, corner-aligned 2-d sampling
# (aten/src/ATen/native/GridSampler.cpp, ``grid_sampler``); the fused GRU cell ``nn.GRUCell`` runs
# on CUDA (aten/src/ATen/native/RNN.cpp); backward kernels whose gradient has the input's shape
_META = {
    "_transform_bias_rescale_qkv": _transform_bias_rescale_qkv_meta,
    "_masked_softmax": _masked_softmax_meta,
    "cudnn_grid_sampler": _cudnn_grid_sampler_meta,
    "cudnn_grid_sampler_backward": _cudnn_grid_sampler_backward_meta,
    "_thnn_fused_gru_cell": _fused_gru_cell_meta,
    "_thnn_fused_gru_cell_backward": _fused_gru_cell_backward_meta,
    "_cudnn_ctc_loss": _cudnn_ctc_loss_meta,
    "_cudnn_ctc_loss.Tensor": _cudnn_ctc_loss_meta,
    "multi_margin_loss_backward": input_gradient_meta,
    "multilabel_margin_loss_backward": input_gradient_meta,
    "fractional_max_pool3d_backward": input_gradient_meta,
}


_USE_MIOPEN_CTC = getattr(aten, "_use_miopen_ctc_loss", None)  # asked by ctc_loss on CUDA (newer releases)

RNN_MODES = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}  # cuDNN's modes
_GATES = {0: 1, 1: 1, 2: 4, 3: 3}
RESERVE_ALIGNMENT = 256


def recurrent(stock: Any, mode: int) -> Any:
    """``torch._VF.lstm`` (and its kin) as CUDA runs them on fake CUDA tensors: ``aten._cudnn_rnn``."""

    def run(input: torch.Tensor, *args: Any) -> Any:
        if input.device.type != "cuda":
            return stock(input, *args)
        if isinstance(args[0], torch.Tensor) and args[0].dim() == 1:
            # a packed sequence: its batch sizes (a CPU tensor of known numbers, engine/values.py) first
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
    per_step = directions * (layers * (_GATES[mode] + (1 if mode == 2 else 0)) + (layers - 1)) * hidden
    return seq * batch * per_step * element + RESERVE_ALIGNMENT


class CudaOps(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """CUDA's ops that fake tensors cannot run as the GPU would (fake tensors only): ``aten._cudnn_rnn``
    and its backward, with the outputs cuDNN makes; the fused LSTM cell; the choice of CTC's kernel
    (``_use_cudnn_ctc_loss``, which reads the lengths' values: ``values`` gives those the run knows).

    The backward node clones the reserve unless the engine has told it that its saved
    tensors will be released (``will_release_variables``, which the Python backward pass
    cannot call): that clone of a reserve is answered with the reserve itself.
    """

    def __init__(self, values: Callable[[torch.Tensor], torch.Tensor | None] = lambda t: None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._reserves: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._values = values

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
        if func is aten._thnn_fused_lstm_cell.default:
            # nn.LSTMCell's fused kernel (RNN.cu): hy, cy and the activated gates, kept for the
            # backward pass (PyTorch's meta kernel fails for a cell without biases)
            input_gates, cx = args[0], args[2]
            return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (cx, cx, input_gates))
        if func.overloadpacket is aten._use_cudnn_ctc_loss:
            return self._cudnn_ctc(func, *args, **kwargs)
        if func.overloadpacket is _USE_MIOPEN_CTC:
            return False  # ROCm's kernel: never on an NVIDIA GPU
        return func(*args, **kwargs)

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
