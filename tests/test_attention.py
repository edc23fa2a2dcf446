"""Attention on every CPU path, against a hand-derived attention block.

Per query head, scores Q K^T cost s_q * s_k * d MACs and the weighted sum P V
s_q * s_k * d_v MACs; FLOPs add, per score, the scaling (1) and the softmax (5).
"""

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

from pytest_modelprof import profile
from pytest_modelprof.engine.formulas import formula_for

B, L, E, H = 2, 10, 32, 4
D = E // H


class Attention(nn.Module):
    def __init__(self, kv_heads=H):
        super().__init__()
        self.kv_heads = kv_heads
        self.q = nn.Linear(E, E, bias=False)
        self.kv = nn.Linear(E, 2 * kv_heads * D, bias=False)
        self.out = nn.Linear(E, E, bias=False)

    def forward(self, x):
        q = self.q(x).view(B, L, H, D).transpose(1, 2)
        k, v = self.kv(x).view(B, L, 2, self.kv_heads, D).permute(2, 0, 3, 1, 4)
        y = scaled_dot_product_attention(q, k, v, enable_gqa=self.kv_heads != H)
        return self.out(y.transpose(1, 2).reshape(B, L, E))


def attention_block_macs(kv_heads):
    projections = B * L * E * E + B * L * E * 2 * kv_heads * D + B * L * E * E
    attention = B * H * L * L * (D + D)
    return projections, attention


@pytest.mark.parametrize("kv_heads", [H, 2], ids=["mha", "gqa"])
def test_attention_block_by_hand(kv_heads):
    x = torch.randn(B, L, E)
    result = profile(Attention(kv_heads), x)
    projections, attention = attention_block_macs(kv_heads)
    assert result.macs == projections + attention
    assert result.flops == 2 * (projections + attention) + B * H * L * L * (1 + 5)
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in {op.op for op in result.ops}


def test_math_backend_counts_the_same_macs():
    x = torch.randn(B, L, E)
    with sdpa_kernel(SDPBackend.MATH):
        result = profile(Attention(), x)
    assert "aten._scaled_dot_product_flash_attention_for_cpu" not in {op.op for op in result.ops}
    assert result.macs == sum(attention_block_macs(H))
    assert result.uncounted == {}


def test_fused_attention_backward_recomputes_scores():
    q, k, v = (torch.randn(B, H, L, D, requires_grad=True) for _ in range(3))

    class Sdpa(nn.Module):
        def forward(self, q, k, v):
            return scaled_dot_product_attention(q, k, v)

    result = profile(Sdpa(), (q, k, v), train=True)
    # recomputed scores (d), dV (d), dP (d), dQ (d), dK (d)
    assert result.backward_macs == B * H * L * L * 5 * D


def test_causal_mask_and_explicit_mask_are_counted():
    q = torch.randn(1, H, L, D)
    mask = torch.ones(L, L, dtype=torch.bool).tril()

    class Masked(nn.Module):
        def forward(self, q):
            return scaled_dot_product_attention(q, q, q, attn_mask=mask)

    result = profile(Masked(), q)
    assert result.flops == 2 * H * L * L * 2 * D + H * L * L * (1 + 5 + 1)


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(E, H, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


def test_multihead_attention_fast_path_matches_the_slow_path():
    x = torch.randn(B, L, E)
    model = SelfAttention()
    fast = profile(model, x)
    assert [op.op for op in fast.ops] == ["aten._native_multi_head_attention"]
    slow = profile(model, x, train=True)
    assert "aten._native_multi_head_attention" not in {op.op for op in slow.ops}
    macs = 3 * B * L * E * E + B * H * L * L * 2 * D + B * L * E * E
    assert fast.forward_macs == slow.forward_macs == macs
    assert fast.forward_flops == slow.forward_flops


def test_transformer_encoder_layer_fast_path_matches_the_slow_path():
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=64, dropout=0.0, batch_first=True)
    x = torch.randn(B, L, E)
    fast = profile(layer, x)
    assert [op.op for op in fast.ops] == ["aten._transformer_encoder_layer_fwd"]
    slow = profile(layer, x, train=True)
    macs = 4 * B * L * E * E + B * H * L * L * 2 * D + 2 * B * L * E * 64
    assert fast.forward_macs == slow.forward_macs == macs
    assert fast.forward_flops == slow.forward_flops


def test_gelu_transformer_encoder_layer_fast_path_matches_the_slow_path():
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=64, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
    x = torch.randn(B, L, E)
    assert profile(layer, x).forward_flops == profile(layer, x, train=True).forward_flops


# on a CUDA target (analytic, from this CPU-only machine), the fused inference ops run as CUDA's kernels run them


def ops_of(result):
    """The kernels of the step: the ops that launch one on the target."""
    kernels: dict[str, int] = {}
    for row in result.predicted.ops:
        kernels[row.op] = kernels.get(row.op, 0) + row.calls
    return kernels


def test_multihead_attention_fast_path_on_a_cuda_target_runs_cudas_kernels():
    model, x = SelfAttention().eval(), torch.randn(B, L, E)
    result = profile(model, x, target="h100")
    # one packed projection, the attention kernel (float32 on an H100: memory-efficient), the output projection
    assert ops_of(result) == {"aten.addmm": 2, "aten._scaled_dot_product_efficient_attention": 1}
    assert result.forward_macs == 3 * B * L * E * E + B * H * L * L * 2 * D + B * L * E * E
    assert result.forward_flops == profile(model, x).forward_flops  # the CPU's one fused op, counted whole
    assert torch.overrides.has_torch_function is STOCK_HAS_TORCH_FUNCTION  # the run's answer is gone with it


STOCK_HAS_TORCH_FUNCTION = torch.overrides.has_torch_function


class WeightedAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(E, H, batch_first=True)

    def forward(self, x):
        out, weights = self.mha(x, x, x)  # need_weights=True: the averaged attention weights too
        return out + weights.sum()


def test_multihead_attention_asked_for_its_weights_on_a_cuda_target_takes_the_explicit_path():
    result = profile(WeightedAttention().eval(), torch.randn(B, L, E), target="h100")
    ops = ops_of(result)
    # projection without its bias; bias, scale and head split of q, k, v in one kernel; Q K^T; softmax in place;
    # P V into q's buffer; heads back together (a copy); output projection; the weights averaged over heads
    assert ops["aten.mm"] == 1 and ops["aten._transform_bias_rescale_qkv"] == 1 and ops["aten.bmm"] == 2
    assert ops["aten._softmax"] == 1 and ops["aten.clone"] == 1 and ops["aten.addmm"] == 1
    assert "aten._scaled_dot_product_efficient_attention" not in ops
    assert result.forward_macs == 3 * B * L * E * E + B * H * L * L * 2 * D + B * L * E * E
    scores = B * H * L * L
    # bias on q, k, v and q's scale; softmax; the head sum and the division of the (B, L, L) weights
    # (then the model's own add and sum)
    elementwise = 3 * B * L * E + B * L * E + 5 * scores + scores + B * L * L
    assert result.forward_flops == 2 * result.forward_macs + B * L * E + elementwise + B * L * E + B * L * L


@pytest.mark.parametrize(("activation", "norm_first"), [("relu", False), ("gelu", True)])
def test_transformer_encoder_layer_fast_path_on_a_cuda_target_runs_cudas_kernels(activation, norm_first):
    layer = nn.TransformerEncoderLayer(
        E, H, dim_feedforward=64, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    )
    layer.eval()
    x = torch.randn(B, L, E)
    result = profile(layer, x, target="h100")
    # the feed-forward block's activation in its first product's epilogue: no separate relu or gelu kernel
    assert ops_of(result) == {
        "aten.addmm": 3,
        "aten._addmm_activation": 1,
        "aten._scaled_dot_product_efficient_attention": 1,
        "aten.native_layer_norm": 2,
        "aten.add_": 2,
    }
    assert result.forward_macs == 4 * B * L * E * E + B * H * L * L * 2 * D + 2 * B * L * E * 64
    cpu = profile(layer, x)
    if activation == "relu":  # cuBLASLt's GELU epilogue is the tanh form, 4 FLOPs more than the CPU's erf
        assert result.forward_flops == cpu.forward_flops
    else:
        assert result.forward_flops == cpu.forward_flops + 4 * B * L * 64


def test_transformer_encoder_layer_with_a_padding_mask_on_a_cuda_target_masks_its_softmax():
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=64, dropout=0.0, batch_first=True).eval()
    padding = torch.zeros(B, L, dtype=torch.bool)
    padding[:, -3:] = True

    class Padded(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x, padding):
            return self.layer(x, src_key_padding_mask=padding)

    ops = ops_of(profile(Padded().eval(), (torch.randn(B, L, E), padding), target="h100"))
    assert ops["aten._masked_softmax"] == 1 and ops["aten.bmm"] == 2 and "aten._addmm_activation" in ops


def test_training_keeps_the_modules_own_path_on_a_cuda_target():
    model = SelfAttention()
    ops = ops_of(profile(model, torch.randn(B, L, E), train=True, target="h100"))
    assert "aten._transform_bias_rescale_qkv" not in ops and "aten._scaled_dot_product_efficient_attention_backward" in ops


class CallsOp(nn.Module):
    def __init__(self, call):
        super().__init__()
        self.call = call

    def forward(self, q):
        return self.call(q)[0]


aten = torch.ops.aten
BACKENDS = {
    "flash": lambda q: aten._scaled_dot_product_flash_attention(q, q, q),
    "efficient": lambda q: aten._scaled_dot_product_efficient_attention(q, q, q, None, True),
    "cudnn": lambda q: aten._scaled_dot_product_cudnn_attention(q, q, q, None, True),
    "flash-kernel": lambda q: aten._flash_attention_forward(*[q.transpose(1, 2)] * 3, None, None, L, L, 0.0, False, False),
    "efficient-kernel": lambda q: aten._efficient_attention_forward(*[q.transpose(1, 2)] * 3, None, None, None, L, L, 0.0, 0, True),
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_cuda_attention_kernels_analytically(backend):
    # the CUDA kernels have meta implementations: their formulas are checked without a GPU
    q = torch.randn(B, H, L, D, device="meta", dtype=torch.float16)
    result = profile(CallsOp(BACKENDS[backend]), q, device="meta")
    assert result.uncounted == {}
    assert result.macs == B * H * L * L * 2 * D
    assert result.flops == 2 * result.macs + B * H * L * L * (1 + 5)


def test_packed_variable_length_flash_kernel():
    # two sequences of 3 and 7 tokens packed into 10 rows: scores 3*3 + 7*7 per head.
    # The sequence lengths are values, which only a real (GPU) run has: the formula
    # is called here as the meter would call it, on stand-in tensors.
    formula = formula_for(aten._flash_attention_forward)
    packed = torch.empty(10, H, D)
    offsets = torch.tensor([0, 3, 10], dtype=torch.int32)
    out = (torch.empty(10, H, D),)
    cost = formula(packed, packed, packed, offsets, offsets, 7, 7, 0.0, False, False, out_val=out)
    scores = H * (3 * 3 + 7 * 7)
    assert cost.macs == scores * 2 * D
    assert cost.flops == 2 * cost.macs + scores * (1 + 5)


def test_packed_kernel_without_sequence_lengths_is_uncounted():
    packed = torch.randn(10, H, D, device="meta", dtype=torch.float16)

    class Packed(nn.Module):
        def forward(self, x):
            offsets = torch.tensor([0, 3, 10], dtype=torch.int32, device=x.device)
            return aten._flash_attention_forward(x, x, x, offsets, offsets, 7, 7, 0.0, False, False)[0]

    result = profile(Packed(), packed, device="meta")
    assert result.uncounted == {"aten._flash_attention_forward": 1}


class Sdpa(nn.Module):
    def forward(self, q, k, v):
        return scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize(("s_q", "s_k"), [(16, 16), (16, 24), (24, 16)])
def test_causal_attention_reports_the_scores_it_skips(s_q, s_k):
    from pytest_modelprof.engine.formulas import causal_scores

    kept = int(torch.ones(s_q, s_k).tril().sum())  # the mask is_causal=True applies
    assert causal_scores(s_q, s_k) == kept
    q = torch.randn(B, H, s_q, D, requires_grad=True)
    k, v = (torch.randn(B, H, s_k, D, requires_grad=True) for _ in range(2))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        result = profile(Sdpa(), (q, k, v), train=True)
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in {row.op for row in result.ops}
    skipped = B * H * (s_q * s_k - kept)
    forward = 2 * D * 2 + 1 + 5  # per score: Q K^T and P V MACs, scaling, softmax
    backward = 2 * (3 * D + 2 * D) + 2 + 4  # per score: recompute, dV, dP, dQ, dK; softmax recompute and backward
    assert result.skipped_flops == skipped * (forward + backward)
    # FLOPs count every score of the s_q x s_k matrix, as the kernels compute them; beside the scores,
    # per output element: the backward's row sums rowsum(dO * O) (2) and the loss's sum (1)
    outputs = B * H * s_q * D
    assert result.flops == B * H * s_q * s_k * (forward + backward) + 3 * outputs
    assert result.useful_flops == B * H * kept * (forward + backward) + 3 * outputs


def test_causal_attention_on_a_cuda_target_reports_its_skipped_scores_too():
    q = torch.randn(B, H, 64, 64, dtype=torch.bfloat16)
    result = profile(Sdpa(), (q, q, q), target="h100")
    assert "aten._scaled_dot_product_cudnn_attention" in {row.op for row in result.ops}
    assert result.skipped_flops == B * H * (64 * 64 - 64 * 65 // 2) * (2 * 64 * 2 + 1 + 5)


class PaddedEncoder(nn.Module):
    """nn.TransformerEncoder in eval with a padding mask: a real run packs the batch into a nested tensor."""

    def __init__(self, nested=True):
        super().__init__()
        layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested)

    def forward(self, x, padding):
        return self.encoder(x, src_key_padding_mask=padding)


def padded_batch():
    torch.manual_seed(0)
    x, padding = torch.randn(3, 16, 64), torch.zeros(3, 16, dtype=torch.bool)
    padding[1, 10:] = True  # lengths 16, 10, 5
    padding[2, 5:] = True
    return x, padding


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_a_nested_encoder_batch_counts_each_sequence_without_its_padding():
    x, padding = padded_batch()
    model = PaddedEncoder().eval()
    nested = profile(model, (x, padding))
    assert nested.uncounted == {}
    # each sequence on its own, at its length: the same layers' dense FLOPs (no mask, so no masking work)
    layers = [m for m in nested.modules if m.path.startswith("encoder.layers.") and m.path.count(".") == 2]
    alone = [profile(model.encoder.layers[0], x[i : i + 1, :n]).flops for i, n in enumerate((16, 10, 5))]
    assert sum(m.forward_flops for m in layers) == 2 * sum(alone)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_an_analytic_run_computes_the_padded_encoder_batch_densely():
    """Fake tensors cannot be nested: the analytic run takes the encoder's dense path, as a real run
    without nested tensors does (an upper bound of the real run's figures)."""
    x, padding = padded_batch()
    analytic = profile(PaddedEncoder().eval(), (x, padding), device="meta")
    dense = profile(PaddedEncoder(nested=False).eval(), (x, padding))
    assert analytic.flops == dense.flops and analytic.peak_memory_bytes == dense.peak_memory_bytes
    assert analytic.flops > profile(PaddedEncoder().eval(), (x, padding)).flops
    # on a CUDA target the fused layer runs as its kernels (addmm, bmm, masked softmax, ...): the same FLOPs
    # as the CPU's one fused op, counted by other formulas
    assert profile(PaddedEncoder().eval(), (x, padding), target="h100").flops == analytic.flops
