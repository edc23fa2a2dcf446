"""Which module each FLOP belongs to, in forward, backward and recomputation."""

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from pytest_modelprof import profile

F = 8
LINEAR = 2 * 4 * F * F  # one bias-free F x F linear layer on a batch of 4


def linear():
    return nn.Linear(F, F, bias=False)


def x(requires_grad=True):
    return torch.randn(4, F, requires_grad=requires_grad)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = linear()
        self.b = linear()

    def forward(self, h):
        return self.b(self.a(h).relu())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(F, 2)

    def forward(self, h):
        return self.head(self.blocks(h) * 2)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_tree_totals_are_the_sum_of_self_figures(train):
    result = profile(Net(), x(), train=train)
    root = result.module("")
    assert root.forward_flops == result.forward_flops
    assert root.backward_flops == result.backward_flops
    assert sum(m.self_forward_flops for m in result.modules) == result.forward_flops
    assert sum(m.self_backward_flops for m in result.modules) == result.backward_flops
    for parent in result.modules:
        children = [m for m in result.modules if m.depth == parent.depth + 1 and m.path.startswith(parent.path)]
        if children:
            assert parent.forward_flops == parent.self_forward_flops + sum(c.forward_flops for c in children)


def test_leaves_hold_the_layer_flops():
    result = profile(Net(), x())
    assert result.module("blocks.0.a").forward_flops == LINEAR
    assert result.module("blocks.1.b").forward_flops == LINEAR
    # the block's own relu is not inside a child
    assert result.module("blocks.0").self_forward_flops == 4 * F
    assert result.module("").self_forward_flops == 4 * F  # the "* 2"


def test_module_called_several_times():
    class Thrice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = linear()

        def forward(self, h):
            return self.lin(self.lin(self.lin(h)))

    result = profile(Thrice(), x(), train=True)
    assert result.module("lin").calls == 3
    assert result.module("lin").forward_flops == 3 * LINEAR
    assert result.module("lin").backward_flops == result.backward_flops


def test_shared_module_is_attributed_to_the_parent_that_ran_it():
    shared = linear()

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = shared

        def forward(self, h):
            return self.lin(h)

    class TwoParents(nn.Module):
        def __init__(self):
            super().__init__()
            self.left = Holder()
            self.right = Holder()

        def forward(self, h):
            return self.right(self.left(self.left(h)))

    result = profile(TwoParents(), x(), train=True)
    assert result.module("left.lin").calls == 2
    assert result.module("right.lin").calls == 1
    assert result.module("left.lin").forward_flops == 2 * LINEAR
    assert result.module("right.lin").forward_flops == LINEAR
    assert result.module("right.lin").backward_flops == 2 * LINEAR
    assert result.params == F * F


def test_recursive_module_is_not_counted_twice():
    class Recursive(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = linear()

        def forward(self, h, depth=2):
            h = self.lin(h)
            return h if depth == 0 else self(h, depth - 1)

    result = profile(Recursive(), x(), train=True)
    root = result.module("")
    assert root.calls == 3
    assert root.forward_flops == result.forward_flops == 3 * LINEAR
    assert result.module("lin").forward_flops == 3 * LINEAR


def test_a_module_swapped_in_as_the_model_runs_gets_the_figures():
    # BigBird puts full attention in place of its block-sparse attention on a short sequence, in forward,
    # keeping the projections' weights
    class Swapping(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = linear()

        def forward(self, h):
            if isinstance(self.attention, nn.Linear):
                self.attention = nn.Sequential(self.attention)
            return self.attention(h * 2)

    result = profile(Swapping(), x(requires_grad=False))
    assert result.module("attention").type == "Linear"  # the row of the model as the run began
    assert result.module("attention").forward_flops == LINEAR  # holds what ran in its place
    assert (result.module("attention.0").params, result.module("attention.0").forward_flops) == (F * F, LINEAR)
    trained = profile(Swapping(), x(), train=True)
    assert trained.module("attention.0").backward_flops == 2 * LINEAR
    assert trained.module("attention.0").activation_bytes == 4 * F * 4  # its input (h * 2), saved for the weight gradient


def test_a_child_renamed_as_the_model_runs_runs_at_its_new_name():
    # the parent has run a child (so its children are known) before it moves another to a new name and calls it
    class Renaming(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.ReLU()
            self.old = linear()

        def forward(self, h):
            h = self.first(h)
            if hasattr(self, "old"):
                self.new = self.old
                del self.old
            return self.new(h)

    result = profile(Renaming(), x(requires_grad=False))
    assert (result.module("new").calls, result.module("new").forward_flops) == (1, LINEAR)
    assert result.module("old").calls == 0


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_checkpointing_reports_recomputation(reentrant):
    class Checkpointed(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, h):
            return checkpoint(self.block, h, use_reentrant=reentrant)

    plain = profile(Block(), x(), train=True)
    result = profile(Checkpointed(), x(), train=True)
    assert result.forward_flops == plain.forward_flops
    assert result.backward_flops == plain.backward_flops
    # the reentrant form recomputes the whole block; the non-reentrant form stops
    # as soon as the tensors the backward needs exist again (after a and relu)
    recomputed = 2 * LINEAR + 4 * F if reentrant else LINEAR + 4 * F
    assert result.recompute_flops == recomputed
    assert result.module("block.a").recompute_flops == LINEAR
    assert result.module("block").recompute_flops == recomputed


def test_operator_table_names_the_modules():
    result = profile(Net(), x(), train=True)
    mm = result.op("aten.mm", "forward")
    assert mm.modules == ["blocks.0.a", "blocks.0.b", "blocks.1.a", "blocks.1.b"]
    assert mm.calls == 4
    assert result.op("aten.addmm").modules == ["head"]
    assert sum(op.flops for op in result.ops) == result.flops


def test_loss_is_reported_apart_from_the_model():
    result = profile(Net(), x(), train=True, loss_fn=lambda out: out.sum() * 3)
    # forward: sum of 4 x 2 outputs (8), times 3 (1); backward: grad times 3 (1), expand (0)
    assert result.loss_flops == 8 + 1 + 1
    assert result.module("").flops == result.forward_flops + result.backward_flops
    assert result.flops == result.forward_flops + result.loss_flops + result.backward_flops


class Stack(nn.Module):
    """Blocks held in an nn.ModuleList and an nn.ModuleDict that the parent iterates over: the
    containers are never called themselves (GPT-2's ``transformer.h``)."""

    def __init__(self):
        super().__init__()
        self.h = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.heads = nn.ModuleDict({"a": nn.Linear(8, 2), "b": nn.Linear(8, 4)})

    def forward(self, x):
        for layer in self.h:
            x = layer(x)
        return self.heads["a"](x).sum() + self.heads["b"](x).sum()


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_containers_never_called_show_their_childrens_sums(train):
    result = profile(Stack(), torch.randn(5, 8), train=train)
    linear = 2 * 5 * 8 * 8 + 5 * 8  # multiply-adds and the bias, per Linear(8, 8)
    h = result.module("h")
    assert h.container and h.calls == 0
    assert h.forward_flops == 3 * linear
    assert h.forward_macs == 3 * 5 * 8 * 8
    assert h.backward_flops == sum(result.module(f"h.{i}").backward_flops for i in range(3))
    assert (h.backward_flops > 0) is train
    heads = result.module("heads")
    assert heads.container and heads.forward_flops == (2 * 5 * 8 * 2 + 5 * 2) + (2 * 5 * 8 * 4 + 5 * 4)
    assert h.peak_bytes == max(result.module(f"h.{i}").peak_bytes for i in range(3)) > 0
    assert h.share == pytest.approx(h.flops / result.flops)
    assert not result.module("").container and not result.module("h.0").container
    root = result.module("")
    assert h.forward_flops + heads.forward_flops + root.self_forward_flops == root.forward_flops


def test_an_unused_submodule_is_not_a_container():
    model = Stack()
    model.spare = nn.ModuleList([nn.Linear(8, 8)])  # never used
    result = profile(model, torch.randn(2, 8))
    assert not result.module("spare").container and result.module("spare").flops == 0
