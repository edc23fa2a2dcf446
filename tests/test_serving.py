"""A language model's decode step with a KV cache (examples/llama.py), against hand formulas, in real,
meta and target runs; and a 7B model with a 32k-token cache, analytically."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from examples.llama import KVCache, Llama, LlamaConfig
from pytest_modelprof import profile

CONFIG = dataclasses.replace(LlamaConfig.tiny(), max_seq=128)  # hidden 64, 4 heads of 16, 2 key/value heads, 2 layers
BATCH, CACHED = 2, 40


def _attention_macs(result) -> int:
    return sum(row.macs for row in result.ops if "attention" in row.op)


@pytest.mark.parametrize("where", [{}, {"device": "meta"}, {"target": "h100"}])
def test_a_decode_step_attends_to_every_cached_token(where):
    torch.manual_seed(0)
    model = Llama(CONFIG)
    cache = KVCache.filled(CONFIG, BATCH, CACHED)
    result = profile(model, (torch.randint(0, CONFIG.vocab_size, (BATCH, 1)), cache), **where)
    c, context = CONFIG, CACHED + 1  # the cached tokens and the new one
    # per layer: Q K^T and P V for one query per head over the whole context, 4 x B x heads x context x head_dim FLOPs
    assert 2 * _attention_macs(result) == c.layers * 4 * BATCH * c.heads * context * c.head_dim
    projections = c.hidden * (c.heads + 2 * c.kv_heads + c.heads) * c.head_dim + 3 * c.hidden * c.intermediate
    assert result.macs - _attention_macs(result) == BATCH * (c.layers * projections + c.hidden * c.vocab_size)
    cache_bytes = 2 * c.layers * BATCH * CACHED * c.kv_heads * c.head_dim * 4
    assert result.memory.kv_cache_bytes == cache_bytes
    assert cache.tokens() == CACHED  # the caller's cache is as it was


def test_a_prefill_fills_the_runs_cache_causally():
    model = Llama(CONFIG)
    prompt = torch.randint(0, CONFIG.vocab_size, (BATCH, 24))
    with_cache = profile(model, (prompt, KVCache.empty(CONFIG, BATCH)), device="meta")
    without = profile(model, prompt, device="meta")
    assert with_cache.macs == without.macs  # the same causal attention over the prompt
    assert with_cache.memory.kv_cache_bytes == 0


def test_a_7b_decode_step_with_a_32k_token_cache_runs_analytically():
    config = dataclasses.replace(LlamaConfig.llama_7b(), max_seq=32 * 1024 + 1)
    with torch.device("meta"):
        model = Llama(config).to(torch.bfloat16)
        cache = KVCache.filled(config, 1, 32 * 1024, torch.bfloat16)
    result = profile(model, (torch.randint(0, 32000, (1, 1)), cache), device="meta")
    assert result.memory.kv_cache_bytes == 2 * 32 * 32 * 1024 * 4096 * 2  # 16 GiB of keys and values
    assert 2 * _attention_macs(result) == 32 * 4 * 32 * (32 * 1024 + 1) * 128


def test_each_timed_step_starts_from_the_cache_as_given():
    model = Llama(CONFIG)
    cache = KVCache.filled(CONFIG, BATCH, CACHED)
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(args[1].tokens()))
    profile(model, (torch.randint(0, CONFIG.vocab_size, (BATCH, 1)), cache), latency=True)
    assert len(seen) > 3 and set(seen) == {CACHED}  # the metered step, the warm-up and every timed one
    assert cache.tokens() == CACHED


def test_the_memory_report_says_how_much_of_the_inputs_is_the_kv_cache():
    from pytest_modelprof.report import format_memory_report

    result = profile(Llama(CONFIG), (torch.randint(0, CONFIG.vocab_size, (BATCH, 1)), KVCache.filled(CONFIG, BATCH, CACHED)), device="meta")
    cache_bytes = 2 * CONFIG.layers * BATCH * CACHED * CONFIG.kv_heads * CONFIG.head_dim * 4
    (line,) = [line for line in format_memory_report(result).splitlines() if "KV cache" in line]
    assert f"KV cache: {cache_bytes / 1e3:.2f} kB" in line, line  # 40 960 bytes
