"""Calls CUDA answers with kernels of its own choosing, caught where they are made: a TorchFunctionMode
for ``scaled_dot_product_attention`` and the fused inference ops, and ``has_torch_function`` answered
as a run of plain CUDA tensors answers it.

The fused inference paths of ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``
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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode

from ...targets.gpus import GPUSpec
from ..backward import HookGuard
from .attention import CUDNN, EFFICIENT, FLASH, sdp_backend

aten = torch.ops.aten


class CudaFunctions(TorchFunctionMode):
    """Calls CUDA answers with kernels of its own choosing: ``scaled_dot_product_attention`` through a
    reference taken at import time (answered by ``attention``), and the fused inference ops of the
    transformer modules (by ``fused``)."""

    def __init__(self, attention: Callable[..., torch.Tensor], fused: FusedPaths) -> None:
        super().__init__()
        self.calls: dict[Any, Callable[..., Any]] = {
            _STOCK_SDPA: attention,
            torch._native_multi_head_attention: fused.multi_head_attention,
            torch._transformer_encoder_layer_fwd: fused.encoder_layer,
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
_ENGINE_MODES = (CudaFunctions, HookGuard)


class FusedPaths:
    """The fused inference ops of the transformer modules as their CUDA kernels run them on ``gpu`` (see
    the module's notes), with ``attention`` for ``scaled_dot_product_attention`` as it runs there."""

    def __init__(self, gpu: GPUSpec, attention: Callable[..., torch.Tensor]) -> None:
        self.gpu = gpu
        self.attention = attention

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
