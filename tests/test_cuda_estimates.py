"""Labelled estimates of CUDA memory beyond allocated bytes, from the caching allocator's documented policy.

Every figure here follows from c10/cuda/CUDACachingAllocator.cpp's rules: requests
rounded to 512 bytes; up to 1 MiB from 2 MiB segments; larger ones from 20 MiB
segments below 10 MiB, else rounded up to 2 MiB; best fit, splits, merges.
"""

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from pytest_modelprof import profile
from pytest_modelprof.engine.targets.allocator import cublas_workspace_bytes, reserved_bytes, workspace_bytes
from pytest_modelprof.report.tables import format_memory_report

KiB, MiB = 1 << 10, 1 << 20


@pytest.mark.parametrize(
    ("events", "reserved"),
    [
        ([(1, 4 * KiB)], 2 * MiB),  # a small request: one small segment
        ([(1, MiB), (2, MiB), (3, MiB)], 4 * MiB),  # two 1 MiB blocks per small segment
        ([(1, 3 * MiB)], 20 * MiB),  # large, under 10 MiB: a 20 MiB segment
        ([(1, 3 * MiB), (2, 3 * MiB)], 20 * MiB),  # ... whose rest serves the next one
        ([(1, 11 * MiB)], 12 * MiB),  # 10 MiB and over: rounded up to 2 MiB
        ([(1, 12 * MiB), (1, -1), (2, 12 * MiB)], 12 * MiB),  # a freed block is reused
        ([(1, 12 * MiB), (1, -1), (2, 14 * MiB)], 26 * MiB),  # ... but not grown: a new segment
        ([(1, 6 * MiB), (2, 6 * MiB), (3, 6 * MiB), (1, -1), (2, -1), (4, 12 * MiB)], 20 * MiB),  # free neighbours merge
    ],
)
def test_the_caching_allocator_model(events, reserved):
    assert reserved_bytes(events) == reserved


def test_cublas_workspace_from_its_configuration(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert cublas_workspace_bytes((8, 0)) == 4096 * KiB * 2 + 16 * KiB * 8  # torch's default before Hopper
    assert cublas_workspace_bytes((9, 0)) == 32 * MiB

    # per thread that ran products: the step's and the autograd engine's; cuBLASLt's 1 MiB for addmm
    def step(*threads):
        return sum(workspace_bytes((9, 0), ops) for ops in threads)

    assert step({"aten.addmm"}, set()) == 33 * MiB  # inference with nn.Linear, measured on an H100
    assert step({"aten.addmm"}, {"aten.mm"}) == 65 * MiB  # training, measured
    assert step({"aten.relu"}, set()) == 0
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2:16:8")
    assert cublas_workspace_bytes((8, 0)) == (4096 + 16) * KiB


def on_fake_cuda(model, shape):
    """``model`` and an input of ``shape`` as fake tensors claiming a CUDA device: no GPU needed."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake = mode.fake_tensor_converter.from_meta_and_device
    for name, param in list(model.named_parameters()):
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, nn.Parameter(fake(mode, param.to("meta"), torch.device("cuda"))))
    return fake(mode, torch.empty(shape, device="meta"), torch.device("cuda"))


def test_a_cuda_target_holds_the_cublas_workspace_and_reports_labelled_estimates_beside_its_peak(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:1")  # a 4 MiB workspace on any GPU
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "512")  # and cuBLASLt's of 512 kiB, for addmm
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    x = on_fake_cuda(model, (64, 1024))
    memory = profile(model, x, no_grad=False).memory
    # the workspaces (4.5 MiB) and the 4 MiB weight share one 20 MiB segment; the rest, each at
    # most 256 kiB (bias, second weight, input, activations), fits in one 2 MiB small segment
    assert memory.estimates == {"reserved_bytes": 22 * MiB, "cudnn_workspace_bytes": None, "cuda_context_bytes": None}
    # allocated bytes: the workspace is held through the whole step (an earlier step allocated it)
    workspace = 4 * MiB + 512 * KiB
    assert memory.peak_breakdown["workspace"] == memory.category_max["workspace"] == workspace
    assert all(row[memory.categories.index("workspace")] == workspace for _, row in memory.timeline)
    weights = (1024 * 1024 + 1024 + 1024 * 10 + 10) * 4
    assert workspace + weights < memory.peak_bytes < workspace + weights + MiB  # the estimates are not added in
    report = format_memory_report(profile(model, x, no_grad=False))
    assert "estimates for the CUDA process, not in the peak above:" in report
    assert "CUDA context" in report and "not estimated" in report
    assert "cuDNN's largest convolution workspace: not known here, missing from the peak" in report


def test_no_matrix_product_no_cublas_workspace():
    model = nn.Sequential(nn.ReLU())
    x = on_fake_cuda(model, (256, 1024))
    memory = profile(model, x).memory
    assert memory.category_max["workspace"] == 0
    assert memory.estimates["reserved_bytes"] == 2 * MiB  # 1 MiB input and output: two blocks of one small segment


def test_cpu_runs_have_no_cuda_estimates():
    assert profile(nn.Linear(4, 4), torch.ones(2, 4)).memory.estimates == {}


def test_the_report_shows_what_the_allocator_measured_beside_the_model():
    result = profile(nn.Linear(4, 4), torch.randn(2, 4), train=True)
    assert result.memory.measured == {}  # not a real CUDA run
    result.memory.measured = {"start_allocated_bytes": 0, "max_allocated_bytes": 3 * MiB, "max_reserved_bytes": 20 * MiB}
    report = format_memory_report(result)
    assert "measured by the caching allocator over the step: max allocated 3.15 MB, max reserved 20.97 MB" in report
