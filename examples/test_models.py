"""Budgeted profiles of real models: what a team commits next to its model code.

Run them with ``python -m pytest examples``; ``--modelprof-update`` refreshes the
baselines in budgets/test_models.toml. Real CPU runs, small batches: under two
minutes on two cores. The 7B Llama step is analytic (nothing is allocated).
"""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from examples.gpt2 import GPT2, GPT2Config
from examples.llama import Llama, LlamaConfig


def test_resnet18(model_profile):
    result = model_profile(torchvision.models.resnet18(), torch.randn(1, 3, 224, 224))
    assert result.uncounted == {}
    assert result.gflops < 4.0


@pytest.mark.modelprof(train=True)
def test_mobilenet_v3_training_step(model_profile):
    result = model_profile(torchvision.models.mobilenet_v3_small(), torch.randn(4, 3, 224, 224))
    assert result.backward_flops > result.forward_flops


def test_small_transformer(model_profile):
    model = GPT2(GPT2Config(vocab_size=1000, context=128, width=128, layers=4, heads=4))
    tokens = torch.randint(0, 1000, (2, 128))
    inference = model_profile(model, tokens, name="gpt2-mini inference")
    step = model_profile(model, tokens, name="gpt2-mini training step", train=True)
    assert step.forward_flops == inference.forward_flops


def test_lstm(model_profile):
    lstm = nn.LSTM(64, 128, num_layers=2, bidirectional=True, batch_first=True)
    model_profile(lstm, torch.randn(8, 50, 64))


@pytest.mark.modelprof(device="meta", train=True)
def test_llama_7b_training_step_analytic(model_profile):
    with torch.device("meta"):
        model = Llama(LlamaConfig.llama_7b())
    result = model_profile(model, torch.randint(0, 32000, (1, 2048)))
    assert result.analytic


def test_gpt2_training_step_on_an_h100(model_profile):
    # GPT-2 small, AdamW, bf16 autocast, as it would run on an H100: analytic, on this CPU-only
    # machine; its budget holds the H100's peak (max_peak_memory_mb = { h100 = ... })
    with torch.device("meta"):
        model = GPT2(GPT2Config())
    tokens = torch.randint(0, 50257, (8, 1024))
    result = model_profile(
        model, tokens, train=True, autocast=torch.bfloat16, optimizer=torch.optim.AdamW(model.parameters()), target="h100"
    )
    assert result.fits


def shard_decoder_layers(model, mesh):
    # FSDP2 as a training script applies it: each decoder layer, then the root; bf16 compute, fp32 reduction
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def test_llama_7b_fsdp_rank_of_64(model_profile):
    # rank 0 of 64 under FSDP2, analytic, on any CPU-only runner: what it holds at its peak and what
    # it all-gathers and reduce-scatters per step (its budget: max_peak_memory_mb, max_comm_gb)
    with torch.device("meta"):
        model = Llama(LlamaConfig.llama_7b())
    tokens = torch.randint(0, 32000, (1, 2048))
    optimizer = torch.optim.AdamW(model.parameters())
    result = model_profile(model, tokens, train=True, optimizer=optimizer, world_size=64, parallelize=shard_decoder_layers, device="meta")
    params = sum(p.numel() for p in model.parameters())
    assert result.memory.category_max["parameters"] < 4 * params / 64 * 1.01  # its fp32 shard, and FSDP's padding
