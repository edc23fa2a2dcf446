"""Serving budgets for a language model: a prefill and one decode step, as an H100 would run them.

A team serving a Llama-style 7B model in bf16 keeps, next to its model code, what one request costs on
its GPU: the prefill of a prompt (time to first token) and one decode step with the prompt's keys and
values in the cache (time per output token, tokens per second for the batch), and the peak memory of
each with its cache. Both run analytically on this CPU-only machine (nothing is allocated); their
budgets (budgets/test_serving.toml) hold ``max_predicted_ms = { h100 = ... }`` and the peaks.
"""

from __future__ import annotations

import dataclasses

import torch

from examples.llama import KVCache, Llama, LlamaConfig

BATCH, PROMPT = 8, 2048
CONFIG = dataclasses.replace(LlamaConfig.llama_7b(), max_seq=PROMPT + 1)


def llama_7b_bf16() -> Llama:
    with torch.device("meta"):
        return Llama(CONFIG).to(torch.bfloat16)


def test_llama_7b_prefill_on_an_h100(model_profile):
    model = llama_7b_bf16()
    prompt = torch.randint(0, CONFIG.vocab_size, (BATCH, PROMPT))
    cache = KVCache.empty(CONFIG, BATCH, torch.bfloat16)
    result = model_profile(model, (prompt, cache), target="h100", name="llama-7b prefill, batch 8 x 2048 tokens")
    assert result.fits
    assert cache.tokens() == 0  # the run filled its own copy of the cache, not this one


def test_llama_7b_decode_step_on_an_h100(model_profile):
    model = llama_7b_bf16()
    token = torch.randint(0, CONFIG.vocab_size, (BATCH, 1))
    cache = KVCache.filled(CONFIG, BATCH, PROMPT, torch.bfloat16)
    result = model_profile(model, (token, cache), target="h100", name="llama-7b decode step, batch 8, 2048 cached")
    cache_bytes = 2 * CONFIG.layers * BATCH * PROMPT * CONFIG.kv_heads * CONFIG.head_dim * 2  # keys and values, bf16
    assert result.memory.kv_cache_bytes == cache_bytes
    tokens_per_second = BATCH / result.predicted.seconds
    print(f"decode step on an H100: {result.predicted.seconds * 1e3:.2f} ms, {tokens_per_second:,.0f} tokens/s for the batch")
    # decoding is bound by reading the weights and the cache once per step: at least their bytes over the bandwidth
    weights = 2 * sum(p.numel() for p in model.parameters())
    assert result.predicted.seconds > (weights + cache_bytes) / 3.35e12
