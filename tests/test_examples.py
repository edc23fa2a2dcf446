"""The example transformers, against hand formulas.

A decoder's forward MACs are one per weight of every matmul per token, plus attention:
per layer and head, sequence^2 * head_dim for the scores and again for the weighted
sum (causal attention counts the full square, as dense kernels compute it).
"""

import torch

from examples.gpt2 import GPT2, GPT2Config
from examples.llama import Llama, LlamaConfig
from pytest_modelprof import profile


def test_llama_forward_macs_by_hand():
    config = LlamaConfig.tiny()  # 4 query heads sharing 2 key/value heads
    batch, seq = 2, 16
    model = Llama(config)
    kv = config.kv_heads * config.head_dim
    per_layer = config.hidden * (config.hidden + 2 * kv + config.hidden) + 3 * config.hidden * config.intermediate
    linear = config.layers * per_layer + config.hidden * config.vocab_size
    attention = config.layers * config.heads * seq * seq * 2 * config.head_dim
    result = profile(model, torch.randint(0, config.vocab_size, (batch, seq)))
    assert result.uncounted == {}
    assert result.forward_macs == batch * seq * linear + batch * attention


def test_llama_7b_analytic_training_step():
    config = LlamaConfig.llama_7b()
    seq = 2048
    with torch.device("meta"):
        model = Llama(config)
    result = profile(model, torch.randint(0, config.vocab_size, (1, seq)), device="meta", train=True)
    per_layer = 4 * config.hidden**2 + 3 * config.hidden * config.intermediate
    linear = config.layers * per_layer + config.hidden * config.vocab_size
    attention = config.layers * config.heads * seq * seq * 2 * config.head_dim
    assert result.params == 6_738_415_616
    assert result.forward_macs == seq * linear + attention
    # backward: every linear computes grad input and grad weight (its input descends
    # from the trainable embedding); the fused attention backward recomputes the
    # scores, so 5 matmuls per score instead of the forward's 2.
    assert result.backward_macs == 2 * seq * linear + attention * 5 // 2
    assert result.uncounted == {}


def test_gpt2_forward_macs_by_hand():
    config = GPT2Config.tiny()
    seq = 32
    model = GPT2(config)
    width = config.width
    per_layer = 3 * width * width + width * width + 2 * 4 * width * width
    head_dim = width // config.heads
    attention = config.layers * config.heads * seq * seq * 2 * head_dim
    result = profile(model, torch.randint(0, config.vocab_size, (1, seq)))
    assert result.forward_macs == seq * (config.layers * per_layer + width * config.vocab_size) + attention
    assert result.params == sum(p.numel() for p in model.parameters())  # tied head counted once
