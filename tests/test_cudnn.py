"""cuDNN's convolution workspaces on a CUDA target, asked of the cuDNN that PyTorch loads here with a
description of the target GPU in place of a device: which convolutions ATen hands to cuDNN and how
it describes them (aten/src/ATen/native/Convolution.cpp, cudnn/Conv_v8.cpp), worked out by hand,
and the workspace held at the convolution's moment of a step."""

import pytest
import torch
from torch import nn

from pytest_modelprof import GPUS, profile
from pytest_modelprof.engine.meters import memory as memory_meter
from pytest_modelprof.engine.ops import bound_arguments
from pytest_modelprof.engine.targets import cudnn
from pytest_modelprof.engine.targets.scratch import convolution_workspaces

needs_cudnn = pytest.mark.skipif(cudnn.library() is None, reason="no cuDNN 9.8 or later loads here (a CPU-only PyTorch)")
CONV = torch.ops.aten.convolution.default
CONV_BACKWARD = torch.ops.aten.convolution_backward.default
H100 = cudnn.Device.of(GPUS["h100"])


def contiguous(*sizes, dtype=torch.float32, alignment=32):
    strides, running = [], 1
    for size in reversed(sizes):
        strides.insert(0, running)
        running *= size
    return cudnn.Tensor(tuple(sizes), tuple(strides), dtype, alignment)


def channels_last(n, c, h, w, dtype=torch.float32):
    return cudnn.Tensor((n, c, h, w), (h * w * c, 1, w * c, c), dtype)


def block(size):
    """A caching-allocator block: ``size`` rounded up to 512 bytes."""
    return -(-size // 512) * 512


def meta(*sizes, dtype=torch.float32):
    return torch.empty(*sizes, dtype=dtype, device="meta")


# a 3x3 convolution of 8 x 64 x 56 x 56 float32, padded to keep its size
CONV3X3 = cudnn.Convolution(
    cudnn.FORWARD, contiguous(8, 64, 56, 56), contiguous(64, 64, 3, 3), contiguous(8, 64, 56, 56), (1, 1), (1, 1), (1, 1)
)


def forward_operations(input, weight, out, stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False, groups=1):
    args = (input, weight, None, list(stride), list(padding), list(dilation), transposed, [0] * len(stride), groups)
    return cudnn.convolutions("aten.convolution", bound_arguments(CONV, args, {}), out)


def test_a_convolution_is_described_to_cudnn_as_aten_describes_it():
    x, w, y = meta(8, 64, 56, 56), meta(128, 64, 3, 3), meta(8, 128, 28, 28)
    (operation,) = forward_operations(x, w, y, stride=(2, 2))
    assert operation == cudnn.Convolution(
        cudnn.FORWARD, contiguous(8, 64, 56, 56), contiguous(128, 64, 3, 3), contiguous(8, 128, 28, 28), (1, 1), (2, 2), (1, 1)
    )
    # channels-last input: every tensor is described in that layout
    (operation,) = forward_operations(x.to(memory_format=torch.channels_last), w, y, stride=(2, 2))
    assert (operation.x, operation.w, operation.y) == (
        channels_last(8, 64, 56, 56),
        channels_last(128, 64, 3, 3),
        channels_last(8, 128, 28, 28),
    )
    # ... but not in float64, which cuDNN runs in the contiguous layout
    double = forward_operations(x.double().to(memory_format=torch.channels_last), w.double(), y.double(), stride=(2, 2))[0]
    assert double.x == contiguous(8, 64, 56, 56, dtype=torch.float64)
    # one spatial dimension becomes two, the first of size 1 (view4d)
    (operation,) = forward_operations(meta(4, 16, 100), meta(32, 16, 5), meta(4, 32, 98), stride=(1,), padding=(0,), dilation=(1,))
    assert operation.x == contiguous(4, 16, 1, 100) and operation.w == contiguous(32, 16, 1, 5)
    assert (operation.padding, operation.stride, operation.dilation) == ((0, 0), (1, 1), (1, 1))
    # a view that starts 4 floats into its storage is aligned to 16 bytes
    offset = torch.empty(4 + 8 * 64 * 56 * 56, device="meta")[4:].view(8, 64, 56, 56)
    assert forward_operations(offset, w, y, stride=(2, 2))[0].x.alignment == 16


def test_which_convolutions_cudnn_runs():
    # a depthwise convolution in the contiguous layout runs ATen's own kernels; channels-last, cuDNN
    x, depthwise = meta(8, 32, 28, 28), meta(32, 1, 3, 3)
    assert forward_operations(x, depthwise, meta(8, 32, 28, 28), groups=32) == []
    assert len(forward_operations(x.to(memory_format=torch.channels_last), depthwise, meta(8, 32, 28, 28), groups=32)) == 1
    # grouped but not depthwise: cuDNN
    assert len(forward_operations(x, meta(32, 8, 3, 3), meta(8, 32, 28, 28), groups=4)) == 1
    # integers and complex numbers do not go to cuDNN, nor an empty batch
    assert forward_operations(meta(8, 32, 28, 28, dtype=torch.complex64), meta(32, 32, 3, 3, dtype=torch.complex64), None) == []
    assert forward_operations(meta(0, 32, 28, 28), meta(32, 32, 3, 3), meta(0, 32, 28, 28)) == []


def test_a_transposed_convolution_is_cudnns_backward_data_operation():
    # conv_transpose2d(x: 8x64x14x14, w: 64x32x4x4, stride 2, padding 1) -> 8x32x28x28 is the gradient
    # of the input of the convolution of a 8x32x28x28 tensor by w
    x, w, y = meta(8, 64, 14, 14), meta(64, 32, 4, 4), meta(8, 32, 28, 28)
    (operation,) = forward_operations(x, w, y, stride=(2, 2), padding=(1, 1), transposed=True)
    assert operation.operation == cudnn.BACKWARD_DATA
    assert (operation.x, operation.w, operation.y) == (contiguous(8, 32, 28, 28), contiguous(64, 32, 4, 4), contiguous(8, 64, 14, 14))


@pytest.mark.parametrize("transposed", [False, True])
def test_a_convolutions_backward_pass_runs_two_operations_input_gradient_first(transposed):
    x, w, grad = (
        meta(8, 64, 14, 14),
        meta(64, 32, 4, 4) if transposed else meta(32, 64, 3, 3),
        meta(8, 32, 28, 28) if transposed else meta(8, 32, 14, 14),
    )
    stride, padding = ([2, 2], [1, 1]) if transposed else ([1, 1], [1, 1])
    args = (grad, x, w, [32], stride, padding, [1, 1], transposed, [0, 0], 1, [True, True, True])
    outputs = (torch.empty_like(x), torch.empty_like(w), meta(32))
    data, weight = cudnn.convolutions("aten.convolution_backward", bound_arguments(CONV_BACKWARD, args, {}), outputs)
    dx, dw, dy = contiguous(*x.shape), contiguous(*w.shape), contiguous(*grad.shape)
    if transposed:  # the input's gradient is a forward convolution of the output's gradient
        assert (data.operation, data.x, data.w, data.y) == (cudnn.FORWARD, dy, dw, dx)
        assert (weight.operation, weight.x, weight.y) == (cudnn.BACKWARD_FILTER, dy, dx)
    else:
        assert (data.operation, data.x, data.w, data.y) == (cudnn.BACKWARD_DATA, dx, dw, dy)
        assert (weight.operation, weight.x, weight.y) == (cudnn.BACKWARD_FILTER, dx, dy)
    # the weight's gradient alone
    args = (*args[:-1], [False, True, False])
    (only,) = cudnn.convolutions("aten.convolution_backward", bound_arguments(CONV_BACKWARD, args, {}), outputs)
    assert only.operation == cudnn.BACKWARD_FILTER


def test_the_errata_pytorch_applies_pass_over_engines():
    three_d = cudnn.Convolution(
        cudnn.BACKWARD_DATA, contiguous(2, 8, 4, 8, 8), contiguous(8, 8, 3, 3, 3), contiguous(2, 8, 4, 8, 8), (1,) * 3, (1,) * 3, (1,) * 3
    )
    assert cudnn._erratum(three_d, 23, 91900, (9, 0))
    assert not cudnn._erratum(three_d, 22, 91900, (9, 0))
    two_d = cudnn.Convolution(
        cudnn.FORWARD, contiguous(2, 8, 8, 8), contiguous(8, 8, 3, 3), contiguous(2, 8, 8, 8), (1,) * 2, (1,) * 2, (1,) * 2
    )
    assert cudnn._erratum(two_d, 5, 92400, (9, 0)) and not cudnn._erratum(two_d, 5, 92500, (9, 0))
    assert cudnn._erratum(two_d, 58, 92400, (12, 0)) and not cudnn._erratum(two_d, 58, 92400, (9, 0))


@needs_cudnn
@pytest.mark.parametrize("capability", sorted({spec.compute_capability for spec in GPUS.values()}))
def test_cudnn_sizes_one_workspace_for_the_gpus_of_one_architecture(capability):
    # cuDNN's heuristics rank plans by architecture: an H100 SXM, an H100 PCIe and an H200 (132, 114 and
    # 132 SMs, other clocks and memory) get one plan for one convolution, and so one workspace
    sizes = {
        name: cudnn.workspace_bytes(CONV3X3, cudnn.Device.of(spec)) for name, spec in GPUS.items() if spec.compute_capability == capability
    }
    assert len(set(sizes.values())) == 1, sizes
    assert all(isinstance(size, int) and size >= 0 for size in sizes.values())


@needs_cudnn
def test_no_workspace_is_known_when_cudnn_times_its_plans(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    assert cudnn.workspace_bytes(CONV3X3, H100) is None


@needs_cudnn
def test_an_inference_convolution_holds_its_workspace_beside_its_input_and_output():
    with torch.device("meta"):
        model = nn.Conv2d(64, 64, 3, padding=1)
    workspace = cudnn.workspace_bytes(CONV3X3, H100)
    assert workspace  # TF32 tensor-core engines take one for this shape
    result = profile(model, meta(8, 64, 56, 56), target="h100")
    # the weight, the bias (a 512-byte block), the input and the output, and cuDNN's workspace
    tensors = block(64 * 64 * 9 * 4) + block(64 * 4) + 2 * block(8 * 64 * 56 * 56 * 4)
    assert result.peak_memory_bytes == tensors + block(workspace)
    assert result.memory.peak_breakdown["workspace"] == block(workspace)
    assert result.memory.estimates["cudnn_workspace_bytes"] == block(workspace)


@needs_cudnn
def test_a_training_convolution_holds_each_gradients_workspace_on_its_own(monkeypatch):
    held = []
    stock = memory_meter.MemoryMeter._hold

    def hold(self, op, sizes):
        if sizes and op.name == "aten.convolution_backward":
            held.append(sizes)
        stock(self, op, sizes)

    monkeypatch.setattr(memory_meter.MemoryMeter, "_hold", hold)
    with torch.device("meta"):
        model = nn.Conv2d(32, 64, 3, padding=1, bias=False)
    profile(model, meta(8, 32, 28, 28), target="h100", train=True)
    dx, dw, dy = contiguous(8, 32, 28, 28), contiguous(64, 32, 3, 3), contiguous(8, 64, 28, 28)
    expected = [cudnn.workspace_bytes(cudnn.Convolution(cudnn.BACKWARD_FILTER, dx, dw, dy, (1, 1), (1, 1), (1, 1)), H100)]
    # the input needs no gradient: the weight's operation alone, its workspace held alone
    assert held == [[block(size)] for size in expected if size]


def test_without_cudnn_the_workspace_is_said_to_be_unknown(monkeypatch):
    monkeypatch.setattr(cudnn, "library", lambda: None)
    x, w, y = meta(8, 64, 56, 56), meta(64, 64, 3, 3), meta(8, 64, 56, 56)
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert convolution_workspaces("aten.convolution", CONV, args, {}, y, H100) is None
    # ATen's depthwise kernel takes no cuDNN workspace, known or not
    args = (meta(8, 64, 56, 56), meta(64, 1, 3, 3), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 64)
    assert convolution_workspaces("aten.convolution", CONV, args, {}, y, H100) == []
    with torch.device("meta"):
        model = nn.Conv2d(64, 64, 3, padding=1)
    result = profile(model, meta(8, 64, 56, 56), target="h100")
    assert result.memory.estimates["cudnn_workspace_bytes"] is None
    assert result.memory.peak_breakdown["workspace"] == 0
