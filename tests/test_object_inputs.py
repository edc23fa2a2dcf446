"""Inputs that hold tensors inside objects: KV caches shaped like Hugging Face's, dataclasses, named tuples,
a BlockMask, nested lists and dicts. Their tensors become the run's (copies, fake, or fake on a CUDA target),
count under the ``inputs`` category, and those of a KV cache give ``kv_cache_bytes``."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from typing import NamedTuple

import pytest
import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask

from pytest_modelprof import Profile, profile

LAYERS, BATCH, CONTEXT, HEADS, KV_HEADS, HEAD_DIM = 2, 2, 128, 4, 2, 16
WIDTH = HEADS * HEAD_DIM
FLOAT = 4  # bytes of a float32 element
# one decode step's hidden state: BATCH x 1 x WIDTH floats, 512 bytes (one CUDA allocation block)
STEP_BYTES = BATCH * 1 * WIDTH * FLOAT
# keys and values of every layer: 2 x layers x B x context x kv_heads x head_dim x element size
CACHE_BYTES = 2 * LAYERS * BATCH * CONTEXT * KV_HEADS * HEAD_DIM * FLOAT
BLOCK = 512  # the CUDA caching allocator's block: a target's allocations are rounded up to it

# a real run on the CPU, an analytic one on fake CPU tensors, an analytic one for an H100 (fake CUDA tensors)
MODES = [{}, {"device": "meta"}, {"target": "h100"}]
MODE_IDS = ["real", "meta", "h100"]


class DynamicLayer:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values


class DynamicCache:
    """Shaped like Hugging Face's: a list of layers, each holding its keys and values, grown by concatenation."""

    def __init__(self, layers: list[DynamicLayer]) -> None:
        self.layers = layers

    def update(self, keys: torch.Tensor, values: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.layers[index]
        layer.keys = torch.cat([layer.keys, keys], dim=-2)
        layer.values = torch.cat([layer.values, values], dim=-2)
        return layer.keys, layer.values


class StaticLayer:
    """Preallocated to ``length`` positions, written in place at the count so far; like Hugging Face's, it makes its
    positions on the device it records."""

    def __init__(self, length: int, filled: int) -> None:
        self.keys = torch.randn(BATCH, KV_HEADS, length, HEAD_DIM)
        self.values = torch.randn(BATCH, KV_HEADS, length, HEAD_DIM)
        self.filled = torch.tensor(filled)
        self.device = self.keys.device


class StaticCache:
    def __init__(self, layers: list[StaticLayer]) -> None:
        self.layers = layers

    def update(self, keys: torch.Tensor, values: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.layers[index]
        positions = torch.arange(keys.shape[-2], device=layer.device) + layer.filled
        layer.keys.index_copy_(2, positions, keys)
        layer.values.index_copy_(2, positions, values)
        layer.filled.add_(keys.shape[-2])
        return layer.keys, layer.values


class SlidingWindowCache(DynamicCache):
    """Keeps the last ``window`` positions: its keys and values are views of part of a longer tensor, as after
    Hugging Face's sliding-window layers trim theirs."""

    def __init__(self, window: int) -> None:
        super().__init__(
            [DynamicLayer(*(torch.randn(BATCH, KV_HEADS, CONTEXT, HEAD_DIM)[:, :, -window:] for _ in "kv")) for _ in range(LAYERS)]
        )


class Attention(nn.Module):
    """Grouped-query attention of one layer over its cache."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        self.q = nn.Linear(WIDTH, WIDTH, bias=False)
        self.kv = nn.Linear(WIDTH, 2 * KV_HEADS * HEAD_DIM, bias=False)

    def forward(self, x: torch.Tensor, cache: DynamicCache | StaticCache) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q = self.q(x).view(batch, tokens, HEADS, HEAD_DIM).transpose(1, 2)
        k, v = self.kv(x).view(batch, tokens, 2, KV_HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        k, v = cache.update(k, v, self.index)
        out = nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return out.transpose(1, 2).reshape(batch, tokens, WIDTH)


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Attention(i) for i in range(LAYERS))

    def forward(self, x: torch.Tensor, past_key_values: DynamicCache | StaticCache) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, past_key_values)
        return x


def dynamic_cache() -> DynamicCache:
    return DynamicCache(
        [
            DynamicLayer(torch.randn(BATCH, KV_HEADS, CONTEXT, HEAD_DIM), torch.randn(BATCH, KV_HEADS, CONTEXT, HEAD_DIM))
            for _ in range(LAYERS)
        ]
    )


def decode(cache: DynamicCache | StaticCache, **options: object) -> Profile:
    """One decode step (one new token) over ``cache``."""
    return profile(Decoder(), ((torch.randn(BATCH, 1, WIDTH),), {"past_key_values": cache}), **options)


def rounded(nbytes: int, options: dict[str, str]) -> int:
    return -(-nbytes // BLOCK) * BLOCK if "target" in options else nbytes


@pytest.mark.parametrize("options", MODES, ids=MODE_IDS)
def test_a_dynamic_cache_counts_under_inputs_and_as_the_kv_cache(options):
    memory = decode(dynamic_cache(), **options).memory
    assert memory is not None
    assert memory.kv_cache_bytes == CACHE_BYTES == 131072
    assert memory.category_max["inputs"] == CACHE_BYTES + STEP_BYTES


@pytest.mark.parametrize("options", MODES, ids=MODE_IDS)
def test_the_keys_a_cache_replaces_are_freed_as_the_step_goes(options):
    # each layer's keys and values are replaced by their concatenation with the new token's: the old ones go,
    # as in a serving loop, and what stays of the inputs after the last layer is the hidden state
    memory = decode(dynamic_cache(), **options).memory
    assert memory is not None
    inputs = memory.categories.index("inputs")
    assert memory.timeline[0][1][inputs] == CACHE_BYTES + STEP_BYTES
    assert memory.timeline[-1][1][inputs] == STEP_BYTES


@pytest.mark.parametrize("options", MODES[1:], ids=MODE_IDS[1:])
def test_a_cache_of_meta_tensors_counts_and_frees_as_one_of_real_tensors(options):
    # a large model's cache is made on the meta device, as its weights are: the run's copy is its own all the same
    cache = DynamicCache(
        [DynamicLayer(*(torch.empty(BATCH, KV_HEADS, CONTEXT, HEAD_DIM, device="meta") for _ in "kv")) for _ in range(LAYERS)]
    )
    memory = decode(cache, **options).memory
    assert memory is not None and memory.kv_cache_bytes == CACHE_BYTES
    inputs = memory.categories.index("inputs")
    assert memory.timeline[-1][1][inputs] == STEP_BYTES


def test_a_cache_step_counts_the_same_in_real_and_analytic_runs():
    real, analytic = decode(dynamic_cache()), decode(dynamic_cache(), device="meta")
    assert analytic.flops == real.flops
    assert analytic.op("aten.cat").calls == real.op("aten.cat").calls == 2 * LAYERS
    assert analytic.peak_memory_bytes == real.peak_memory_bytes


@pytest.mark.parametrize("options", MODES, ids=MODE_IDS)
def test_the_callers_cache_is_left_as_it_was(options):
    cache = dynamic_cache()
    layers = list(cache.layers)
    keys = [layer.keys for layer in layers]
    before = [k.clone() for k in keys]
    decode(cache, **options)
    assert cache.layers == layers and [layer.keys for layer in layers] == keys
    assert all(k.shape[-2] == CONTEXT and torch.equal(k, b) and not k.requires_grad for k, b in zip(keys, before))


@pytest.mark.parametrize("options", MODES, ids=MODE_IDS)
def test_a_static_cache_counts_its_whole_preallocation(options):
    # written in place at its count: the positions follow the layer's recorded device, which on a target is the GPU's
    length = CONTEXT + 64
    cache = StaticCache([StaticLayer(length, filled=CONTEXT) for _ in range(LAYERS)])
    memory = decode(cache, **options).memory
    assert memory is not None
    preallocated = 2 * LAYERS * BATCH * length * KV_HEADS * HEAD_DIM * FLOAT
    assert memory.kv_cache_bytes == preallocated  # the counts (one scalar per layer) are no keys or values
    assert memory.category_max["inputs"] == preallocated + rounded(8, options) * LAYERS + STEP_BYTES
    assert [int(layer.filled) for layer in cache.layers] == [CONTEXT] * LAYERS


@pytest.mark.parametrize("options", MODES, ids=MODE_IDS)
def test_a_sliding_window_counts_its_window_not_the_tensor_it_is_cut_from(options):
    # a real run copies the views (as tensors of their own); the analytic runs count as much
    window = 64
    memory = decode(SlidingWindowCache(window), **options).memory
    assert memory is not None
    assert memory.kv_cache_bytes == 2 * LAYERS * BATCH * window * KV_HEADS * HEAD_DIM * FLOAT
    assert memory.category_max["inputs"] == memory.kv_cache_bytes + STEP_BYTES


class Cached(DynamicCache):
    """A cache class whose own name does not say so: its base class's does."""


def test_a_cache_is_known_by_a_base_class_or_by_the_past_key_values_keyword():
    legacy = tuple((layer.keys, layer.values) for layer in dynamic_cache().layers)

    class Legacy(nn.Module):  # Hugging Face's older form: a tuple of (keys, values) per layer
        def forward(self, x, past_key_values):
            return x + sum(k.sum() + v.sum() for k, v in past_key_values)

    x = torch.randn(BATCH, 1, WIDTH)
    as_tuples = profile(Legacy(), ((x,), {"past_key_values": legacy})).memory
    by_base = decode(Cached(dynamic_cache().layers)).memory
    assert as_tuples is not None and by_base is not None
    assert as_tuples.kv_cache_bytes == by_base.kv_cache_bytes == CACHE_BYTES
    assert profile(Legacy(), (x, legacy)).memory.kv_cache_bytes == 0  # positional: no keyword says so


class Pair(NamedTuple):
    first: torch.Tensor
    second: torch.Tensor


@dataclasses.dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor
    pair: Pair
    extras: dict[str, list[torch.Tensor]]


class ReadsABatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, batch: Batch) -> torch.Tensor:
        assert batch.pair.first is batch.pair.second  # one tensor twice in the caller's batch: one in the run's
        assert all(t.device == self.proj.weight.device for t in (batch.tokens, *batch.extras["more"]))
        return self.proj(batch.tokens) + batch.pair.first + sum(batch.extras["more"])


@pytest.mark.parametrize("options", MODES, ids=MODE_IDS)
def test_a_dataclass_of_named_tuples_lists_and_dicts_runs_on_its_tensors(options):
    shared = torch.randn(4, WIDTH)
    batch = Batch(torch.randn(4, WIDTH), Pair(shared, shared), {"more": [torch.randn(4, WIDTH), torch.randn(WIDTH)]})
    result = profile(ReadsABatch(), (batch,), **options)
    assert result.memory is not None and result.memory.kv_cache_bytes == 0
    tensors = [4 * WIDTH * FLOAT] * 3 + [WIDTH * FLOAT]  # the shared tensor once
    assert result.memory.category_max["inputs"] == sum(rounded(n, options) for n in tensors)
    assert result.flops == profile(ReadsABatch(), (batch,)).flops


class MaskedAttention(nn.Module):
    """Attention under the dense mask of a flex-attention BlockMask (its blocks expanded to tokens)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(HEAD_DIM, 3 * HEAD_DIM)

    def forward(self, x: torch.Tensor, block_mask: torch.nn.attention.flex_attention.BlockMask) -> torch.Tensor:
        rows, columns = block_mask.BLOCK_SIZE
        allowed = block_mask.to_dense().repeat_interleave(rows, -2).repeat_interleave(columns, -1).bool()
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


@pytest.mark.parametrize("options", MODES, ids=MODE_IDS)
def test_a_block_mask_input_is_converted_with_the_inputs(options):
    tokens = 256
    mask = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, tokens, tokens, device="cpu")
    x = torch.randn(1, 1, tokens, HEAD_DIM)
    memory = profile(MaskedAttention(), (x, mask), **options).memory
    assert memory is not None
    # 128-token blocks: two query and two key blocks; four int32 tensors of counts (1 x 1 x 2) and four of indices (1 x 1 x 2 x 2)
    mask_tensors = [2 * 4] * 4 + [2 * 2 * 4] * 4
    assert memory.category_max["inputs"] == rounded(tokens * HEAD_DIM * FLOAT, options) + sum(rounded(n, options) for n in mask_tensors)
    assert memory.kv_cache_bytes == 0


def test_the_kv_cache_figure_round_trips_through_the_artifact_schema():
    import jsonschema

    result = decode(dynamic_cache(), target="h100")
    schema = json.loads(resources.files("pytest_modelprof").joinpath("schema", "profile.schema.json").read_text())
    document = json.loads(json.dumps(result.to_dict()))
    jsonschema.validate(document, {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": "#/$defs/profile"})
    again = Profile.from_dict(document).memory
    assert again is not None and again.kv_cache_bytes == CACHE_BYTES
