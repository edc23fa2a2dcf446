"""The memory meter against hand-derived figures (bytes of float32 tensors: 4 per element)."""

import weakref

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from pytest_modelprof import profile
from pytest_modelprof.engine.meters.memory import CUDA_BLOCK, TEMPORARIES, MemoryMeter

N, A, B, C = 16, 32, 64, 8


def stack():
    return nn.Sequential(nn.Linear(A, B, bias=False), nn.ReLU(), nn.Linear(B, C, bias=False))


PARAM_BYTES = 4 * (A * B + B * C)


@pytest.mark.parametrize("device", [None, "meta"], ids=["real", "analytic"])
def test_linear_stack_training_step(device):
    result = profile(stack(), torch.randn(N, A), train=True, device=device)
    memory = result.memory
    # the ReLU output is saved (by ReLU and by the second Linear: one storage); the
    # first Linear saves only its input, which is the caller's input, not an activation
    assert result.peak_activation_bytes == 4 * N * B
    assert result.module("1").activation_bytes == 4 * N * B
    assert memory.category_max["parameters"] == PARAM_BYTES
    assert memory.category_max["inputs"] == 4 * N * A
    # the input needs no gradient: gradients are exactly the weights'
    assert memory.category_max["gradients"] == PARAM_BYTES
    assert memory.peak_bytes == max(sum(row) for _, row in memory.timeline)
    assert memory.peak_bytes < sum(memory.category_max.values())  # a true peak, not a sum of maxima


def test_inference_activations_are_the_intermediate_tensors_alive_at_once():
    result = profile(stack(), torch.randn(N, A))
    # nothing is saved for a backward pass: the first Linear's output and the ReLU's, alive together
    assert result.peak_activation_bytes == 4 * N * B + 4 * N * B
    assert result.memory.category_max["activations"] == 0
    # weights, input, and at most two layer outputs alive at once
    assert result.peak_memory_bytes == PARAM_BYTES + 4 * N * A + 4 * N * B + 4 * N * B


def test_views_and_in_place_ops_add_nothing_contiguous_copies():
    class Reshapes(nn.Module):
        def forward(self, x):
            y = x * 2  # one new storage
            y.relu_()
            return y.transpose(0, 1).reshape(-1)  # a transpose is a view; flattening it copies

    class Views(nn.Module):
        def forward(self, x):
            y = x * 2
            y.relu_()
            return y.view(-1)[: N * A]

    x = torch.randn(N, A)
    assert profile(Views(), x).peak_memory_bytes == 4 * N * A * 2
    assert profile(Reshapes(), x).peak_memory_bytes == 4 * N * A * 3


class PositionTable(nn.Module):
    """Holds a fixed position table as a plain attribute (not a buffer), as VideoMAE does, and adds a
    view of it to its input: memory the step never allocates."""

    def __init__(self):
        super().__init__()
        self.table = torch.randn(1, N, A)

    def forward(self, x):
        h = x + self.table.detach().type_as(x)
        h.add_(self.table.detach())
        return h * 2


@pytest.mark.parametrize("device", [None, "meta"], ids=["real", "analytic"])
def test_views_of_a_tensor_held_outside_the_step_are_not_allocations(device):
    x = torch.randn(2, N, A)
    # the input and, at the peak, the sum and the product
    assert profile(PositionTable(), x, device=device).peak_memory_bytes == 4 * 2 * N * A * 3


@pytest.mark.parametrize(
    "make, state_per_param",
    [
        (lambda p: torch.optim.Adam(p), 2),
        (lambda p: torch.optim.AdamW(p, fused=True), 2),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 1),
        (lambda p: torch.optim.SGD(p, lr=0.1), 0),
    ],
    ids=["adam", "adamw-fused", "sgd-momentum", "sgd"],
)
def test_optimizer_state(make, state_per_param):
    model = stack()
    result = profile(model, torch.randn(N, A), train=True, optimizer=make(model.parameters()))
    step_counters = 4 * 2 if state_per_param == 2 else 0  # Adam: one float32 step per tensor
    assert result.memory.category_max["optimizer_state"] == state_per_param * PARAM_BYTES + step_counters


def test_frozen_layers_get_no_gradients_nor_state():
    model = stack()
    model[0].requires_grad_(False)
    trainable = 4 * B * C
    result = profile(model, torch.randn(N, A), train=True, optimizer=torch.optim.Adam(model[2].parameters()))
    assert result.memory.category_max["gradients"] == trainable
    assert result.memory.category_max["optimizer_state"] == 2 * trainable + 4


def test_checkpointing_shrinks_activations():
    class Checkpointed(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = stack()

        def forward(self, x):
            return checkpoint(self.body, x, use_reentrant=False)

    x = torch.randn(N, A, requires_grad=True)
    plain = profile(stack(), x, train=True)
    saved = profile(Checkpointed(), x, train=True)
    assert plain.peak_activation_bytes == 4 * N * B
    assert saved.peak_activation_bytes == 0  # only the caller's input is kept
    assert saved.recompute_flops > 0


def test_cuda_targets_round_to_allocator_blocks():
    meter = MemoryMeter(round_to=CUDA_BLOCK)
    small, large = torch.empty(3), torch.empty(1000)
    meter.track(small, TEMPORARIES)
    meter.track(large, TEMPORARIES)
    meter.sample("forward", ())
    assert meter.peak == 512 + 4096  # 12 bytes -> one block; 4000 bytes -> 8 blocks
    meter.stop()


def test_no_finalizer_outlives_the_run():
    before = len(weakref.finalize._registry)
    result = profile(stack(), torch.randn(N, A), train=True)
    assert len(weakref.finalize._registry) == before
    assert result.memory is not None


def test_memory_can_be_left_out():
    result = profile(stack(), torch.randn(N, A), memory=False)
    assert result.memory is None and result.peak_memory_bytes is None


def test_a_module_called_twice_keeps_both_calls_activations():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = nn.Sequential(nn.Linear(A, A, bias=False), nn.ReLU())

        def forward(self, x):
            return self.block(self.block(x))

    result = profile(Twice(), torch.randn(N, A), train=True)
    # each call saves its ReLU output, and the second call's Linear saves the first's:
    # two N x A float32 tensors, both alive until the backward pass
    assert result.peak_activation_bytes == 2 * 4 * N * A
    assert result.module("block").activation_bytes == 2 * 4 * N * A


def test_half_precision_parameters_take_half_the_bytes():
    full = profile(stack(), torch.randn(N, A), train=True)
    half = profile(stack().to(torch.bfloat16), torch.randn(N, A, dtype=torch.bfloat16), train=True)
    assert half.memory.category_max["parameters"] * 2 == full.memory.category_max["parameters"]
    assert half.memory.category_max["gradients"] * 2 == full.memory.category_max["gradients"]
    assert half.peak_activation_bytes * 2 == full.peak_activation_bytes


def test_inference_with_grad_enabled_keeps_what_autograd_saves():
    with_grad = profile(stack(), torch.randn(N, A), no_grad=False)
    assert with_grad.memory.category_max["activations"] == 4 * N * B  # the ReLU output, as in training
    assert with_grad.peak_activation_bytes == 4 * N * B + 4 * N * B  # beside the first Linear's output
    assert with_grad.backward_flops == 0
    assert profile(stack(), torch.randn(N, A)).memory.category_max["activations"] == 0


@pytest.mark.parametrize("device", [None, "meta"], ids=["real", "analytic"])
def test_gradients_zeroed_in_place_are_resident_from_the_start(device):
    model = stack()
    freed = profile(model, torch.randn(N, A), train=True, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), device=device)
    zeroed = profile(
        model, torch.randn(N, A), train=True, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), set_to_none=False, device=device
    )
    first_phase, first_row = zeroed.memory.timeline[0]
    gradients = zeroed.memory.categories.index("gradients")
    assert first_phase == "forward" and first_row[gradients] == PARAM_BYTES
    assert freed.memory.timeline[0][1][gradients] == 0
    assert zeroed.peak_memory_bytes > freed.peak_memory_bytes
    # backward adds the new gradients into the zeroed ones: one add per weight
    assert zeroed.backward_flops == freed.backward_flops + PARAM_BYTES // 4


def test_set_to_none_belongs_to_a_training_step():
    from pytest_modelprof import ProfileError

    with pytest.raises(ProfileError, match="pass train=True"):
        profile(stack(), torch.randn(N, A), set_to_none=False)


@pytest.mark.parametrize("device", [None, "meta"], ids=["real", "analytic"])
def test_autocast_saves_half_precision_activations(device):
    full = profile(stack(), torch.randn(N, A), train=True, device=device)
    mixed = profile(stack(), torch.randn(N, A), train=True, autocast=torch.bfloat16, device=device)
    assert full.module("1").activation_bytes == 4 * N * B
    assert mixed.module("1").activation_bytes == 2 * N * B  # the ReLU keeps its bf16 output
    assert mixed.memory.category_max["gradients"] == PARAM_BYTES  # fp32 weights get fp32 gradients
    assert mixed.forward_flops == full.forward_flops


def test_module_peaks_in_forward_and_backward():
    result = profile(stack(), torch.randn(N, A), train=True)
    head = result.module("2")
    # its forward runs with the weights, the input, and the ReLU output alive, and makes
    # its N x C output; its backward runs later, with gradients around
    assert head.forward_peak_bytes == PARAM_BYTES + 4 * N * A + 4 * N * B + 4 * N * C
    assert head.backward_peak_bytes > 0
    assert result.module("").peak_bytes == result.peak_memory_bytes


def test_a_sparse_gradient_is_its_indices_and_values():
    # nn.Embedding(sparse=True): the weight's gradient is a sparse COO tensor with no storage of
    # its own, holding one int64 index and one row of values per looked-up token
    tokens = torch.randint(0, 1000, (8, 10))
    emb = nn.Embedding(1000, 32, sparse=True)
    result = profile(emb, tokens, train=True, optimizer=torch.optim.SGD(emb.parameters(), lr=0.1))
    sparse_gradient = 80 * 8 + 80 * 32 * 4
    assert result.memory.category_max["gradients"] >= sparse_gradient
    assert result.memory.category_max["gradients"] < 1000 * 32 * 4  # never the dense weight's size
    analytic = profile(emb, tokens, train=True, optimizer=torch.optim.SGD(emb.parameters(), lr=0.1), device="meta")
    assert analytic.flops == result.flops
