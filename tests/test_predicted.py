"""Predicted step time on a target GPU: the roofline by hand, determinism across processes, budgets."""

import subprocess
import sys

import pytest
import torch
from torch import nn

from pytest_modelprof import GPUS, GPUSpec, profile
from pytest_modelprof.engine.targets.cost import kind_of
from pytest_modelprof.engine.targets.gpus import Calibration

FLAT = Calibration(
    efficiency={"matmul": 0.5, "conv": 0.5, "conv_grouped": 0.5, "attention": 0.5, "rnn": 0.5, "norm": 0.5, "memory": 0.8},
    half_flops={},
    kernel_seconds=2e-6,
    host_seconds=10e-6,
    view_seconds=1e-6,
)
GPU = GPUSpec("test-gpu", 80 * 2**30, 2e12, {"bfloat16": 1e15, "float32": 50e12, "tf32": 400e12}, 100, (9, 0), calibration=FLAT)


class MatMul(nn.Module):
    def forward(self, a, b):
        return a @ b


def test_one_compute_bound_matrix_product_by_hand():
    n = 8192
    a, b = (torch.empty(n, n, dtype=torch.bfloat16, device="meta") for _ in range(2))
    predicted = profile(MatMul(), (a, b), target=GPU).predicted
    flops = 2 * n**3
    kernel = flops / (1e15 * 0.5)  # bf16 tensor cores at half their peak: 1.1 ms, far above its 402 MB at 1.6 TB/s
    assert predicted.ops[0].op == "aten.mm" and predicted.ops[0].bound == "compute"
    assert predicted.ops[0].seconds == pytest.approx(kernel)
    assert predicted.ops[0].bytes == 3 * n * n * 2
    assert predicted.seconds == pytest.approx(10e-6 + kernel)  # issued by the host, then run
    assert not predicted.calibrated


def test_a_memory_bound_elementwise_op_and_the_launch_floor_by_hand():
    x = torch.empty(64 * 2**20, device="meta")  # 256 MiB of fp32
    predicted = profile(nn.ReLU(), x, target=GPU).predicted
    relu = predicted.ops[0]
    assert relu.bound == "memory"
    assert relu.seconds == pytest.approx(2 * 256 * 2**20 / (2e12 * 0.8))  # read and written
    tiny = profile(nn.ReLU(), torch.empty(16, device="meta"), target=GPU).predicted
    assert tiny.ops[0].bound == "launch" and tiny.ops[0].seconds == pytest.approx(2e-6)
    # a small model is host-bound: each op costs the host its issue time
    assert tiny.seconds == pytest.approx(10e-6 + 2e-6)


def test_kinds_of_kernels():
    assert kind_of("aten.addmm") == "matmul" and kind_of("aten.view") == "none"
    assert kind_of("aten.cudnn_batch_norm") == "norm" and kind_of("aten.cudnn_batch_norm_backward") == "norm_backward"
    assert kind_of("aten.add") == "memory"
    assert kind_of("aten._scaled_dot_product_cudnn_attention_backward") == "attention"
    args = (None,) * 8 + (32,)
    assert kind_of("aten.convolution", args) == "conv_grouped" and kind_of("aten.convolution", (None,) * 8 + (1,)) == "conv"


SCRIPT = """
import torch, torchvision
from pytest_modelprof import profile
with torch.device("meta"):
    model = torchvision.models.resnet18()
result = profile(model, torch.empty(8, 3, 224, 224, device="meta"), train=True, target="h100",
                 optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), memory=False)
print(repr(result.predicted.seconds))
"""


def test_the_prediction_is_the_same_in_another_process():
    with torch.device("meta"):
        import torchvision

        model = torchvision.models.resnet18()
    here = profile(
        model,
        torch.empty(8, 3, 224, 224, device="meta"),
        train=True,
        target="h100",
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        memory=False,
    )
    there = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout.strip()
    assert there == repr(here.predicted.seconds)  # to the last digit
    assert here.predicted.calibrated and "H100" in here.predicted.calibration
    assert GPUS["l4"].calibration.calibrated is False


def test_no_target_no_prediction():
    assert profile(nn.Linear(4, 4), torch.randn(2, 4)).predicted is None


def test_each_module_gets_the_predicted_time_of_what_ran_inside_it():
    model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Sequential(nn.Linear(4096, 4096), nn.ReLU()))
    result = profile(model, torch.empty(4096, 4096, device="meta"), train=True, target=GPU)
    seconds = {m.path: m.predicted_seconds for m in result.modules}
    assert seconds["2"] == pytest.approx(seconds["2.0"] + seconds["2.1"])
    assert seconds[""] == pytest.approx(seconds["0"] + seconds["1"] + seconds["2"])
    # the whole step's kernels: the model's, and the loss's outside it
    assert seconds[""] < result.predicted.gpu_seconds
    # two identical layers, but the first needs no gradient for its input: one matrix product less,
    # 2 * 4096^3 FLOPs on the float32 units (TF32 is off for matrix products) at half their peak
    assert seconds["2.0"] - seconds["0"] == pytest.approx(2 * 4096**3 / (50e12 * 0.5))
