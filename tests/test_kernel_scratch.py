"""Kernel scratch on a CUDA target: what a reduction kernel takes from the caching allocator while
it runs, worked out by hand from ATen's launch rules (aten/src/ATen/native/cuda/Reduce.cuh), and
a training step whose peak is such a moment."""

import pytest
import torch
from torch import nn

from pytest_modelprof import GPUS, profile
from pytest_modelprof.engine.targets.gpus import threads_per_sm
from pytest_modelprof.engine.targets.scratch import kernel_scratch
from pytest_modelprof.engine.targets.scratch.reductions import reduction_scratch

MiB = 1 << 20
SUM = torch.ops.aten.sum.dim_IntList


def scratch(x, dims, gpu="h100"):
    """What ``x.sum(dims, keepdim=True)`` stages on ``gpu``."""
    spec = GPUS[gpu]
    return reduction_scratch(
        "aten.sum", SUM, (x, dims, True), {}, torch.empty(1, dtype=x.dtype, device="meta"), spec.sm_count, spec.compute_capability
    )


def on_gpu(func, args=(), kwargs=None, out=None, gpu="h100"):
    """What the op ``func`` allocates inside its call on ``gpu``, beside its outputs ``out``."""
    spec = GPUS[gpu]
    return kernel_scratch(f"aten.{func.overloadpacket.__name__}", func, args, kwargs or {}, out, spec.sm_count, spec.compute_capability)


def bias_gradient(rows=8192, features=4096, dtype=torch.bfloat16):
    return torch.empty(rows, features, dtype=dtype, device="meta")


@pytest.mark.parametrize(
    ("gpu", "sms", "blocks_per_sm"),
    [("h100", 132, 2048 // 128), ("a100-80gb", 108, 2048 // 128), ("l4", 58, 1536 // 128)],
)
def test_the_bias_gradient_sum_stages_its_blocks_in_a_buffer(gpu, sms, blocks_per_sm):
    # grad.sum(0) of a contiguous 8192 x 4096 bf16 gradient: the reduced dimension is the slow
    # one, so each thread keeps 4 neighbouring outputs (a vector) and a block is 32 lanes wide
    # (128 outputs) and 4 warps high (512 threads / 4 per vector); 4096 / 128 = 32 block columns.
    # Each warp sums 8192 / 4 = 2048 rows: more than 256, so the rows are split across blocks, as
    # many as fill the GPU: ceil(sms * blocks_per_sm / 32), at most ceil(2048 / 16).
    per_output = min(-(-sms * blocks_per_sm // 32), 2048 // 16)
    # the buffer: a float accumulator per output, per block, per lane and vector element
    buffer = 4 * 4096 * per_output * 32 * 4
    assert scratch(bias_gradient(), [0], gpu) == [buffer, 4 * 32]  # and one int semaphore per column
    assert per_output == {"h100": 66, "a100-80gb": 54, "l4": 22}[gpu]
    assert threads_per_sm(GPUS[gpu].compute_capability) == blocks_per_sm * 128


def test_what_a_reduction_stages_follows_the_memory_layout_not_the_dimension_names():
    # the same memory, 4096 x 8192 transposed, reduced along its strided dimension: 8192 outputs
    # (64 columns of 128), 4096 / 4 = 1024 rows per warp -> ceil(2112 / 64) = 33 blocks per column
    transposed = torch.empty(4096, 8192, dtype=torch.bfloat16, device="meta").t()
    assert scratch(transposed, [1]) == [4 * 8192 * 33 * 32 * 4, 4 * 64]
    # reducing the contiguous dimension instead: one output per warp, read along the lanes; no staging
    assert scratch(bias_gradient(), [1]) == []


def test_reductions_that_fit_their_blocks_stage_nothing():
    assert scratch(bias_gradient(64, 1000, torch.float32), [0]) == []  # 64 / 4 = 16 rows per warp
    assert scratch(torch.empty(1, device="meta"), [0]) == []
    # a whole-tensor sum (a loss): its blocks meet in one accumulator each, a few kiB at most
    buffer, semaphores = scratch(bias_gradient(dtype=torch.float32), [])
    assert 0 < buffer < 16 * 1024 and semaphores == 4


def test_elementwise_max_is_not_a_reduction():
    x = bias_gradient()
    assert reduction_scratch("aten.max", torch.ops.aten.max.other, (x, x), {}, x, 132, (9, 0)) == []


def test_a_reduction_too_large_for_32_bit_offsets_runs_in_parts():
    # 2**20 x 4096 bf16 (8 GiB): offsets beyond 2**31 bytes; ATen halves the widest dimension (the
    # rows) until a part fits: 4 parts of 262144 rows, one after another, each staging its own
    # buffer: 65536 rows per warp -> max(min(66, 4096), 65536 / 256) = 256 blocks per column.
    # The bf16 output cannot hold the running sums across parts: a float accumulator per output.
    x = torch.empty(2**20, 4096, dtype=torch.bfloat16, device="meta")
    assert scratch(x, [0]) == [4096 * 4, 4 * 4096 * 256 * 32 * 4, 4 * 32]


def test_a_training_step_whose_peak_is_a_bias_gradient_sum(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # torch's default on an H100: 32 MiB per thread
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 1024)).to(torch.bfloat16)
    x = torch.empty(8192, 1024, dtype=torch.bfloat16, device="meta")
    result = profile(
        model, x, train=True, target="h100", loss_fn=lambda out: out.float().sum(), optimizer=torch.optim.AdamW(model.parameters())
    )
    memory = result.memory
    # the second layer's bias gradient, grad.sum(0) over 8192 rows of 1024 bf16 features: 8 block
    # columns, 2048 rows per warp -> min(ceil(2112 / 8), 2048 / 16) = 128 blocks per column
    staging = 4 * 1024 * 128 * 32 * 4 + 512  # and its semaphores, in one 512-byte block
    workspaces = 32 * MiB + MiB + 32 * MiB  # cuBLAS, the step's and the backward's; cuBLASLt for addmm
    assert memory.peak_phase == "backward" and memory.peak_module == "1"
    assert memory.peak_breakdown["workspace"] == workspaces + staging
    activation = 8192 * 1024 * 2  # 16 MiB: the first layer's output, saved for the second
    weights = 2 * (1024 * 1024 + 1024) * 2
    # at that moment: weights and AdamW's two moments of them, input, the saved activation (released
    # only after the sum, as the autograd engine releases a node's saved tensors after validating
    # its outputs), the incoming gradient, the input's gradient, the weight's gradient and the bias
    # gradient's 2 kiB
    held = 3 * weights + activation + activation + activation + activation + 1024 * 1024 * 2 + 2048
    assert memory.peak_bytes - (held + workspaces + staging) in range(0, 4 * 512)  # the loss, its gradient
    # AdamW's state on the GPU: two moments per parameter; its step counters live on the CPU
    assert memory.category_max["optimizer_state"] == 2 * weights


def test_a_sharded_step_on_a_target_stages_its_reductions_too():
    from torch.distributed.fsdp import fully_shard

    def fsdp(model, mesh):
        fully_shard(model, mesh=mesh)

    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU())  # (the ReLU's gradient is a dense tensor)
    x = torch.randn(8192, 512)
    result = profile(model, x, train=True, world_size=2, parallelize=fsdp, target="h100")
    # each rank's bias gradient, the whole 2048 before the reduce-scatter: grad.sum(0) over 8192 fp32
    # rows: 4 outputs per thread, 16 block columns of 128; 2048 rows per warp ->
    # min(ceil(2112 / 16), 2048 / 16) = 128 blocks per column, a float per output, block, lane, element
    staging = 4 * 2048 * 128 * 32 * 4
    cublas = 32 * MiB + MiB + 32 * MiB
    assert result.memory.category_max["workspace"] == cublas + staging + 512


def test_the_staging_buffer_holds_the_accumulator_of_the_result_type():
    # x.sum(0, dtype=torch.float64) of a float32 8192 x 4096: the same launch as the bf16 bias
    # gradient (4 outputs per thread, 32 columns, 66 blocks each on an H100), 8-byte accumulators
    x = bias_gradient(dtype=torch.float32)
    out = torch.empty(4096, dtype=torch.float64, device="meta")
    assert reduction_scratch("aten.sum", SUM, (x, [0], True), {"dtype": torch.float64}, out, 132, (9, 0)) == [
        8 * 4096 * 66 * 32 * 4,
        4 * 32,
    ]


def test_what_a_cudnn_lstm_allocates_around_its_cudnn_calls():
    from pytest_modelprof.engine.targets.scratch.rnn import rnn_scratch

    aten = torch.ops.aten
    seq, batch, features, hidden, layers = 256, 32, 512, 1024, 2

    def meta(*shape):
        return torch.empty(*shape, device="meta")

    weights = [
        w for width in (features, hidden) for w in (meta(4 * hidden, width), meta(4 * hidden, hidden), meta(4 * hidden), meta(4 * hidden))
    ]
    x, h = meta(batch, seq, features), meta(layers, batch, hidden)  # batch first
    forward = (x, weights, 4, None, h, h, 2, hidden, 0, layers, True, 0.0, True, False, [], None)
    # cuDNN's workspace: the four gates' input products of every step and row, for each layer (256 MiB here: what an
    # H100 and an H200 allocated beyond the outputs and ATen's copies in this LSTM's inference and training steps)
    workspace = layers * seq * batch * 4 * hidden * 4
    assert workspace == 256 * 2**20
    x_first = batch * seq * features * 4  # x, sequence first
    assert rnn_scratch("aten._cudnn_rnn", aten._cudnn_rnn.default, forward, {}) == [x_first, workspace]
    assert rnn_scratch(
        "aten._cudnn_rnn", aten._cudnn_rnn.default, (meta(seq, batch, features), *forward[1:10], False, *forward[11:]), {}
    ) == [workspace]
    # a bidirectional GRU: three gates, both directions' products
    gru = (meta(seq, batch, features), weights, 4, None, h, None, 3, hidden, 0, layers, False, 0.0, False, True, [], None)
    assert rnn_scratch("aten._cudnn_rnn", aten._cudnn_rnn.default, gru, {}) == [2 * layers * seq * batch * 3 * hidden * 4]

    output = meta(seq, batch, hidden).transpose(0, 1)  # as the forward returns it, batch first
    grad_output = meta(batch, seq, hidden)  # what selecting the last step gives back: contiguous, batch first

    def backward(mask):
        args = (
            x,
            weights,
            4,
            meta(0),
            h,
            h,
            output,
            grad_output,
            None,
            None,
            2,
            hidden,
            0,
            layers,
            True,
            0.0,
            True,
            False,
            [],
            None,
            meta(1),
            mask,
        )
        return rnn_scratch("aten._cudnn_rnn_backward", aten._cudnn_rnn_backward.default, args, {})

    state, copy_of_x, copy_of_dy = layers * batch * hidden * 4, batch * seq * features * 4, batch * seq * hidden * 4
    weights_gradient = sum(w.numel() for w in weights) * 4
    # zeros for the final states' gradients (not given), x copied again, each call's workspace; the output
    # gradient's copy (32 MiB, backward-data call) is gone before the weights' gradient (56 MiB) is made
    assert copy_of_dy < weights_gradient
    assert backward([False, False, False, True]) == [state, state, copy_of_x, workspace]
    # frozen weights: no weights' gradient, so the backward-data call's copies are the most held at once
    assert backward([True, False, False, False]) == [state, state, copy_of_x, workspace, copy_of_dy]


def test_a_channels_last_convolution_stages_its_bias_gradient():
    # convolution_backward sums grad_output over (N, H, W) after cuDNN's kernels. Channels last,
    # 64 x 64 x 56 x 56 fp32: the channels are the fastest dimension and not reduced; (W, H, N)
    # coalesce into 200704 inputs per output; 4 channels per thread, 16 lanes (64 / 4), 8 warps
    # (128 threads / 16); 200704 / 8 = 25088 inputs per warp, over 256: one block column, split
    # into max(min(2112, 25088 / 16), 25088 / 256) = 1568 blocks, each staging 16 lanes x 4 floats
    grad = torch.empty(64, 64, 56, 56, device="meta").to(memory_format=torch.channels_last)
    out = (grad, torch.empty(64, 64, 3, 3, device="meta"), torch.empty(64, device="meta"))
    args = (grad, grad, out[1], [64], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True])
    expected = [4 * 64 * 1568 * 16 * 4, 4]
    assert on_gpu(torch.ops.aten.convolution_backward.default, args, out=out) == expected
    # contiguous (NCHW): each channel's inputs are read along the lanes; a few blocks per channel meet in a small buffer
    dense = torch.empty(64, 64, 56, 56, device="meta")
    small = on_gpu(torch.ops.aten.convolution_backward.default, (dense, *args[1:]), out=out)
    assert sum(small) < 64 * 1024
    # no bias: nothing summed
    assert on_gpu(torch.ops.aten.convolution_backward.default, (*args[:-1], [True, True, False]), out=out) == []


FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_backward.default


def flash_backward(batch, heads, sequence, head, kv_heads=None, grad_out=None):
    """What SDPA's flash backward stages for q, k, v of (batch, heads, sequence, head) in bf16,
    laid out as a fused projection's views are (sequence first in memory)."""

    def projection(h):
        return torch.empty(batch, sequence, h, head, dtype=torch.bfloat16, device="meta").transpose(1, 2)

    q, k = projection(heads), projection(kv_heads or heads)
    out = projection(heads)
    logsumexp = torch.empty(batch, heads, sequence, device="meta")
    args = (
        grad_out if grad_out is not None else projection(heads),
        q,
        k,
        k,
        out,
        logsumexp,
        None,
        None,
        sequence,
        sequence,
        0.0,
        True,
        None,
        None,
    )
    return on_gpu(FLASH_BACKWARD, args, gpu="a100-80gb")


def test_flash_attention_backward_accumulates_the_query_gradient_in_float():
    # 4 x 8 heads x 1000 x 64: rows rounded to 1024; softmax_d, one float per row and head; dq_accum,
    # a float per row, head and head element (64 is a multiple of 32)
    assert flash_backward(4, 8, 1000, 64) == [4 * 8 * 1024 * 4, 4 * 1024 * 8 * 64 * 4]
    # heads of 80 round up to 96; of 160 (over 128) to 192
    assert flash_backward(2, 4, 256, 80)[1] == 2 * 256 * 4 * 96 * 4
    assert flash_backward(2, 4, 256, 160)[1] == 2 * 256 * 4 * 192 * 4


def test_flash_attention_backward_of_grouped_query_attention_and_of_strided_gradients():
    # 32 query heads over 8 key/value heads: the keys' and values' gradients for all 32 heads first
    grouped = flash_backward(1, 32, 2048, 128, kv_heads=8)
    assert grouped[2:] == [2048 * 32 * 128 * 2] * 2
    # a gradient laid out heads first (not the kernel's layout) is copied first
    grad = torch.empty(1, 32, 2048, 128, dtype=torch.bfloat16, device="meta")
    assert flash_backward(1, 32, 2048, 128, grad_out=grad)[0] == 2048 * 32 * 128 * 2


def test_deterministic_flash_backward_keeps_one_accumulator_per_split(monkeypatch):
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    # 108 SMs over 2 x 4 = 8 (batch, head) pairs: 14 splits
    assert flash_backward(2, 4, 256, 64)[1] == 14 * 2 * 256 * 4 * 64 * 4


class Attention(nn.Module):
    """Self-attention of 8 heads of 64 over a fused, bias-free projection of 512 features."""

    def __init__(self, causal):
        super().__init__()
        self.qkv = nn.Linear(512, 1536, bias=False)
        self.causal = causal

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 8, 64).permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal).transpose(1, 2).reshape(b, t, c)


def attention_step(monkeypatch, target):
    """The memory of a bf16-autocast training step of causal ``Attention`` over 4 x 1000 tokens on ``target``."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    with torch.device("meta"):
        model = Attention(causal=True)
    x = torch.empty(4, 1000, 512, device="meta")
    return profile(model, x, train=True, target=target, autocast=torch.bfloat16).memory


def test_an_a100_training_step_holds_flash_attention_backward_accumulators(monkeypatch):
    memory = attention_step(monkeypatch, "a100-80gb")
    # at the attention's backward: the cuBLAS workspaces (8 MiB + 128 KiB per thread before Hopper,
    # and cuBLASLt's 1 MiB for no addmm: none here) and FlashAttention's softmax_d and dq_accum
    cublas = 2 * (8 * MiB + 128 * 1024)
    assert memory.category_max["workspace"] == cublas + 4 * 8 * 1024 * 4 + 4 * 1024 * 8 * 64 * 4


def efficient(op, *tensors, gpu="h100", **arguments):
    """What memory-efficient attention's ``op`` allocates beside its outputs on ``gpu``."""
    return on_gpu(getattr(torch.ops.aten, op).default, tensors, arguments, gpu=gpu)


def heads_first(batch, heads, sequence, head, dtype=torch.float32):
    """(batch, heads, sequence, head) views of a (batch, sequence, heads, head) buffer, as a
    projection's output reshaped for attention is laid out."""
    return torch.empty(batch, sequence, heads, head, dtype=dtype, device="meta").transpose(1, 2)


def efficient_backward(batch, heads, sequence, head, dtype=torch.float32, gpu="h100", grad_out=None, dropout_p=0.0):
    q, k, v, out = (heads_first(batch, heads, sequence, head, dtype) for _ in range(4))
    grad_out = grad_out if grad_out is not None else heads_first(batch, heads, sequence, head, dtype)
    logsumexp = torch.empty(batch, heads, sequence, device="meta")
    return efficient(
        "_scaled_dot_product_efficient_attention_backward",
        grad_out,
        q,
        k,
        v,
        None,
        out,
        logsumexp,
        None,
        None,
        gpu=gpu,
        dropout_p=dropout_p,
        grad_input_mask=[True, True, True, False],
        is_causal=False,
    )


def test_fp32_efficient_attention_backward_holds_the_row_sums_and_the_query_gradient_tiles():
    # fp32, head 64: the 64 x 64 kernel. ATen computes delta = (dO * O).sum(-1), transposed and
    # copied: the product (2 x 256 x 4 x 64 floats), the sum and its copy (2 x 4 x 256 floats)
    # live together; the workspace, per (batch, head): 4 query blocks x 1 column block, each a
    # 16-byte lock and 64 x 64 floats: 4 x (4 + 4096) floats. The larger of the two moments is held.
    row_sums = 2 * 4 * 256 * 4
    product = 2 * 256 * 4 * 64 * 4
    workspace = 2 * 4 * (4 * (4 + 64 * 64)) * 4
    assert product + 2 * row_sums > row_sums + workspace
    assert efficient_backward(2, 4, 256, 64) == [product, row_sums, row_sums]
    # 200 queries round up to 4 blocks of 64: now the kernel's moment is the larger
    assert efficient_backward(2, 4, 200, 64) == [2 * 4 * 200 * 4, 2 * 4 * (4 * (4 + 64 * 64)) * 4]


def test_half_precision_efficient_attention_backward_by_gpu():
    delta = 2 * 4 * 256 * 4  # made by the kernel itself in half precision
    # head 128 on an H100: the 128 x 128 kernel keeps dK and dV in registers; 2 query blocks of (4 + 128 x 128)
    assert efficient_backward(2, 4, 256, 128, torch.bfloat16) == [delta, 2 * 4 * (2 * (4 + 128 * 128)) * 4]
    # on an L4 that kernel needs more shared memory than a block has: the 64 x 64 one, whose dK and
    # dV (head 128 > 64 rows) accumulate in the workspace, one 64-key tile row per split of the
    # 256 keys (4 splits, under 200 / (2 x 4)): 4 x 64 x (128 + 128) floats, then 4 x 2 query tiles
    key_tiles = 4 * 64 * (128 + 128)
    query_tiles = 4 * 2 * (4 + 64 * 64)
    assert efficient_backward(2, 4, 256, 128, torch.bfloat16, gpu="l4") == [delta, 2 * 4 * (key_tiles + query_tiles) * 4]
    # head 96 on an L4: its own 128 x 64 kernel, in registers: 2 query blocks x 2 column blocks of 64
    assert efficient_backward(2, 4, 256, 96, torch.bfloat16, gpu="l4")[1] == 2 * 4 * (2 * 2 * (4 + 128 * 64)) * 4
    # an empty batch runs no kernel
    assert efficient_backward(0, 4, 256, 128, torch.bfloat16, gpu="l4") == []
    # with dropout that kernel is not offered: 64 x 64 again, dK and dV in the workspace
    with_dropout = efficient_backward(2, 4, 256, 96, torch.bfloat16, gpu="l4", dropout_p=0.1)[1]
    assert with_dropout == 2 * 4 * (4 * 64 * (128 + 128) + 4 * 2 * (4 + 64 * 64)) * 4


def test_efficient_attention_copies_a_gradient_not_in_its_layout():
    grad = torch.empty(2, 4, 256, 64, device="meta")  # heads first in memory: not the kernel's layout
    assert efficient_backward(2, 4, 256, 64, grad_out=grad)[0] == 2 * 4 * 256 * 64 * 4


def test_efficient_attention_forward_accumulates_wide_half_heads_in_float():
    def forward(head, dtype):
        q = heads_first(1, 2, 128, head, dtype)
        return efficient("_scaled_dot_product_efficient_attention", q, q, q, None, compute_log_sumexp=True, dropout_p=0.0, is_causal=False)

    assert forward(256, torch.bfloat16) == [1 * 128 * 2 * 256 * 4]
    assert forward(128, torch.bfloat16) == []  # one pass over the value's columns: no buffer
    assert forward(256, torch.float32) == []  # fp32 accumulates in its output


def test_an_h100_fp32_training_step_holds_efficient_attention_workspace(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with torch.device("meta"):
        model = Attention(causal=False)
    memory = profile(model, torch.empty(4, 1000, 512, device="meta"), train=True, target="h100").memory
    # the cuBLAS workspaces of the two threads (32 MiB each on Hopper), and at the attention's
    # backward the kernel's moment: the row sums (4 x 8 x 1000 floats) and the query tiles, 16
    # blocks of 64 queries x (4 + 64 x 64) floats per (batch, head); it outweighs the moment ATen
    # computes the row sums (the product, 4 x 1000 x 8 x 64 floats, and the sums twice). The output's
    # gradient is the loss sum's, expanded from one number (strides 0): the kernel takes a copy.
    row_sums = 4 * 8 * 1000 * 4
    workspace = 4 * 8 * 16 * (4 + 64 * 64) * 4
    gradient = 4 * 1000 * 8 * 64 * 4
    assert row_sums + workspace > gradient + 2 * row_sums
    assert memory.category_max["workspace"] == 2 * 32 * MiB + gradient + row_sums + workspace


def embedding_backward(tokens, width, dtype=torch.float32, grad=None, scale_grad_by_freq=False):
    grad = grad if grad is not None else torch.empty(tokens, width, dtype=dtype, device="meta")
    indices = torch.empty(tokens, dtype=torch.long, device="meta")
    return on_gpu(torch.ops.aten.embedding_dense_backward.default, (grad, indices, 50000, -1, scale_grad_by_freq))


def test_an_embedding_backward_sorts_its_indices_and_sums_rows_in_float():
    # up to 3072 indices: one kernel over the features, nothing beside the gradient
    assert embedding_backward(3072, 768) == []
    # 4096 int64 indices: sorted and original positions, then four index arrays and two counters
    # while the rows' partial sums (one 768-wide float row per index) are summed
    n = 4096 * 8
    assert embedding_backward(4096, 768) == [n, n, n, 8, n, n, 8, n, 4096 * 768 * 4]
    # a bf16 gradient sums its rows in float; with scale_grad_by_freq, the counts too (and from 1 index on)
    assert embedding_backward(4096, 768, torch.bfloat16)[-1] == 4096 * 768 * 4
    assert embedding_backward(100, 64, scale_grad_by_freq=True) == [800, 800, 800, 800, 8, 800, 800, 8, 800, 100 * 64 * 4]


def test_an_embedding_backward_copies_a_broadcast_gradient():
    # the gradient of a sum, expanded from one number, is made contiguous first
    grad = torch.empty(1, 1, device="meta").expand(2000, 256)
    assert embedding_backward(2000, 256, grad=grad) == [2000 * 256 * 4]


def norm_backward(rows, width, gpu="h100", rms=False):
    x = torch.empty(rows, width, device="meta")
    w = torch.empty(width, device="meta")
    stats = torch.empty(rows, 1, device="meta")
    if rms:
        func, args = torch.ops.aten._fused_rms_norm_backward.default, (x, x, [width], stats, w, [True, True])
    else:
        func, args = torch.ops.aten.native_layer_norm_backward.default, (x, x, [width], stats, stats, w, w, [True, True, True])
    return on_gpu(func, args, gpu=gpu)


def test_layer_norm_backward_over_many_narrow_rows_sums_per_block_of_rows_first():
    # 70000 rows of 512: 16 column blocks of 32 (under 132 / 2 SMs), min(32768 / 16, 70000 / 32
    # rounded up) = 2048 blocks of rows, each a row of partial sums for the weight and the bias;
    # then .sum(0) of a [2048, 512] buffer: its result and that reduction's own staging
    partial = 2048 * 512 * 4
    staging = scratch(torch.empty(2048, 512, device="meta"), [0])
    assert norm_backward(70000, 512) == [partial, partial, 512 * 4, *staging]
    # RMS norm has no bias: one buffer
    assert norm_backward(70000, 512, rms=True) == [partial, 512 * 4, *staging]
    # up to 65536 rows, or as many column blocks as half the SMs: one pass, nothing beside the gradients
    assert norm_backward(65536, 512) == []
    assert norm_backward(70000, 66 * 32) == []  # H100: 132 SMs
    assert norm_backward(70000, 54 * 32, gpu="a100-80gb") == []  # 108 SMs
    assert norm_backward(70000, 53 * 32, gpu="a100-80gb")[0] == min(32768 // 53, -(-70000 // 32)) * 53 * 32 * 4


def test_cudnns_grid_sampler_copies_a_strided_grid_and_an_expanded_input():
    forward, backward = torch.ops.aten.cudnn_grid_sampler.default, torch.ops.aten.cudnn_grid_sampler_backward.default
    x = torch.empty(2, 8, 16, 16, device="meta")
    grid = torch.empty(2, 2, 5, 7, device="meta").permute(0, 2, 3, 1)  # channels-last coordinates
    assert on_gpu(forward, (x, grid.contiguous())) == []
    assert on_gpu(forward, (x, grid)) == [2 * 5 * 7 * 2 * 4]  # grid.contiguous()
    expanded = torch.empty(1, 8, 16, 16, device="meta").expand(2, -1, -1, -1)  # stride 0: contiguous() copies it
    grad = torch.empty(2, 8, 5, 7, device="meta")
    assert on_gpu(backward, (expanded, grid.contiguous(), grad)) == [2 * 8 * 16 * 16 * 4]
    single = torch.empty(1, 8, 5, 7, device="meta").as_strided((1, 8, 5, 7), (0, 35, 7, 1))  # stride 0 of a size-1 dim
    assert on_gpu(backward, (x[:1], grid[:1].contiguous(), single)) == []  # contiguous already: no copy


@pytest.mark.parametrize("loss", ["mse_loss", "smooth_l1_loss", "soft_margin_loss"])
def test_a_reduced_loss_computes_its_elementwise_loss_inside_the_call(loss):
    # the elementwise loss of a 64 x 4096 fp32 pair (1 MiB), then its mean: 262144 values into one
    # output, split across blocks as the GPU allows (the reduction's own staging, tested above)
    func = getattr(torch.ops.aten, loss).default
    x, target = (torch.empty(64, 4096, device="meta") for _ in range(2))
    out = torch.empty((), device="meta")
    elementwise = 64 * 4096 * 4
    staging = scratch(torch.empty(64 * 4096, device="meta"), [0])
    assert on_gpu(func, (x, target), {"reduction": 1}, out) == [elementwise, *staging]
    assert on_gpu(func, (x, target), {"reduction": 0}, torch.empty(64, 4096, device="meta")) == []


CUDNN_BACKWARD = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default


def cudnn_backward(batch, heads, sequence, head, kv_heads=None):
    """What SDPA's cuDNN backward takes beside its gradients, for bf16 q of (batch, heads, sequence, head)."""

    def tensor(h):
        return torch.empty(batch, h, sequence, head, dtype=torch.bfloat16, device="meta")

    q, k = tensor(heads), tensor(kv_heads or heads)
    stats = torch.empty(batch, heads, sequence, 1, device="meta")
    empty = torch.empty(0, device="meta")
    args = (tensor(heads), q, k, k, tensor(heads), stats, empty, empty, empty, empty, empty, sequence, sequence, 0.0, False)
    return on_gpu(CUDNN_BACKWARD, args)


def test_cudnn_attention_backward_keeps_the_frontends_float_tensors_in_its_workspace():
    # the cuDNN frontend's SDPA backward node: the row sums of dO * O, a float per query row and
    # head, and the query gradient's float accumulator, a float per element of the query; one workspace
    assert cudnn_backward(2, 16, 1000, 64) == [2 * 16 * 1000 * 4 + 2 * 16 * 1000 * 64 * 4]
    # grouped-query attention: both are the query's (the keys' and values' gradients need no
    # full-head copy outside packed layouts)
    assert cudnn_backward(1, 32, 2048, 128, kv_heads=8) == [32 * 2048 * 4 * (1 + 128)]


def test_an_h100_training_step_holds_cudnn_attention_backward_accumulators(monkeypatch):
    memory = attention_step(monkeypatch, "h100")
    # bf16 heads of 64 on sm_90 run cuDNN attention; at its backward: the cuBLAS workspaces (32 MiB
    # per thread on Hopper, no addmm) and the frontend's softmax_sum and dQ_accum
    assert memory.category_max["workspace"] == 2 * 32 * MiB + 4 * 8 * 1000 * 4 + 4 * 8 * 1000 * 64 * 4


# CUDA C Programming Guide, technical specifications per compute capability: maximum threads per SM,
# and shared memory a block can opt in to (KiB)
GUIDE = {
    (7, 0): (2048, 96),
    (7, 5): (1024, 64),
    (8, 0): (2048, 163),
    (8, 6): (1536, 99),
    (8, 7): (1536, 163),
    (8, 9): (1536, 99),
    (9, 0): (2048, 227),
    (10, 0): (2048, 227),
    (12, 0): (1536, 99),
    (12, 1): (1536, 99),
}


@pytest.mark.parametrize("capability", sorted(GUIDE))
def test_an_architecture_holds_the_cuda_guide_s_figures(capability):
    from pytest_modelprof.engine.targets.gpus import ARCHITECTURES

    row = ARCHITECTURES[capability]
    threads, kib = GUIDE[capability]
    assert (row.threads_per_sm, row.shared_memory_per_block) == (threads, kib * 1024)
    assert threads_per_sm(capability) == threads
    if capability >= (8, 0):  # Ampere on: the attention kernels for 164-228 KiB run where a block gets that much
        assert row.small_shared_memory == (kib < 128)
