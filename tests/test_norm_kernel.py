"""The weight-gradient kernel of layer and RMS norm's backward pass (engine/targets/norm_kernel.py)."""

import dataclasses

import pytest
import torch

from pytest_modelprof.engine.formulas import FormulaTable
from pytest_modelprof.engine.meters import Op
from pytest_modelprof.engine.meters.predicted import op_features
from pytest_modelprof.engine.targets.catalog import GPUS
from pytest_modelprof.engine.targets.cost import kernel_seconds
from pytest_modelprof.engine.targets.gpus import FITTED
from pytest_modelprof.engine.targets.norm_kernel import weight_gradient, weight_gradient_seconds

aten = torch.ops.aten
H200 = GPUS["h200"]


def layer_norm_backward(rows, width, dtype=torch.bfloat16, mask=(True, True, True)):
    def meta(*shape, dtype=dtype):
        return torch.empty(*shape, dtype=dtype, device="meta")

    args = (meta(rows, width), meta(rows, width), [width], meta(rows, 1, dtype=torch.float32), meta(rows, 1, dtype=torch.float32))
    args = (*args, meta(width), meta(width), list(mask))
    out = aten.native_layer_norm_backward.default(*args)
    op = Op(aten.native_layer_norm_backward.default, "aten.native_layer_norm_backward", args, {}, out, "backward", (), None)
    return op_features(op, FormulaTable(), "cuda")


def test_the_weight_gradient_kernel_is_priced_where_the_weights_gradients_are_asked_for():
    work = layer_norm_backward(4096, 768)
    assert (work.columns, work.elements, work.kernels) == (768, 4096 * 768, 2)  # the input's gradient's kernel, then the weights'
    inputs_only = layer_norm_backward(4096, 768, mask=(True, False, False))
    assert (inputs_only.columns, inputs_only.kernels) == (0, 1)
    weights_only = layer_norm_backward(4096, 768, mask=(False, True, True))  # a frozen input: the weights' kernel alone
    assert (weights_only.columns, weights_only.kernels) == (768, 1)
    assert weight_gradient("aten.native_layer_norm", ()) == 0


def test_its_blocks_take_32_columns_each_and_walk_every_row():
    rate = 10.0
    calibration = dataclasses.replace(FITTED, efficiency={**FITTED.efficiency, "norm_columns_rate": rate})
    # 768 columns: 24 blocks of 32, each reading the output's gradient and the input once more, row after row
    work = layer_norm_backward(4096, 768)
    assert weight_gradient_seconds(H200, calibration, work.columns, work.elements) == pytest.approx(
        2 * 4096 * 768 / (24 * rate * H200.boost_clock)
    )
    # as many blocks as SMs and more: every SM at work
    wide = layer_norm_backward(1024, 8192)
    assert weight_gradient_seconds(H200, calibration, wide.columns, wide.elements) == pytest.approx(
        2 * 1024 * 8192 / (H200.sm_count * rate * H200.boost_clock)
    )
    # over 65536 rows of few columns the rows are split across blocks: the bytes, not the blocks, set its time
    assert weight_gradient_seconds(H200, calibration, 96, 100352 * 96) == 0.0
    # a calibration fitted before the rate prices the kernel by its bytes
    assert (
        weight_gradient_seconds(
            H200, dataclasses.replace(FITTED, efficiency={**calibration.efficiency, "norm_columns_rate": 0}), 768, 4096 * 768
        )
        == 0.0
    )


def test_the_blocks_time_counts_where_it_outlasts_the_bytes():
    calibration = dataclasses.replace(FITTED, efficiency={**FITTED.efficiency, "norm_columns_rate": 10.0})
    without = dataclasses.replace(FITTED, efficiency={k: v for k, v in FITTED.efficiency.items() if k != "norm_columns_rate"})
    narrow = layer_norm_backward(25088, 192, torch.float32)  # 6 blocks: far slower than its bytes, and bound by them
    assert kernel_seconds(H200, calibration, narrow)[0] > 2 * kernel_seconds(H200, without, narrow)[0]
    assert kernel_seconds(H200, calibration, narrow)[1] == "compute"
    square = layer_norm_backward(16384, 4096)  # 128 blocks: its bytes
    assert kernel_seconds(H200, calibration, square)[0] == pytest.approx(kernel_seconds(H200, without, square)[0])
