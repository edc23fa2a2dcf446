"""Higher-order operators: flex attention, torch.cond, while_loop, scan, map, invoke_subgraph, and one the
engine does not know, against hand-derived figures, in real, meta and target runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._C import DispatchKey
from torch._higher_order_ops.map import map as higher_order_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from pytest_modelprof import ProfileError, profile

HEADS, HEAD_DIM = 4, 16
WIDTH = HEADS * HEAD_DIM


def _causal(b, h, q, kv):
    return q >= kv


class FlexSelfAttention(nn.Module):
    """Self-attention through flex attention, its block mask made in the forward pass (as models make it)."""

    def __init__(self, causal: bool = False, block: int = 128, score_mod=None) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.causal, self.block, self.score_mod = causal, block, score_mod

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        mask = create_block_mask(_causal, None, None, tokens, tokens, device=x.device, BLOCK_SIZE=self.block) if self.causal else None
        return flex_attention(q, k, v, score_mod=self.score_mod, block_mask=mask).transpose(1, 2).reshape(batch, tokens, WIDTH)


def _projection_macs(batch: int, tokens: int) -> int:
    return batch * tokens * WIDTH * 3 * WIDTH


def _flex_row(profile_, phase: str = "forward"):
    (row,) = [r for r in profile_.ops if r.op.startswith("higher_order.flex_attention") and r.phase == phase]
    return row


@pytest.mark.parametrize("where", [{}, {"device": "meta"}, {"target": "h100"}])
def test_flex_attention_without_a_mask_counts_dense_attentions_products(where):
    batch, tokens = 2, 96
    result = profile(FlexSelfAttention(), torch.randn(batch, tokens, WIDTH), **where)
    scores = batch * HEADS * tokens * tokens
    assert result.macs == _projection_macs(batch, tokens) + scores * (HEAD_DIM + HEAD_DIM)  # Q K^T and P V per score
    assert not result.uncounted


def test_flex_attention_on_a_target_counts_the_blocks_a_causal_mask_keeps():
    # 200 tokens in blocks of 64: query blocks of 64, 64, 64 and 8 rows; query block i computes key blocks 0..i
    batch, tokens, block = 1, 200, 64
    rows = [64, 64, 64, 8]
    computed = sum(rows[i] * sum(rows[: i + 1]) for i in range(4))  # 4096 + 8192 + 12288 + 1600
    result = profile(FlexSelfAttention(causal=True, block=block), torch.randn(batch, tokens, WIDTH), target="h100")
    row = _flex_row(result)
    assert row.macs == batch * HEADS * computed * (HEAD_DIM + HEAD_DIM)
    dense = profile(FlexSelfAttention(block=block), torch.randn(batch, tokens, WIDTH), target="h100")
    assert _flex_row(dense).macs == batch * HEADS * tokens * tokens * 2 * HEAD_DIM


def test_flex_attention_counts_score_mods_work_per_computed_score():
    tokens = 64
    plain = _flex_row(profile(FlexSelfAttention(), torch.randn(1, tokens, WIDTH), target="h100"))
    biased = _flex_row(
        profile(FlexSelfAttention(score_mod=lambda s, b, h, q, kv: s + (q - kv)), torch.randn(1, tokens, WIDTH), target="h100")
    )
    assert biased.macs == plain.macs
    assert biased.flops - plain.flops == 2 * HEADS * tokens * tokens  # a subtraction and an addition per score


def test_flex_attention_trains_on_a_target_with_the_fused_kernels_backward():
    batch, tokens = 1, 128
    result = profile(FlexSelfAttention(causal=True, block=64), torch.randn(batch, tokens, WIDTH), train=True, target="h100")
    backward = _flex_row(result, "backward")
    computed = batch * HEADS * (64 * 64 + 64 * 128)  # two query blocks: one key block, then two
    # recomputed scores, dV, dP, dQ and dK: 3 d_qk + 2 d_v MACs per computed score
    assert backward.macs == computed * (3 * HEAD_DIM + 2 * HEAD_DIM)
    assert _flex_row(result).macs == computed * 2 * HEAD_DIM


def test_flex_attention_on_a_target_holds_its_output_and_log_sum_exp_not_the_scores():
    batch, tokens = 1, 1024
    result = profile(FlexSelfAttention(), torch.randn(batch, tokens, WIDTH), target="h100")
    row = _flex_row(result)
    output = batch * tokens * WIDTH * 4
    log_sum_exp = batch * HEADS * tokens * 4
    assert output + log_sum_exp <= row.allocated_bytes < batch * HEADS * tokens * tokens * 4  # the scores would be 16 MB


class Branches(nn.Module):
    def __init__(self, from_weights: bool = False) -> None:
        super().__init__()
        self.one, self.two = nn.Linear(8, 8), nn.Linear(8, 8)
        self.from_weights = from_weights

    def forward(self, x: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
        predicate = self.one.weight.sum() > 0 if self.from_weights else flag
        return torch.cond(predicate, lambda y: self.one(y), lambda y: self.two(self.two(y)), (x,))


LINEAR = 2 * 4 * 8 * 8 + 4 * 8  # one nn.Linear(8, 8) on 4 rows: products and bias


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize(("flag", "linears"), [(True, 1), (False, 2)])
def test_cond_counts_the_branch_taken(device, flag, linears):
    result = profile(Branches(), (torch.randn(4, 8), torch.tensor(flag)), device=device)
    assert result.flops == linears * LINEAR


def test_cond_trains_the_branch_taken_and_its_closed_over_parameters():
    result = profile(Branches(), (torch.randn(4, 8), torch.tensor(False)), train=True)
    assert result.forward_flops == 2 * LINEAR
    # the second linear's weight and bias gradients twice, and the input gradient between them once
    assert result.backward_macs == 2 * 4 * 8 * 8 + 4 * 8 * 8
    assert result.module("two").backward_flops > 0 and result.module("one").backward_flops == 0


def test_cond_on_a_value_an_analytic_run_does_not_have_says_so_in_one_line():
    with pytest.raises(ProfileError, match=r"torch\.cond: its predicate is computed from values") as caught:
        profile(Branches(from_weights=True), (torch.randn(4, 8), torch.tensor(True)), device="meta")
    assert "\n" not in str(caught.value)


class Loop(nn.Module):
    def __init__(self, steps: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8))
        self.steps = steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return while_loop(lambda i, y: i < self.steps, lambda i, y: (i + 1, y @ self.weight), (torch.tensor(0), x))[1]


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_while_loop_counts_every_iteration(device):
    result = profile(Loop(5), torch.randn(4, 8), device=device)
    (products,) = [r for r in result.ops if r.op == "aten.mm"]
    assert (products.calls, products.macs) == (5, 5 * 4 * 8 * 8)


class Scanned(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8))

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        return scan(lambda carry, x: (carry @ self.weight + x, carry.sum(-1)), torch.zeros(4, 8), xs)[0]


class Mapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8))

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        return higher_order_map(lambda x, w: x @ w, xs, self.weight)


class Subgraph(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.higher_order.invoke_subgraph(lambda y: self.inner(y), "body", x)


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize(("model", "shape", "steps"), [(Scanned, (6, 4, 8), 6), (Mapped, (5, 4, 8), 5)])
def test_scan_and_map_count_every_slice(device, model, shape, steps):
    result = profile(model(), torch.randn(*shape), device=device)
    products = [r for r in result.ops if r.op in ("aten.mm", "aten.bmm", "aten.matmul")]
    assert sum(r.macs for r in products) == steps * 4 * 8 * 8


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_invoke_subgraph_counts_its_body_under_the_calling_module(device):
    result = profile(Subgraph(), torch.randn(4, 8), device=device)
    assert result.flops == LINEAR
    assert result.module("inner").forward_flops == LINEAR


class _Doubling(HigherOrderOperator):
    def __init__(self) -> None:
        super().__init__("modelprof_test_doubling")

    def __call__(self, x):
        return super().__call__(x)


doubling = _Doubling()
doubling.py_impl(DispatchKey.CompositeExplicitAutograd)(lambda x: x * 2)
doubling.py_impl(FakeTensorMode)(lambda mode, x: torch.empty_like(x))
doubling.py_autograd_impl(lambda x: x * 2)


class UsesDoubling(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return doubling(x)


def test_an_unknown_higher_order_operator_is_a_one_line_error_that_says_how_to_count_it():
    with pytest.raises(
        ProfileError, match=r"no rule for the higher-order operator torch\.ops\.higher_order\.modelprof_test_doubling.*formulas="
    ) as caught:
        profile(UsesDoubling(), torch.randn(3))
    assert "\n" not in str(caught.value) and "Dispatcher" not in str(caught.value)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_formula_counts_an_unknown_higher_order_operator_as_one_op(device):
    result = profile(UsesDoubling(), torch.randn(3), device=device, formulas={doubling: lambda x, out_val=None: x.numel()})
    assert result.flops == 3
    assert [r.op for r in result.ops] == ["higher_order.modelprof_test_doubling"]


class BiasedFlex(nn.Module):
    """A score_mod that reads a parameter it closes over (a per-head bias slope, ALiBi-style)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.slopes = nn.Parameter(torch.randn(HEADS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q_idx, kv_idx: s + self.slopes[h] * (q_idx - kv_idx)).sum(1)


@pytest.mark.parametrize("train", [False, True])
def test_a_score_mod_reading_a_parameter_is_counted_on_a_target(train):
    tokens = 64
    plain = _flex_row(profile(FlexSelfAttention(), torch.randn(1, tokens, WIDTH), target="h100"))
    result = profile(BiasedFlex(), torch.randn(1, tokens, WIDTH), target="h100", train=train)
    assert not result.uncounted
    assert _flex_row(result).flops - plain.flops == 3 * HEADS * tokens * tokens  # a subtraction, a product and an addition per score
    if train:
        assert _flex_row(result, "backward").macs == HEADS * tokens * tokens * 5 * HEAD_DIM


class PaddedFlex(nn.Module):
    """Flex attention under a padding mask made in the forward pass from a mask input (as Hugging Face makes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        padding = keep.to(device=x.device, dtype=torch.bool)
        mask = create_block_mask(
            lambda b, h, q_idx, kv_idx: padding[b, kv_idx], batch, None, tokens, tokens, device=x.device, BLOCK_SIZE=128
        )
        return flex_attention(q, k, v, block_mask=mask).sum(1)


def test_flex_attention_on_a_target_reads_a_padding_mask_from_the_inputs():
    tokens = 256
    keep = torch.ones(2, tokens, dtype=torch.long)
    keep[1, :128] = 0  # the second sequence's first key block is all padding: no query block computes it
    result = profile(PaddedFlex(), (torch.randn(2, tokens, WIDTH), keep), target="h100")
    assert not result.uncounted
    computed = HEADS * (4 + 2) * 128 * 128  # 2 x 2 blocks for the first sequence, 2 x 1 for the second
    assert _flex_row(result).macs == computed * 2 * HEAD_DIM


class ScannedCell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(8, 8, bias=False)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        return scan(lambda h, x: (self.cell(h) + x, h), torch.zeros(4, 8), xs)[0]


class LoopedCell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(8, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, self.cell(y)), (torch.tensor(0), x))[1]


class MappedCell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(8, 8, bias=False)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        return higher_order_map(lambda x: self.cell(x), xs)


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize(
    ("model", "shape", "steps", "input_grads"),
    # steps calls of the cell on 4 x 8; the backward forms every weight gradient, and the gradient of each step's
    # input but the first (the scan starts from zeros, the loop from the input; the map's slices are inputs)
    [(ScannedCell, (5, 4, 8), 5, 4), (LoopedCell, (4, 8), 3, 2), (MappedCell, (6, 4, 8), 6, 0)],
)
def test_training_through_scan_while_loop_and_map_reaches_the_parameters_their_bodies_close_over(device, model, shape, steps, input_grads):
    result = profile(model(), torch.randn(*shape), train=True, device=device)
    assert result.forward_macs == steps * 4 * 8 * 8
    assert result.backward_macs == (steps + input_grads) * 4 * 8 * 8
