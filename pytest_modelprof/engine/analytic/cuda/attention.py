"""The attention backend PyTorch chooses on a target GPU, and its call.

The backend of ``scaled_dot_product_attention`` (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp):
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

The capability ranges below are PyTorch's rules for its kernels (sdp_utils.cpp), not facts of the
GPUs (those are in :mod:`...targets.gpus`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ...targets import cudnn
from ...targets.gpus import GPUSpec

MATH, FLASH, EFFICIENT, CUDNN = 0, 1, 2, 3  # torch.nn.attention.SDPBackend's values
aten = torch.ops.aten
_HALF = (torch.float16, torch.bfloat16)
_DEFAULT_ORDER = [FLASH, EFFICIENT, MATH, CUDNN]

# the compute capabilities (first, last) each fused backend runs on
FLASH_CAPABILITIES = ((8, 0), (12, 1))
EFFICIENT_CAPABILITIES = ((5, 0), (12, 1))
CUDNN_CAPABILITIES = ((8, 0), (12, 1))
# flash attention's backward on these takes no heads in (192, 224], nor over 224 with dropout
FLASH_NARROW_BACKWARD = (((8, 6), (8, 9)), ((12, 0), (12, 1)))
# cuDNN attention comes first on these major versions (of CUDA 12 builds: on these minor ones only),
# from this cuDNN on (check_prefer_cudnn_attention)
CUDNN_FIRST_MAJORS = (9, 10)
CUDNN_FIRST_MINORS_CUDA_12 = (0, 3)
CUDNN_FIRST_AFTER = 91500


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
    return major in CUDNN_FIRST_MAJORS and (any_minor or minor in CUDNN_FIRST_MINORS_CUDA_12) and _cudnn_version() > CUDNN_FIRST_AFTER


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


def _within(gpu: GPUSpec, span: tuple[tuple[int, int], tuple[int, int]]) -> bool:
    """Whether ``gpu``'s compute capability lies in ``span`` (first, last), both included."""
    return span[0] <= gpu.compute_capability <= span[1]


def _fits_flash(gpu: GPUSpec, call: _Call) -> bool:
    """``can_use_flash_attention``: half precision from sm_80, no mask, one head size up to 256 for q, k
    and v (``scaled_dot_product_attention`` pads it to a multiple of 8), is_causal only for square score
    matrices; for training on sm_86, sm_89 and sm_12x no heads in (192, 224], nor over 224 with dropout."""
    q, k, v = call.tensors
    head = q.shape[-1]
    if not (call.dense_4d() and call.mask is None and _within(gpu, FLASH_CAPABILITIES) and q.dtype in _HALF):
        return False
    if not (head == k.shape[-1] == v.shape[-1] and head <= 256):
        return False
    if call.causal and q.shape[2] != k.shape[2]:  # check_flash_causal_non_square_seqlens
        return False
    if call.requires_grad and any(_within(gpu, span) for span in FLASH_NARROW_BACKWARD):
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
    if not (call.dense_4d() and _within(gpu, EFFICIENT_CAPABILITIES)):
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
    if not (call.dense_4d() and _within(gpu, CUDNN_CAPABILITIES) and q.dtype in _HALF):
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


def scaled_dot_product_attention(
    gpu: GPUSpec,
    stock: Callable[..., torch.Tensor],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` as it runs on ``gpu``: the backend
    :func:`sdp_backend` chooses, called as that function calls it (autocast's cast, the boolean mask
    made additive, flash attention's heads padded, memory-efficient attention's mask aligned);
    ``stock``, the function itself, for the math backend (and where none takes the call)."""
    if torch.is_autocast_enabled("cuda") and query.is_floating_point():
        dtype = torch.get_autocast_dtype("cuda")
        query, key, value = (t.to(dtype) if t.dtype == torch.float32 else t for t in (query, key, value))
        if attn_mask is not None and attn_mask.dtype == torch.float32:  # autocast casts every fp32 argument
            attn_mask = attn_mask.to(dtype)
    backend = sdp_backend(gpu, query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    # the row log-sum-exps a backward pass needs, also for a mask that needs a gradient
    # (attention.cpp's should_compute_logsumexp)
    logsumexp = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (query, key, value, attn_mask))
    if backend in (MATH, -1):
        return stock(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    # attention.cpp's scaled_dot_product_attention: a boolean mask becomes an additive one
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.where(attn_mask, 0.0, torch.scalar_tensor(float("-inf"), dtype=query.dtype, device=query.device))
    if backend == CUDNN:
        out = aten._scaled_dot_product_cudnn_attention(query, key, value, attn_mask, logsumexp, dropout_p, is_causal, False, scale=scale)
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
