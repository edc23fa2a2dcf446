"""Norms, pooling, activations, embedding, upsampling and losses.

Hand figures follow the documented convention (pytest_modelprof.engine.formulas);
the sweep at the end checks that no op of any listed layer goes uncounted, in eval
and in train mode, and that every layer that computes reports non-zero FLOPs.
"""

import pytest
import torch
from torch import nn

from models import Fn
from pytest_modelprof import profile

N, C, S = 2, 4, 8
NUMEL = N * C * S * S


def x4():
    return torch.randn(N, C, S, S)


def test_batch_norm_inference_normalises_and_scales():
    assert profile(nn.BatchNorm2d(C), x4()).flops == 4 * NUMEL


def test_batch_norm_training_adds_statistics():
    result = profile(nn.BatchNorm2d(C), x4(), train=True)
    # statistics 4 + normalise 2 + affine 2 per element, and num_batches_tracked += 1
    assert result.forward_flops == 8 * NUMEL + 1


def test_cudnn_batch_norm_backward_costs_every_gradient():
    # cuDNN's batch-norm backward (CUDA training steps) computes all three gradients: with the batch's
    # statistics, grad_input 7 per element, grad_weight 2, grad_bias 1 (no GPU here: the formula, on meta tensors)
    from pytest_modelprof.engine.formulas import formula_for

    formula = formula_for(torch.ops.aten.cudnn_batch_norm_backward.default)
    x = torch.empty(N, C, S, S, device="meta")
    per_channel = torch.empty(C, device="meta")
    training = formula(
        x, x, per_channel, per_channel, per_channel, per_channel, per_channel, 1e-5, torch.empty(0, device="meta"), out_val=None
    )
    assert training.flops == (7 + 2 + 1) * NUMEL
    no_statistics = torch.empty(0, device="meta")
    evaluation = formula(x, x, per_channel, per_channel, per_channel, no_statistics, no_statistics, 1e-5, no_statistics, out_val=None)
    assert evaluation.flops == (2 + 2 + 1) * NUMEL


def test_layer_norm():
    assert profile(nn.LayerNorm(S), x4()).flops == 8 * NUMEL
    assert profile(nn.LayerNorm(S, elementwise_affine=False), x4()).flops == 6 * NUMEL


def test_group_norm_and_instance_norm():
    assert profile(nn.GroupNorm(2, C), x4()).flops == 8 * NUMEL
    assert profile(nn.InstanceNorm2d(C), x4()).flops == 6 * NUMEL


def test_rms_norm_decomposed():
    # x * rsqrt(mean(x^2) + eps) * weight: square, mean, multiply, weight per element;
    # add and rsqrt per row
    rows = NUMEL // S
    assert profile(nn.RMSNorm(S), x4()).flops == 4 * NUMEL + 2 * rows


def test_max_pool_compares_every_window_element():
    result = profile(nn.MaxPool2d(3, stride=2, padding=1), x4())
    assert result.flops == N * C * 4 * 4 * 9


def test_avg_pool_adds_and_divides():
    assert profile(nn.AvgPool2d(2), x4()).flops == N * C * 4 * 4 * (4 + 1)


def test_adaptive_average_pool_sums_exact_windows():
    # 8 -> 3 windows [0,3) [2,6) [5,8): 3 + 4 + 3 = 10 elements;
    # 8 -> 5 windows [0,2) [1,4) [3,5) [4,7) [6,8): 2 + 3 + 2 + 3 + 2 = 12
    result = profile(nn.AdaptiveAvgPool2d((3, 5)), x4())
    assert result.flops == N * C * 10 * 12 + N * C * 15


@pytest.mark.parametrize(
    "layer, per_element",
    [
        (nn.ReLU(), 1),
        (nn.Sigmoid(), 1),
        (nn.SiLU(), 2),
        (nn.GELU(), 5),
        (nn.GELU("tanh"), 9),
        (nn.Hardswish(), 5),
        (nn.Softmax(-1), 5),
        (nn.LogSoftmax(-1), 5),
    ],
)
def test_activation_cost_per_element(layer, per_element):
    assert profile(layer, x4()).flops == per_element * NUMEL


def test_relu_backward_is_one_per_element():
    x = x4().requires_grad_()
    assert profile(nn.ReLU(), x, train=True).backward_flops == NUMEL


def test_elementwise_arithmetic_counts_output_elements():
    class Arithmetic(nn.Module):
        def forward(self, a, b):
            return (a + b) * b - a / 2

    a, b = torch.randn(3, 5), torch.randn(5)
    assert profile(Arithmetic(), (a, b)).flops == 4 * 15


def test_embedding_lookup_is_data_movement():
    embedding = nn.Embedding(100, 16)
    indices = torch.randint(0, 100, (4, 7))
    result = profile(embedding, indices, train=True)
    assert result.macs == 0
    assert result.op("aten.embedding").calls == 1
    assert result.op("aten.embedding").flops == 0
    assert result.backward_flops == 4 * 7 * 16  # gradients added into the looked-up rows


def test_a_diagonals_gradient_is_data_movement():
    class Diagonal(nn.Module):  # a scale matrix's diagonal, as a MultivariateNormal's log-density reads it
        def forward(self, x):
            return torch.diagonal(x @ x.mT, dim1=-2, dim2=-1).log().sum()

    result = profile(Diagonal(), torch.randn(4, 3, 3).requires_grad_(), train=True, loss_fn=lambda out: out)
    assert result.uncounted == {}
    # its backward writes the gradient into zeros: 0 FLOPs; the rest is the products, log, sum and theirs
    assert result.op("aten.diagonal_backward").flops == 0


def test_upsampling():
    assert profile(nn.Upsample(scale_factor=2, mode="bilinear"), x4()).flops == 7 * NUMEL * 4
    nearest = profile(nn.Upsample(scale_factor=2), x4())
    assert nearest.flops == 0
    assert nearest.op("aten.upsample_nearest2d").calls == 1


class WithTarget(nn.Module):
    def __init__(self, loss, target):
        super().__init__()
        self.loss = loss
        self.register_buffer("target", target)

    def forward(self, x):
        return self.loss(x, self.target)


def test_cross_entropy_is_log_softmax_and_gather():
    logits = torch.randn(6, 10)
    model = WithTarget(nn.CrossEntropyLoss(), torch.randint(0, 10, (6,)))
    assert profile(model, logits).flops == 5 * 60 + 6


def test_mse_loss_forward_and_backward():
    x = torch.randn(6, 10, requires_grad=True)
    result = profile(WithTarget(nn.MSELoss(), torch.randn(6, 10)), x, train=True)
    assert result.forward_flops == 3 * 60
    assert result.backward_flops == 3 * 60


@pytest.mark.parametrize(("p", "weight"), [(1, None), (2, torch.rand(10))])
def test_multi_margin_loss_by_hand(p, weight):
    # per sample of 10 scores, 9 hinges max(0, 1 - x[y] + x[j]): 2 to form, 1 to test, 1 to sum, a square
    # for p = 2, a weight; a divide per sample and the mean's sum; backward, per hinge the same 3, the
    # gradient (2 g z for p = 2), the weight and the target's update, then the incoming gradient's multiply
    x = torch.randn(6, 10, requires_grad=True)
    result = profile(WithTarget(nn.MultiMarginLoss(p=p, weight=weight), torch.randint(0, 10, (6,))), x, train=True)
    extra = int(p == 2) + int(weight is not None)
    assert result.forward_flops == 6 * 9 * (4 + extra) + 6 + 6
    assert result.backward_flops == 6 * 9 * (4 + extra + int(p == 2)) + 60


def test_multilabel_margin_loss_counts_the_listed_pairs():
    # a sample's targets are its row up to the first -1: here 2 targets (7 other classes) and 3 (6
    # others); a hinge per (target, other class): 4 forward, 5 backward
    target = torch.tensor([[1, 4, -1, 0, 0, 0, 0, 0, 0], [0, 2, 8, -1, 3, 3, 3, 3, 3]])
    x = torch.randn(2, 9, requires_grad=True)
    result = profile(WithTarget(nn.MultiLabelMarginLoss(), target), x, train=True)
    pairs = 2 * 7 + 3 * 6
    assert result.uncounted == {}
    assert result.forward_flops == 4 * pairs + 2 + 2
    assert result.backward_flops == 5 * pairs + 18


def images():
    return torch.randn(N, C, S, S)


SWEEP = {
    "BatchNorm1d": (nn.BatchNorm1d(C), torch.randn(3, C, 5)),
    "BatchNorm3d": (nn.BatchNorm3d(C), torch.randn(2, C, 3, 3, 3)),
    "InstanceNorm2d-affine": (nn.InstanceNorm2d(C, affine=True, track_running_stats=True), images()),
    "LocalResponseNorm": (nn.LocalResponseNorm(2), images()),
    "MaxPool1d": (nn.MaxPool1d(2), torch.randn(2, C, 8)),
    "MaxPool3d": (nn.MaxPool3d(2), torch.randn(1, 2, 4, 4, 4)),
    "AvgPool1d": (nn.AvgPool1d(2), torch.randn(2, C, 8)),
    "AvgPool3d": (nn.AvgPool3d(2), torch.randn(1, 2, 4, 4, 4)),
    "AdaptiveAvgPool1d": (nn.AdaptiveAvgPool1d(3), torch.randn(2, C, 8)),
    "AdaptiveAvgPool3d": (nn.AdaptiveAvgPool3d(2), torch.randn(1, 2, 5, 5, 5)),
    "AdaptiveMaxPool2d": (nn.AdaptiveMaxPool2d(3), images()),
    "LPPool2d": (nn.LPPool2d(2, 2), images()),
    **{
        name: (getattr(nn, name)(), images())
        for name in """ReLU6 LeakyReLU PReLU ELU SELU CELU Mish Hardsigmoid Hardtanh Tanh Softplus Softsign
        Tanhshrink LogSigmoid Hardshrink Softshrink GLU""".split()
    },
    "Softmin": (nn.Softmin(-1), images()),
    "Dropout": (nn.Dropout(0.5), images()),
    "Dropout2d": (nn.Dropout2d(0.5), images()),
    "Upsample-bicubic": (nn.Upsample(scale_factor=2, mode="bicubic"), images()),
    "Upsample-linear": (nn.Upsample(scale_factor=2, mode="linear"), torch.randn(2, C, 8)),
    "Upsample-trilinear": (nn.Upsample(scale_factor=2, mode="trilinear"), torch.randn(1, 2, 4, 4, 4)),
    "CosineSimilarity": (nn.CosineSimilarity(), (images(), images())),
    "EmbeddingBag": (nn.EmbeddingBag(10, 8), torch.randint(0, 10, (3, 4))),
    "L1Loss": (WithTarget(nn.L1Loss(), torch.randn(4, 5)), torch.randn(4, 5)),
    "NLLLoss2d": (WithTarget(nn.NLLLoss(), torch.randint(0, 5, (2, 3, 3))), torch.randn(2, 5, 3, 3)),
    "BCELoss": (WithTarget(nn.BCELoss(), torch.rand(4, 5)), torch.rand(4, 5)),
    "BCEWithLogitsLoss": (WithTarget(nn.BCEWithLogitsLoss(), torch.rand(4, 5)), torch.randn(4, 5)),
    "SmoothL1Loss": (WithTarget(nn.SmoothL1Loss(), torch.randn(4, 5)), torch.randn(4, 5)),
    "HuberLoss": (WithTarget(nn.HuberLoss(), torch.randn(4, 5)), torch.randn(4, 5)),
    "KLDivLoss": (WithTarget(nn.KLDivLoss(reduction="batchmean"), torch.rand(4, 5)), torch.randn(4, 5)),
    "CrossEntropy-smoothing": (WithTarget(nn.CrossEntropyLoss(label_smoothing=0.1), torch.randint(0, 5, (4,))), torch.randn(4, 5)),
    "ReflectionPad2d": (nn.ReflectionPad2d(1), images()),
    "ReplicationPad2d": (nn.ReplicationPad2d(1), images()),
}


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", sorted(SWEEP))
def test_every_op_is_counted(name, train):
    layer, inputs = SWEEP[name]
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    inputs = tuple(t.clone().requires_grad_(train and t.is_floating_point()) for t in inputs)
    result = profile(layer, inputs, train=train)
    assert result.uncounted == {}
    moves_data_only = name.startswith(("ReflectionPad", "ReplicationPad")) or (name.startswith("Dropout") and not train)
    assert (result.forward_flops == 0) == moves_data_only
    if train:
        assert result.backward_flops > 0


def test_weight_norm_by_hand():
    """w = g * v / ||v||, one norm per output row: forward 3 per weight element (square, add, multiply)
    and 2 per row (root, divide); backward 5 per element and 3 per row."""
    layer = nn.utils.parametrizations.weight_norm(nn.Linear(32, 16))
    result = profile(layer, torch.randn(4, 32), train=True)
    assert result.uncounted == {}
    assert result.op("aten._weight_norm_interface").flops == 3 * 16 * 32 + 2 * 16
    assert result.op("aten._weight_norm_interface_backward").flops == 5 * 16 * 32 + 3 * 16


def test_a_compiled_module_is_profiled_as_its_eager_ops_without_warnings(recwarn):
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    x = torch.randn(4, 16)
    assert profile(torch.compile(model), x).flops == profile(model, x).flops
    assert not [w for w in recwarn if "global hooks" in str(w.message)]


def test_polar_is_a_cosine_a_sine_and_two_products_per_element():
    # Llama 4's rotary frequencies: torch.polar(ones, angles)
    result = profile(Fn(torch.polar), (torch.ones(4, 8), torch.rand(4, 8)))
    assert result.uncounted == {}
    assert result.op("aten.polar").flops == 4 * 32
