"""Whole architectures in analytic mode: nothing uncounted, and forward MACs equal to
the operation counts torchvision publishes with each model's weights metadata
(``weights.meta["_ops"]``, GMACs rounded to three decimals; no weights are downloaded)."""

import math

import pytest
import torch
import torchvision

from pytest_modelprof import profile

ARCHITECTURES = [
    "resnet50",
    "mobilenet_v3_small",
    "vit_b_16",
    "efficientnet_b0",
    "convnext_tiny",
    "swin_t",
    "densenet121",
    "shufflenet_v2_x0_5",
    "inception_v3",
    "maxvit_t",
]


def build(name):
    options = {"init_weights": False} if name == "inception_v3" else {}
    with torch.device("meta"):
        return torchvision.models.get_model(name, **options)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_forward_macs_match_torchvision(name):
    weights = torchvision.models.get_model_weights(name).DEFAULT
    size = weights.transforms().crop_size[0]
    result = profile(build(name), torch.randn(1, 3, size, size), device="meta")
    assert result.uncounted == {}
    assert math.isclose(result.forward_macs / 1e9, weights.meta["_ops"], rel_tol=1e-3, abs_tol=6e-4)
    assert result.params == weights.meta["num_params"]


BATCH = 2
# per model, by hand: the stem's MACs (its input needs no gradient, so its backward computes only the
# weight's) and what the backward adds beyond the two products per forward product
STEMS = {
    "resnet50": 112 * 112 * 64 * 3 * 7 * 7,  # 7x7 convolution, 3 -> 64 channels, 112 x 112 outputs
    "efficientnet_b0": 112 * 112 * 32 * 3 * 3 * 3,  # 3x3, 3 -> 32, 112 x 112
    "swin_t": 56 * 56 * 96 * 3 * 4 * 4,  # 4x4 patches, 3 -> 96, 56 x 56 (attention in plain products)
    "vit_b_16": 14 * 14 * 768 * 3 * 16 * 16,  # 16x16 patches, 3 -> 768, 14 x 14
}
# ViT's fused attention backward recomputes the scores: five products for the forward's two
# (Q K^T and P V, each 197 x 197 x 768 per layer), so half the attention's forward MACs more
RECOMPUTED = {"vit_b_16": 2 * 197 * 197 * 768 * 12 // 2}


@pytest.mark.parametrize("name", sorted(STEMS))
def test_training_step_is_fully_counted(name):
    result = profile(build(name), torch.randn(BATCH, 3, 224, 224), device="meta", train=True)
    assert result.uncounted == {}
    # every product's backward computes the input's gradient and the weight's: twice the forward
    expected = 2 * result.forward_macs - BATCH * STEMS[name] + BATCH * RECOMPUTED.get(name, 0)
    assert result.backward_macs == expected
