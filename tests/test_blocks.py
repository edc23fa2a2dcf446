"""Repeated blocks of an analytic FLOP count are replayed instead of run (observe/blocks.py): every
figure must be the one running each block gives, and a call whose replay could differ must run."""

import dataclasses
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from examples.gpt2 import GPT2, GPT2Config
from examples.llama import Llama, LlamaConfig
from pytest_modelprof import ProfileError, profile
from pytest_modelprof.engine.observe import blocks

MODES = {"eval": {}, "grad": {"no_grad": False}, "train": {"train": True}}
SHARED = nn.Parameter(torch.randn(16, 16))  # used by every block of one model, held by none


@pytest.fixture
def replays(monkeypatch):
    """The paths of the blocks replayed, in order."""
    seen = []
    replay = blocks.BlockMemo._replay

    def counting(self, block, recorded, args, kwargs):
        seen.append(self.tracker.frame_for(block)[0])
        return replay(self, block, recorded, args, kwargs)

    monkeypatch.setattr(blocks.BlockMemo, "_replay", counting)
    return seen


def both(monkeypatch, model, x, memory=False, **options):
    """The profile with the block memo, and without it."""
    replayed = profile(model, x, device="meta", memory=memory, **options)
    SHARED.grad = None  # a tensor outside the model, which the run does not give back its gradient
    with monkeypatch.context() as m:
        m.setattr(blocks, "repeated_blocks", lambda model: [])
        run = profile(model, x, device="meta", memory=memory, **options)
    SHARED.grad = None
    return replayed, run


class Block(nn.Module):
    def __init__(self, width=16, index=0):
        super().__init__()
        self.index = index  # not read: does not tell the blocks apart
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, block=Block, layers=4, width=16):
        super().__init__()
        self.embed = nn.Linear(width, width)  # every layer's input requires grad in training
        self.layers = nn.ModuleList(block(width, index) for index in range(layers))
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def tiny_llama():
    return Llama(dataclasses.replace(LlamaConfig.tiny(), layers=4)), torch.randint(0, 128, (2, 16))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "build",
    [
        lambda: (Stack(), torch.randn(2, 5, 16)),
        tiny_llama,
        lambda: (GPT2(dataclasses.replace(GPT2Config.tiny(), layers=4)), torch.randint(0, 256, (2, 16))),
    ],
    ids=["stack", "llama", "gpt2"],
)
def test_replayed_blocks_give_every_figure_of_running_them(monkeypatch, replays, build, mode):
    torch.manual_seed(0)
    model, x = build()
    replayed, run = both(monkeypatch, model, x, **MODES[mode])
    assert replays, "no block was replayed"
    assert replayed.to_dict() == run.to_dict()


def test_a_replayed_block_counts_what_running_it_counts_by_hand(replays):
    width, tokens = 16, 10
    result = profile(Stack(layers=3, width=width), torch.randn(2, 5, width), device="meta", memory=False, train=True)
    assert replays == ["layers.2"]  # the first call of a kind just runs, the second is recorded
    product = 2 * tokens * width * 4 * width  # one of the up projection's matrix products: 2 FLOPs per MAC
    first = result.module("layers.0.up")
    for index in range(3):
        up = result.module(f"layers.{index}.up")
        assert up.forward_flops == product + tokens * 4 * width  # and its bias, added
        assert up.backward_flops >= 2 * product  # the gradients of its input and of its weight
        assert (up.forward_flops, up.backward_flops, up.calls) == (first.forward_flops, first.backward_flops, 1)


class Windowed(Block):
    """Odd layers mask the upper triangle: what they run depends on an attribute they read."""

    def __init__(self, width=16, index=0):
        super().__init__(width, index)
        self.masked = index % 2 == 1

    def forward(self, x):
        h = self.up(self.norm(x))
        if self.masked:
            h = h.masked_fill(torch.ones(h.shape[-2], h.shape[-1], dtype=torch.bool, device=h.device).triu(), 0.0)
        return x + self.down(h)


def test_an_attribute_the_call_reads_tells_blocks_apart(monkeypatch, replays):
    replayed, run = both(monkeypatch, Stack(Windowed, layers=6), torch.randn(2, 5, 16), train=True)
    assert replayed.to_dict() == run.to_dict()
    ops = {i: {op.op for op in replayed.module(f"layers.{i}").ops} for i in range(6)}
    assert "aten.masked_fill" in ops[5] and "aten.masked_fill" not in ops[4]
    # the first runs, the next two are recorded (they read other values), each later one replays its like
    assert replays == ["layers.3", "layers.4", "layers.5"]


class Appends(Block):
    def __init__(self, width=16, index=0):
        super().__init__(width, index)
        self.seen = []

    def forward(self, x):
        self.seen.append(x.shape)
        return super().forward(x)


class Sets(Block):
    def forward(self, x):
        self.last_shape = x.shape
        return super().forward(x)


class Mutates(Block):
    def forward(self, x):
        x.mul_(2)
        return super().forward(x)


class Returns(Block):
    def forward(self, x):
        return x, super().forward(x)  # an argument handed back (T5's position bias): replayed as it is


class ReturnsView(Block):
    def forward(self, x):
        return x[:, 1:], super().forward(x)


class Stack2(Stack):
    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            _, x = layer(x)
        return self.head(x)


class Closes(Block):
    def forward(self, x):
        return super().forward(x) @ SHARED


class Reads(Block):
    def forward(self, x, flag):
        if flag.item() > 0:  # a value the run knows (made from a real input): not the same for every call
            x = x * 2
        return super().forward(x)


class StackFlag(Stack):
    def forward(self, x, flag):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x, flag)
        return self.head(x)


@pytest.mark.parametrize(
    ("model", "inputs"),
    [
        (lambda: Stack(Appends), lambda: torch.randn(2, 5, 16)),
        (lambda: Stack(Sets), lambda: torch.randn(2, 5, 16)),
        (lambda: Stack(Mutates), lambda: torch.randn(2, 5, 16)),
        (lambda: Stack2(ReturnsView), lambda: torch.randn(2, 5, 16)),
        (lambda: Stack(Closes), lambda: torch.randn(2, 5, 16)),
        (lambda: StackFlag(Reads), lambda: (torch.randn(2, 5, 16), torch.tensor(1))),
    ],
    ids=["appends", "sets", "mutates", "returns-view", "closes-over", "reads-value"],
)
def test_a_call_whose_replay_could_differ_runs(monkeypatch, replays, model, inputs):
    replayed, run = both(monkeypatch, model(), inputs(), train=True)
    assert replays == []
    assert replayed.to_dict() == run.to_dict()


class Checkpointed(Block):
    def forward(self, x):
        return checkpoint(super().forward, x, use_reentrant=False)


def test_activation_checkpointing_inside_a_block_is_replayed_with_its_recompute(monkeypatch, replays):
    replayed, run = both(monkeypatch, Stack(Checkpointed), torch.randn(2, 5, 16), train=True)
    assert replays
    assert replayed.recompute_flops > 0
    assert replayed.to_dict() == run.to_dict()


class Scaled(Block):
    def forward(self, x, scale, extra=None):
        out = super().forward(x) * scale
        return {"out": out, "twice": out * 2 if extra is None else out + extra["bias"]}


class StackKwargs(Stack):
    def forward(self, x):
        x = self.embed(x)
        for index, layer in enumerate(self.layers):
            x = layer(x, scale=1 + index % 2, extra=None if index < 2 else {"bias": x})["out"]
        return self.head(x)


def test_arguments_are_part_of_a_call_and_outputs_may_be_any_structure(monkeypatch, replays):
    model = StackKwargs(Scaled, layers=8)
    replayed, run = both(monkeypatch, model, torch.randn(2, 5, 16), train=True)
    assert replayed.to_dict() == run.to_dict()
    # (x, scale=1 or 2) for the first two, (x, scale, a dict holding a tensor) for the rest: layers 4 and 5
    # are recorded, the two after them replay
    assert replays == ["layers.6", "layers.7"]


@pytest.mark.parametrize("mode", MODES)
def test_an_argument_handed_back_is_the_argument(monkeypatch, replays, mode):
    replayed, run = both(monkeypatch, Stack2(Returns), torch.randn(2, 5, 16), **MODES[mode])
    assert replays == ["layers.2", "layers.3"]
    assert replayed.to_dict() == run.to_dict()


def test_a_hook_on_a_module_in_a_block_keeps_that_block_running(monkeypatch, replays):
    model = Stack()
    model.layers[2].up.register_forward_hook(lambda module, args, out: None)
    replayed, run = both(monkeypatch, model, torch.randn(2, 5, 16), train=True)
    assert replays == ["layers.3"]
    assert replayed.to_dict() == run.to_dict()


def test_batch_norm_in_training_updates_its_buffers_so_the_blocks_run(monkeypatch, replays):
    def bottleneck(width, index):
        return nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())

    class Convs(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(bottleneck(4, i) for i in range(3))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    x = torch.randn(2, 4, 8, 8)
    replayed, run = both(monkeypatch, Convs(), x, train=True)
    assert replays == []
    assert replayed.to_dict() == run.to_dict()
    replayed, run = both(monkeypatch, Convs(), x)
    assert replays == ["layers.2"]
    assert replayed.to_dict() == run.to_dict()


def test_blocks_under_autocast_replay_with_their_casts(monkeypatch, replays):
    replayed, run = both(monkeypatch, Stack(), torch.randn(2, 5, 16), train=True, autocast=torch.bfloat16)
    assert replays == ["layers.2", "layers.3"]
    assert any(op.op == "aten._to_copy" and op.phase == "forward" for op in replayed.module("layers.3.up").ops)
    assert replayed.to_dict() == run.to_dict()


def test_blocks_sharing_a_parameter_with_a_module_outside_them_run(monkeypatch, replays):
    model = Stack()
    model.head.weight = nn.Parameter(torch.randn(3, 16))
    model.layers[1].norm.weight = model.embed.bias  # tied: autocast would cast it once for both
    replayed, run = both(monkeypatch, model, torch.randn(2, 5, 16), train=True)
    assert "layers.1" not in replays and replays
    assert replayed.to_dict() == run.to_dict()


class Appending(Block):
    def forward(self, x, outs):
        y = super().forward(x)
        outs.append(y)
        return y


class Config:
    extra = 0


class Configured(Block):
    def __init__(self, width=16, index=0, config=None):
        super().__init__(width, index)
        self.config = config

    def forward(self, x):
        for _ in range(self.config.extra):  # an attribute of an object the block holds, set by its parent
            x = x * 2
        return super().forward(x)


class Outside(nn.Module):
    """Blocks whose caller changes what they see between calls, or calls them in ways a replay must follow."""

    def __init__(self, kind):
        super().__init__()
        self.kind, self.config = kind, Config()
        self.embed = nn.Linear(16, 16)
        self.layers = nn.ModuleList(
            Configured(config=self.config) if kind == "config" else Appending() if kind == "list" else Block() for _ in range(4)
        )

    def forward(self, x):
        x = self.embed(x)
        for index, layer in enumerate(self.layers):
            if self.kind == "list":
                outs = []
                x = layer(x, outs) + sum(outs)
            elif self.kind == "config":
                self.config.extra = index % 2
                x = layer(x)
            elif self.kind == "checkpoint":
                x = checkpoint(layer, x, use_reentrant=False)
            elif self.kind == "residual":
                x = x + layer(x)  # the block's input is used after it: the engine sums its two gradients
            elif self.kind == "twice":
                x = layer(layer(x))
            elif self.kind == "weight":
                x = layer(x)
        if self.kind == "weight":  # a parameter of a block, used by its parent too: its gradients sum first
            x = x * self.layers[1].norm.weight
        return x


@pytest.mark.parametrize("kind", ["list", "config", "checkpoint", "residual", "twice", "weight"])
def test_what_the_caller_does_around_a_block_is_followed(monkeypatch, replays, kind):
    replayed, run = both(monkeypatch, Outside(kind), torch.randn(2, 5, 16), train=True)
    assert replayed.to_dict() == run.to_dict()
    # (a block called again, or whose parameter its parent uses: the step runs again, with those blocks run)
    assert bool(replays) == (kind in ("config", "residual", "twice", "weight"))
    if kind == "config":
        assert replays == ["layers.3"]  # the only call after the two recorded that sees what one saw
    replayed, run = both(monkeypatch, Outside(kind), torch.randn(2, 5, 16), train=True, autocast=torch.bfloat16)
    assert replayed.to_dict() == run.to_dict()


class SubclassHook(nn.Module):
    """Wraps its subclasses' forward as transformers' GradientCheckpointingLayer does: a class made from one
    of them (a logging subclass, say) would wrap it again."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        forward = cls.forward

        def wrapped(self, *args):
            if type(self).forward is not wrapped:
                raise AssertionError("a subclass of the model's class ran")
            return checkpoint(forward, self, *args, use_reentrant=False) if self.training else forward(self, *args)

        cls.forward = wrapped


class Wrapped(SubclassHook):
    def __init__(self, width=16, index=0):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = functools.partial(F.gelu, approximate="tanh")  # made per module: alike when equal

    def forward(self, x):
        return self.act(self.fc(x))


def test_the_blocks_classes_are_their_own_while_a_call_is_recorded(monkeypatch, replays):
    model = Stack(Wrapped)
    replayed, run = both(monkeypatch, model, torch.randn(2, 5, 16))
    assert replays == ["layers.2", "layers.3"]
    assert replayed.to_dict() == run.to_dict()
    replayed, run = both(monkeypatch, model, torch.randn(2, 5, 16), train=True)  # checkpointed: each runs
    assert replayed.recompute_flops > 0
    assert replayed.to_dict() == run.to_dict()
    assert all(type(layer) is Wrapped for layer in model.layers)


class Attending(Block):
    def forward(self, x, mask):
        scores = (x @ x.transpose(-1, -2)) / 4 + mask  # -inf where masked: the run marks it as maybe not finite
        return x + self.down(F.gelu(self.up(self.norm(scores.softmax(-1) @ x))))


class Causal(Stack):
    def forward(self, x):
        x = self.embed(x)
        mask = torch.zeros(5, 5).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
        for layer in self.layers:
            x = layer(x, mask)
        return self.head(x)


@pytest.mark.parametrize("mode", MODES)
def test_blocks_behind_an_additive_mask_replay_their_outputs_maybe_not_finite(monkeypatch, replays, mode):
    replayed, run = both(monkeypatch, Causal(Attending, layers=5), torch.randn(2, 5, 16), **MODES[mode])
    assert replays == ["layers.3", "layers.4"]  # the first layer's input is finite, the others' maybe not
    assert replayed.to_dict() == run.to_dict()


def test_the_callers_modules_are_left_as_they_were_even_after_an_error():
    class Fails(Block):
        def forward(self, x):
            if self.index == 2:
                raise ValueError("layer two")
            return super().forward(x)

    model = Stack(Fails)
    with pytest.raises(ProfileError, match="layer two"):
        profile(model, torch.randn(2, 5, 16), device="meta", memory=False, train=True)
    for module in model.modules():
        assert "_compiled_call_impl" not in vars(module)
        assert not {"__getattribute__", "__setattr__", "__delattr__"} & set(vars(type(module)))  # (raised while recorded)
    assert [type(layer) for layer in model.layers] == [Fails] * 4


def test_memory_with_grad_and_real_runs_run_every_block(replays):
    model, x = Stack(), torch.randn(2, 5, 16)
    profile(model, x, device="meta", train=True)
    profile(model, x, device="meta", no_grad=False)
    profile(model, x, memory=False, train=True)
    assert replays == []


KEPT = []


class Keeps(Block):
    def forward(self, x):
        out = super().forward(x)
        KEPT.append(out * 2)  # a storage the call leaves behind that is not its output's
        return out


@pytest.mark.parametrize(
    "build",
    [
        lambda: (Stack(), torch.randn(2, 5, 16)),
        lambda: (Causal(Attending, layers=5), torch.randn(2, 5, 16)),
        lambda: (Stack2(Returns), torch.randn(2, 5, 16)),
        tiny_llama,
        lambda: (GPT2(dataclasses.replace(GPT2Config.tiny(), layers=4)), torch.randint(0, 256, (2, 16))),
    ],
    ids=["stack", "masked", "passes-on", "llama", "gpt2"],
)
def test_a_forward_pass_without_grad_replays_its_memory_moment_by_moment(monkeypatch, replays, build):
    model, x = build()
    replayed, run = both(monkeypatch, model, x, memory=True)
    assert replays
    assert replayed.memory.timeline == run.memory.timeline  # every op's moment, and the peak among them
    assert replayed.to_dict() == run.to_dict()


def test_a_call_that_leaves_memory_behind_runs(monkeypatch, replays):
    replayed, run = both(monkeypatch, Stack(Keeps), torch.randn(2, 5, 16), memory=True)
    KEPT.clear()
    assert replays == []
    assert replayed.to_dict() == run.to_dict()
