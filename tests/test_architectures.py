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


@pytest.mark.parametrize("name", ["resnet50", "vit_b_16", "swin_t", "efficientnet_b0"])
def test_training_step_is_fully_counted(name):
    result = profile(build(name), torch.randn(2, 3, 224, 224), device="meta", train=True)
    assert result.uncounted == {}
    # grads for activations and weights: about twice the forward, less for the first
    # layer (no input grad), more where fused attention recomputes its scores
    assert 1.8 < result.backward_macs / result.forward_macs < 2.1
