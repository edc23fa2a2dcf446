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
  constraints the call meets. On compute capability 9.x and 10.x cuDNN comes first (from
  cuDNN 9.15.1, unless ``TORCH_CUDNN_SDPA_DEPRIORITIZED`` is set; measured: torch 2.11 on an
  H100 runs cuDNN attention for bfloat16 heads of 64, with and without dropout). The
  constraints are those of the PyTorch release that runs, where a release changed them
  (:data:`TORCH_RELEASE`), and of the cuDNN it loads. What the chosen backend's path in
  ``scaled_dot_product_attention`` does around its op is done too: flash attention's heads
  padded to a multiple of 8, memory-efficient attention's mask padded to rows of 8
  elements when its strides are not.
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
import math
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

from ...targets import cudnn
from ...targets.gpus import GPUSpec
from ...targets.scratch import threads_per_sm
from ..backward import HookGuard, in_backward
from ..fake import input_gradient_meta, meta_kernels

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
    call = _Call(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    for backend in order:
        if enabled[backend] and (backend == MATH or _FITS[backend](gpu, call)):
            return backend
    return -1  # SDPBackend.ERROR: PyTorch raises "No available kernel"


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _cudnn_version() -> int:
    """The cuDNN that PyTorch here loads (its CUDA wheels bring their own); a build without cuDNN is taken
    to run on the cuDNN of PyTorch's current CUDA wheels."""
    library = cudnn.library()
    if library is not None:  # the library loaded, which PyTorch's check may refuse (another build's)
        return library.version
    try:
        version = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
    except Exception:  # a build that cannot load it
        version = None
    return int(version) if version else _RECENT_CUDNN


_RECENT_CUDNN = 92400  # cuDNN 9.24, what torch 2.14's CUDA 13 wheels load
# the PyTorch release whose choice is followed: rules added in a release apply from it on
TORCH_RELEASE = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


def _prefers_cudnn(gpu: GPUSpec) -> bool:
    """``check_prefer_cudnn_attention``: cuDNN first on compute capability 9.x and 10.x (of CUDA 12 builds:
    x.0 and x.3 only) from cuDNN 9.15.1 on, unless ``TORCH_CUDNN_SDPA_DEPRIORITIZED`` is set (or, as
    older releases read it, ``TORCH_CUDNN_SDPA_PREFERRED=0``)."""
    if _env_true("TORCH_CUDNN_SDPA_DEPRIORITIZED") or os.environ.get("TORCH_CUDNN_SDPA_PREFERRED", "1").strip() == "0":
        return False
    major, minor = gpu.compute_capability
    cuda = torch.version.cuda or "13.0"
    any_minor = int(cuda.split(".")[0]) >= 13
    return major in (9, 10) and (any_minor or minor in (0, 3)) and _cudnn_version() > 91500


class _Call:
    """One ``scaled_dot_product_attention`` call's arguments, as sdp_utils.cpp's ``sdp_params`` holds them."""

    def __init__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        dropout: float,
        causal: bool,
        gqa: bool,
    ) -> None:
        self.query, self.key, self.value, self.mask = query, key, value, mask
        self.dropout, self.causal, self.gqa = dropout, causal, gqa
        self.tensors = (query, key, value)
        # input_requires_grad: what the backward pass will need
        self.requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in self.tensors)

    def dense_4d(self) -> bool:
        """check_tensor_shapes and check_nonzero_sequence_lengths_dense (nested inputs are not run here)."""
        if any(t.dim() != 4 or t.is_nested for t in self.tensors) or len({t.dtype for t in self.tensors}) != 1:
            return False
        return self.query.shape[2] != 0 and self.key.shape[2] != 0

    def last_strides_one(self, singleton_exempt: bool) -> bool:
        """check_last_dim_stride_equals_1_dense: q, k and v (and on the GPU the mask) contiguous in their last
        dimension; flash and cuDNN let a last dimension of size 1 have any stride."""
        if not all(t.stride(-1) == 1 for t in self.tensors) and not (singleton_exempt and self.query.shape[-1] == 1):
            return False
        return self.mask is None or self.mask.stride(-1) == 1

    def heads_fit(self, gqa: bool, same_kv_heads: bool) -> bool:
        """check_batch_size_and_num_heads_dense: one batch size; the same heads, or, for a backend that takes
        grouped-query attention and a call that asks for it, key and value heads dividing the query's."""
        q, k, v = self.tensors
        if not q.shape[0] == k.shape[0] == v.shape[0]:
            return False
        if gqa and self.gqa:
            if same_kv_heads and k.shape[1] != v.shape[1]:
                return False
            return q.shape[1] % k.shape[1] == 0 and q.shape[1] % v.shape[1] == 0
        return q.shape[1] == k.shape[1] == v.shape[1]


def _fits_flash(gpu: GPUSpec, call: _Call) -> bool:
    """``can_use_flash_attention``: half precision from sm_80, no mask, one head size up to 256 for q, k
    and v (``scaled_dot_product_attention`` pads it to a multiple of 8), is_causal only for square score
    matrices; for training on sm_86, sm_89 and sm_12x no heads in (192, 224], nor over 224 with dropout."""
    q, k, v = call.tensors
    head = q.shape[-1]
    if not (call.dense_4d() and call.mask is None and (8, 0) <= gpu.compute_capability <= (12, 1) and q.dtype in _HALF):
        return False
    if not (head == k.shape[-1] == v.shape[-1] and head <= 256):
        return False
    if call.causal and q.shape[2] != k.shape[2]:  # check_flash_causal_non_square_seqlens
        return False
    if call.requires_grad and ((8, 6) <= gpu.compute_capability <= (8, 9) or (12, 0) <= gpu.compute_capability <= (12, 1)):
        if not (head <= 192 or (call.dropout == 0 and head > 224)):
            return False
    return call.heads_fit(gqa=True, same_kv_heads=True) and call.last_strides_one(singleton_exempt=True)


def _gemm_alignment(gpu: GPUSpec, dtype: torch.dtype) -> int:
    """sdp_utils.cpp's ``minimum_gemm_alignment``: elements per row the CUTLASS kernels' tiles need."""
    half = dtype in _HALF
    tensor_cores = gpu.compute_capability >= (8, 0) or (gpu.compute_capability >= (7, 0) and half)
    alignment = 4 if gpu.compute_capability >= (8, 0) else 1
    return max(alignment, 128 // (16 if half else 32)) if tensor_cores else alignment


def _fits_efficient(gpu: GPUSpec, call: _Call) -> bool:
    """``can_use_mem_efficient_attention``: fp16 and fp32 from sm_50, bf16 from sm_80; q and k of one head
    size, head sizes and storage offsets aligned to the kernel's tiles; no grouped-query attention."""
    q, k, v = call.tensors
    dtype = q.dtype
    if not (call.dense_4d() and (5, 0) <= gpu.compute_capability <= (12, 1)):
        return False
    if dtype not in (torch.float16, torch.float32) and not (dtype == torch.bfloat16 and gpu.compute_capability >= (8, 0)):
        return False
    alignment = _gemm_alignment(gpu, dtype)
    if q.shape[-1] != k.shape[-1] or q.shape[-1] % alignment or v.shape[-1] % alignment or not q.shape[-1] or not v.shape[-1]:
        return False
    # check_data_ptr_alignment_mem_efficient: the allocator aligns a storage's start, the offset must keep it
    if gpu.compute_capability >= (8, 0) and any(t.numel() and t.storage_offset() % alignment for t in call.tensors):
        return False
    return call.last_strides_one(singleton_exempt=False) and call.heads_fit(gqa=False, same_kv_heads=True)


def _fits_cudnn(gpu: GPUSpec, call: _Call) -> bool:
    """``can_use_cudnn_attention``: half precision from sm_80; a mask of 2 or 4 dimensions that broadcasts
    to the scores and needs no gradient (its op takes none: ``check_attn_mask_shape``); grouped-query
    attention; heads a multiple of 8 up to 128 (256 on sm_90 and sm_10x from cuDNN 9.23, whose backward
    takes 256 only with values of 256); no key sequence of one; dropout in steps of 1/16 (from PyTorch
    2.12); not in deterministic mode."""
    q, k, v = call.tensors
    cudnn = _cudnn_version()
    if not (call.dense_4d() and (8, 0) <= gpu.compute_capability <= (12, 1) and q.dtype in _HALF):
        return False
    if torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled():
        return False
    if call.dropout > 0 and 91100 < cudnn < 91400:
        return False
    # check_cudnn_dropout (PyTorch 2.12 on; torch 2.11 on an H100 ran cuDNN attention with dropout 0.1)
    if TORCH_RELEASE >= (2, 12) and call.dropout * 16 != math.floor(call.dropout * 16):
        return False
    if call.mask is not None and not _cudnn_mask_shape(call):
        return False
    if max(q.shape[0], q.shape[1]) > 65535:
        return False
    d_qk, d_v = q.shape[-1], v.shape[-1]
    major, minor = gpu.compute_capability
    hopper_or_blackwell = (major, minor) == (9, 0) or major == 10
    d256 = hopper_or_blackwell and cudnn > 92200 and not ((major, minor) == (10, 7) and cudnn <= 92500)
    deepseek = hopper_or_blackwell and cudnn >= 91100 and (d_qk, d_v) == (192, 128)  # cuDNN's special case
    limit = 256 if d256 else 192 if deepseek else 128
    if max(d_qk, d_v) > limit or d_qk % 8 or d_v % 8:
        return False
    if k.shape[2] == 1 or (call.dropout and q.shape[2] == 1):
        return False
    if d256 and call.requires_grad and not (max(d_qk, d_v) <= 128 or (d_qk, d_v) in ((192, 128), (256, 256))):
        return False  # check_cudnn_d256_bprop_head_dim
    return call.last_strides_one(singleton_exempt=True) and call.heads_fit(gqa=True, same_kv_heads=False)


def _cudnn_mask_shape(call: _Call) -> bool:
    mask = call.mask
    assert mask is not None
    if mask.requires_grad:
        return False
    batch, heads, q_len = call.query.shape[:3]
    if mask.shape[-2] not in (q_len, 1) or mask.shape[-1] not in (call.key.shape[2], 1):
        return False
    return mask.dim() == 2 or (mask.dim() == 4 and mask.shape[0] in (1, batch) and mask.shape[1] in (1, heads))


_FITS = {FLASH: _fits_flash, EFFICIENT: _fits_efficient, CUDNN: _fits_cudnn}


def _pad_last(tensor: torch.Tensor, multiple: int) -> torch.Tensor:
    """attention.cpp's ``pad_last_dim``: zeros appended to the last dimension up to ``multiple``."""
    size = tensor.shape[-1]
    return tensor if size % multiple == 0 else F.pad(tensor, (0, multiple - size % multiple))


def _aligned(tensor: torch.Tensor, alignment: int) -> bool:
    """attention.cpp's ``aligned_tensor``: every stride but the last a multiple of ``alignment``, the last 1."""
    return all(stride % alignment == 0 for stride in tensor.stride()[:-1]) and tensor.stride(-1) == 1


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
        if backend in (MATH, -1):
            return self._stock(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        # attention.cpp's scaled_dot_product_attention: a boolean mask becomes an additive one
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.where(attn_mask, 0.0, torch.scalar_tensor(float("-inf"), dtype=query.dtype, device=query.device))
        if backend == CUDNN:
            out = aten._scaled_dot_product_cudnn_attention(
                query, key, value, attn_mask, logsumexp, dropout_p, is_causal, False, scale=scale
            )
            return out[0]  # type: ignore[no-any-return]
        if backend == FLASH:
            # heads padded to a multiple of 8, scaled by their own size, the output's padding sliced off
            head = query.shape[-1]
            scale = scale if scale is not None else 1 / math.sqrt(head)
            query, key, value = (_pad_last(t, 8) for t in (query, key, value))
            out = aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)
            return out[0][..., :head] if head % 8 else out[0]  # type: ignore[no-any-return]
        if attn_mask is not None:  # preprocess_mask: rows aligned to 8 elements, broadcast to the scores
            if not _aligned(attn_mask, 8):
                size = attn_mask.shape[-1]
                attn_mask = F.pad(attn_mask, (0, 8 - size % 8))[..., :size]
            attn_mask = attn_mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        out = aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, logsumexp, dropout_p, is_causal, scale=scale)
        return out[0]  # type: ignore[no-any-return]

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
