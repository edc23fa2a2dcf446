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
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

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


class CudaKernels:
    """While a fake CUDA-target run steps (a context manager): the choices above, as ``gpu`` would make them.

    ``scaled_dot_product_attention`` makes its choice inside one C++ function, without a
    dispatched op to answer; so ``torch.nn.functional.scaled_dot_product_attention`` is
    replaced for the run (code that took its own reference to it at import time keeps the
    stock one) by :meth:`attention`, which does what that function does for the chosen
    backend: cast to autocast's dtype (it is on autocast's lower-precision list), call the
    backend's op (whose autograd formula runs its backward kernel), return its output.
    """

    def __init__(self, gpu: GPUSpec) -> None:
        self.gpu = gpu

    def __enter__(self) -> CudaKernels:
        self._stock = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = self.attention
        return self

    def __exit__(self, *exc: object) -> None:
        F.scaled_dot_product_attention = self._stock

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
