"""A Llama-style decoder built from plain torch modules, for analytic profiling.

``LlamaConfig.llama_7b()`` has the 7B shape (hidden 4096, 32 layers, 32 heads,
SwiGLU MLP of 11008, vocabulary 32000). Build it on the meta device, where it costs
no memory, and profile it with ``device="meta"``::

    with torch.device("meta"):
        model = Llama(LlamaConfig.llama_7b())
    result = profile(model, torch.randint(0, 32000, (1, 2048)), device="meta", train=True)

For serving, ``model(tokens, cache)`` takes a :class:`KVCache`: a prefill fills an empty one, and each
decode step attends to it and appends its token's keys and values (see examples/test_serving.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 32000
    hidden: int = 4096
    layers: int = 32
    heads: int = 32
    kv_heads: int = 32
    intermediate: int = 11008
    max_seq: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @classmethod
    def llama_7b(cls) -> LlamaConfig:
        return cls()

    @classmethod
    def llama_70b(cls) -> LlamaConfig:
        """The 70B shape: hidden 8192, 80 layers, 64 heads sharing 8 key/value heads, SwiGLU MLP of 28672."""
        return cls(hidden=8192, layers=80, heads=64, kv_heads=8, intermediate=28672)

    @classmethod
    def tiny(cls) -> LlamaConfig:
        return cls(vocab_size=128, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=160, max_seq=64)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class KVCache:
    """Each layer's keys and values so far, ``(batch, kv_heads, tokens, head_dim)``, grown by each call (as a
    Hugging Face ``DynamicCache`` is)."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.layers = layers

    @classmethod
    def empty(
        cls, config: LlamaConfig, batch: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> KVCache:
        return cls.filled(config, batch, 0, dtype, device)

    @classmethod
    def filled(
        cls, config: LlamaConfig, batch: int, tokens: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> KVCache:
        """A cache holding ``tokens`` tokens already (their values do not matter to a profile)."""
        shape = (batch, config.kv_heads, tokens, config.head_dim)
        return cls(
            [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)) for _ in range(config.layers)]
        )

    def tokens(self, layer: int = 0) -> int:
        """How many tokens ``layer`` holds."""
        return self.layers[layer][0].shape[-2]

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append one call's keys and values to ``layer``'s; all of them."""
        old_keys, old_values = self.layers[layer]
        self.layers[layer] = (torch.cat((old_keys, keys), dim=-2), torch.cat((old_values, values), dim=-2))
        return self.layers[layer]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class RotaryEmbedding(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        inverse = 1.0 / (config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim))
        angles = torch.outer(torch.arange(config.max_seq, dtype=torch.float32), inverse)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        seq = q.shape[-2]
        cos, sin = self.cos[start : start + seq].to(q.dtype), self.sin[start : start + seq].to(q.dtype)  # bf16 weights keep q in bf16
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, index: int = 0) -> None:
        super().__init__()
        self.config = config
        self.index = index  # its layer's place in a KVCache
        self.q_proj = nn.Linear(config.hidden, config.heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden, config.kv_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden, config.kv_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.heads * config.head_dim, config.hidden, bias=False)
        self.rotary = RotaryEmbedding(config)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        batch, seq, _ = x.shape
        c = self.config
        past = cache.tokens(self.index) if cache is not None else 0
        q = self.q_proj(x).view(batch, seq, c.heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, c.kv_heads, c.head_dim).transpose(1, 2)
        q, k = self.rotary(q, k, start=past)
        if cache is not None:
            k, v = cache.update(self.index, k, v)
        if c.kv_heads != c.heads:
            k = k.repeat_interleave(c.heads // c.kv_heads, dim=1)
            v = v.repeat_interleave(c.heads // c.kv_heads, dim=1)
        # a prefill is causal; one decoded token attends to every cached one
        y = F.scaled_dot_product_attention(q, k, v, is_causal=seq > 1)
        return self.o_proj(y.transpose(1, 2).reshape(batch, seq, c.hidden))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.up_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.down_proj = nn.Linear(config.intermediate, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, index: int = 0) -> None:
        super().__init__()
        self.input_norm = nn.RMSNorm(config.hidden, eps=config.norm_eps)
        self.attention = Attention(config, index)
        self.post_attention_norm = nn.RMSNorm(config.hidden, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        x = x + self.attention(self.input_norm(x), cache)
        return x + self.mlp(self.post_attention_norm(x))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden)
        self.layers = nn.ModuleList(DecoderLayer(config, index) for index in range(config.layers))
        self.norm = nn.RMSNorm(config.hidden, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cache)
        return self.lm_head(self.norm(x))
