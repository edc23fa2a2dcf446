"""Pieces of the kernel model the second H200 capture checks: cuDNN's layout transforms around a convolution
on tensor cores and attention's products reduced over the keys (read off its kernel names), and float32
products on TF32 tensor cores where the run allowed them."""

import dataclasses

import pytest
import torch

from benchmarks import gpu_truth
from pytest_modelprof import GPUS
from pytest_modelprof.engine.calibrate import step_seconds
from pytest_modelprof.engine.targets.cost import RELAYOUT_KERNELS, Work, kernel_seconds
from pytest_modelprof.engine.targets.gpus import FITTED
from pytest_modelprof.engine.targets.products import Gemm, gemms_of, relayout_bytes

H100 = GPUS["h100"]


def _meta(*shape, dtype=torch.float16):
    return torch.empty(shape, device="meta", dtype=dtype)


def _forward(x, w, stride=(1, 1), padding=(1, 1), groups=1):
    out = torch.nn.functional.conv2d(x, w, None, stride, padding, 1, groups)
    return (x, w, None, list(stride), list(padding), [1, 1], False, [0, 0], groups), out


def test_a_convolution_in_nchw_on_tensor_cores_moves_its_tensors_through_transforms_by_hand():
    x, w = _meta(8, 64, 32, 32), _meta(128, 64, 3, 3)
    args, y = _forward(x, w)
    # each of input, weight and output read and written once more: 2 bytes an element in float16
    by_hand = 2 * 2 * (8 * 64 * 32 * 32 + 128 * 64 * 3 * 3 + 8 * 128 * 32 * 32)
    assert relayout_bytes("aten.convolution", args, y) == by_hand
    # its backward pass: the output's gradient, the input and the weight in; the two gradients out
    gx, gw = _meta(*x.shape), _meta(*w.shape)
    backward = (y, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    assert relayout_bytes("aten.convolution_backward", backward, (gx, gw, None)) == 2 * 2 * (
        8 * 128 * 32 * 32 + 2 * 8 * 64 * 32 * 32 + 2 * 128 * 64 * 3 * 3
    )


def test_a_pointwise_a_channels_last_and_a_depthwise_convolution_run_without_transforms():
    x = _meta(8, 64, 32, 32)
    pointwise, y = _forward(x, _meta(128, 64, 1, 1), padding=(0, 0))
    assert relayout_bytes("aten.convolution", pointwise, y) == 0
    strided, y = _forward(x, _meta(128, 64, 1, 1), stride=(2, 2), padding=(0, 0))
    assert relayout_bytes("aten.convolution", strided, y) > 0  # a downsampling 1x1 is not a plain product
    last = x.to(memory_format=torch.channels_last)
    args, y = _forward(last, _meta(128, 64, 3, 3).to(memory_format=torch.channels_last))
    assert relayout_bytes("aten.convolution", args, y) == 0
    depthwise, y = _forward(x, _meta(64, 1, 3, 3), groups=64)  # ATen's own kernels in NCHW
    assert relayout_bytes("aten.convolution", depthwise, y) == 0


def test_the_transforms_are_priced_at_the_memorys_bandwidth_only_on_tensor_cores():
    calibration = FITTED
    relayout = 64 << 20
    gemm = (Gemm(8192, 256, 2304),)
    work = Work("aten.convolution", "conv", 2 * 8192 * 256 * 2304, 1 << 20, torch.float16, 1, gemm)
    plain, _ = kernel_seconds(H100, calibration, work)
    moved, _ = kernel_seconds(H100, calibration, work._replace(relayout=relayout))
    by_hand = relayout / (H100.bandwidth * calibration.efficiency["memory"]) + RELAYOUT_KERNELS * calibration.kernel_seconds
    assert moved - plain == pytest.approx(by_hand)
    # float32 with TF32 off runs cuDNN's kernels on CUDA cores, in NCHW: nothing added
    simt = work._replace(dtype=torch.float32, tf32=False)
    assert kernel_seconds(H100, calibration, simt._replace(relayout=relayout)) == kernel_seconds(H100, calibration, simt)


def test_attentions_product_is_reduced_over_the_keys_with_a_constant_of_its_own():
    q, k, v = _meta(2, 8, 1024, 64), _meta(2, 8, 4096, 64), _meta(2, 8, 4096, 64)
    (gemm,) = gemms_of("aten._scaled_dot_product_flash_attention", (q, k, v), None)
    assert (gemm.m, gemm.n, gemm.k) == (2 * 8 * 1024, 64, 4096)
    work = Work("aten._scaled_dot_product_flash_attention", "attention", 4 * 2 * 8 * 1024 * 4096 * 64, 0, torch.bfloat16, 1, (gemm,))
    own = dataclasses.replace(FITTED, gemm_half={**FITTED.gemm_half, "k": 10.0, "k_attention": 3000.0})
    products = dataclasses.replace(FITTED, gemm_half={"k": 3000.0, "k_simt": FITTED.gemm_half["k_simt"]})
    # a calibration without it prices attention with the products' constant
    assert kernel_seconds(H100, own, work) == pytest.approx(kernel_seconds(H100, products, work))
    shorter = dataclasses.replace(own, gemm_half={**own.gemm_half, "k_attention": 300.0})
    assert kernel_seconds(H100, shorter, work) < kernel_seconds(H100, own, work)


def test_a_records_float32_products_are_predicted_on_tf32_where_its_run_allowed_them():
    # h200-tf32.json: ViT-B/32's fp32 AdamW step with cuBLAS's products on TF32 took 24.7 ms on the H200,
    # 51.2 ms without (h200-b.json); each predicted with the flags its record ran with
    name, h200 = "vit_b_32-b64-train-fp32-adamw", GPUS["h200"]
    on, off = gpu_truth.records("h200-tf32")[name], gpu_truth.records("h200-b")[name]
    assert on["allow_tf32"]["matmul"] and not off["allow_tf32"]["matmul"]
    (tf32,), (plain,) = gpu_truth.observed(h200, {name: on}), gpu_truth.observed(h200, {name: off})
    predicted_on, predicted_off = step_seconds(h200, tf32, h200.calibration), step_seconds(h200, plain, h200.calibration)
    assert predicted_on < 0.7 * predicted_off
    for predicted, record in ((predicted_on, on), (predicted_off, off)):
        assert predicted == pytest.approx(record["step_ms_median"] / 1e3, rel=0.25)
    assert not torch.backends.cuda.matmul.allow_tf32  # the flags restored after each
