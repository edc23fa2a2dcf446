"""Predicted step time on a target GPU: the roofline by hand, determinism across processes, budgets."""

import dataclasses
import math
import subprocess
import sys
from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_modelprof import GPUS, GPUSpec, profile
from pytest_modelprof.engine.formulas import FormulaTable
from pytest_modelprof.engine.meters import Meter, Op
from pytest_modelprof.engine.meters.predicted import op_features
from pytest_modelprof.engine.targets.cost import StepClock, Work, kernel_seconds, kind_of, norm_elements, norm_work
from pytest_modelprof.engine.targets.gpus import HOST_RATIO, Calibration
from pytest_modelprof.engine.targets.products import Gemm, gemms_of

FLAT = Calibration(  # no cost to a short reduction or a small tile: only the waves of tiles over the SMs
    efficiency={"matmul": 0.5, "conv": 0.5, "conv_narrow": 0.5, "attention": 0.5, "rnn": 0.5, "norm": 0.5, "memory": 0.8},
    gemm_half={},
    tile_cost={},
    simt_issue=0.0,  # nor to the issue slots a product's other instructions take from its FMAs on the CUDA cores
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
    # bf16 tensor cores at half their peak: 1.1 ms, far above its 402 MB at 1.6 TB/s. Its 4096 tiles of
    # 128 x 128 (or 8192 of 128 x 64, ...) run in 41 waves over the 100 SMs, the last with 96 busy; plus the
    # kernel's fixed time
    kernel = flops / (1e15 * 0.5) * 4100 / 4096 + 2e-6
    assert predicted.ops[0].op == "aten.mm" and predicted.ops[0].bound == "compute"
    assert predicted.ops[0].seconds == pytest.approx(kernel)
    assert predicted.ops[0].bytes == 3 * n * n * 2
    # issued from Python without autograd recording it (no input needs a gradient), then run
    assert predicted.seconds == pytest.approx(10e-6 * HOST_RATIO["plain"] + kernel)
    assert not predicted.calibrated


def test_a_memory_bound_elementwise_op_and_a_kernels_fixed_time_by_hand():
    x = torch.empty(64 * 2**20, device="meta")  # 256 MiB of fp32
    predicted = profile(nn.ReLU(), x, target=GPU).predicted
    relu = predicted.ops[0]
    assert relu.bound == "memory"
    assert relu.seconds == pytest.approx(2 * 256 * 2**20 / (2e12 * 0.8) + 2e-6)  # read and written, and the fixed time
    tiny = profile(nn.ReLU(), torch.empty(16, device="meta"), target=GPU).predicted
    assert tiny.ops[0].bound == "launch" and tiny.ops[0].seconds == pytest.approx(2e-6 + 2 * 64 / (2e12 * 0.8))
    # a small model is host-bound: each op costs the host its issue time
    assert tiny.seconds == pytest.approx(10e-6 * HOST_RATIO["plain"] + tiny.ops[0].seconds)


def test_the_host_issues_the_backward_pass_for_less_and_inference_for_less_than_recorded_ops():
    """Each op with a kernel costs the host its issue time: Python's with autograd recording in a
    training forward, less under no_grad, least from autograd's engine (the backward pass)."""
    model = nn.Linear(16, 16, device="meta")
    x = torch.empty(4, 16, device="meta")

    def host(**keywords):
        return profile(model, x, target=GPU, flops=False, memory=False, **keywords).predicted.host_seconds

    assert host() == pytest.approx(10e-6 * HOST_RATIO["plain"] + 1e-6)  # one addmm under no_grad, the weight's view
    assert HOST_RATIO["engine"] < HOST_RATIO["plain"] < HOST_RATIO["recorded"] == 1.0
    for issuer in ("recorded", "plain", "engine"):
        clock = StepClock(GPU)
        clock.issue(Work("aten.add", "memory", 0, 64, torch.float32, issuer=issuer))
        assert clock.host == pytest.approx(10e-6 * HOST_RATIO[issuer])
    # a training step's forward is recorded, its backward issued by the engine
    ops = profile(model, x, train=True, target=GPU, flops=False, memory=False).predicted.ops
    assert {(row.op, row.phase) for row in ops} >= {("aten.addmm", "forward"), ("aten.mm", "backward")}


class _Dispatched(TorchDispatchMode):
    """Counts the ops autograd's engine dispatches in a real backward pass (no saved-tensor hooks), by node and op."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        node = torch._C._current_autograd_node()
        self.ops[(node.name() if node is not None else None, str(func.overloadpacket))] += 1
        return func(*args, **(kwargs or {}))


class _Backward(Meter):
    """The backward pass's ops the predicted meter prices and those it leaves free, by node and op."""

    def __init__(self):
        self.formulas, self.ops, self.free = FormulaTable(), Counter(), Counter()

    def op(self, op):
        if op.phase == "backward":
            priced = op_features(op, self.formulas, "cuda").issuer != "profiler"
            (self.ops if priced else self.free)[(op.node.name(), op.name)] += 1


def test_the_backward_pass_prices_the_ops_autograds_engine_dispatches_not_the_runs_own():
    """An analytic CUDA-target run walks the backward pass in Python, its saved tensors held by hooks. Autograd
    detaches each saved tensor an unpack hook hands back where the engine hands back an input or a leaf as it is,
    and a batch norm's node copies its reserve where it is not told it will be released: ops a real step does not
    run. The ops priced are those the engine dispatches in a real backward pass of the same model, node by node,
    which ``_Dispatched`` counts on the CPU without hooks (where batch norm is ATen's own, without a reserve). The
    sigmoid's output is both an input the product saves and an output its own node saves: the engine detaches it
    for the second alone."""

    def model():
        torch.manual_seed(0)
        convolutions = (nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3))
        return nn.Sequential(*convolutions, nn.Flatten(), nn.Linear(512, 16), nn.Sigmoid(), nn.Linear(16, 4, bias=False))

    real = model()
    loss = real(torch.randn(2, 3, 12, 12)).sum()
    with _Dispatched() as engine:
        loss.backward()
    seen = _Backward()
    x = torch.empty(2, 3, 12, 12, device="meta")
    profile(model().to("meta"), x, train=True, target=GPUS["h100"], flops=False, memory=False, meters=[seen])
    cpu = {"CudnnBatchNormBackward0": "NativeBatchNormBackward0"}  # cuDNN's batch norm on the target, ATen's on the CPU
    copies = ("aten.detach", "aten.clone")
    priced = {(cpu.get(node, node), op): n for (node, op), n in seen.ops.items() if op in copies}
    assert priced == {key: n for key, n in engine.ops.items() if key[1] in copies}
    detaches = {node: n for (node, op), n in priced.items() if op == "aten.detach"}
    # the nine parameters' accumulated gradients, and the saved outputs of the in-place ReLU and of the sigmoid
    assert detaches == {"torch::autograd::AccumulateGrad": 9, "ReluBackward0": 1, "SigmoidBackward0": 1}
    # the run's own: the first convolution's weight (its input needs no gradient), the second's input and weight, batch
    # norm's input and weight, each product's input and transposed weight; batch norm's reserve copy
    assert sum(n for (_, op), n in seen.free.items() if op == "aten.detach") == 1 + 2 + 2 + 2 + 2
    assert {key: n for key, n in seen.free.items() if key[1] != "aten.detach"} == {("CudnnBatchNormBackward0", "aten.clone"): 1}


class ReadsBack(nn.Module):
    def forward(self, a, b):
        total = (a @ b).sum().item()  # the host waits for the product and the sum
        return a + total


def test_the_host_waits_for_a_value_read_back_and_its_issuing_time_leaves_the_wait_out():
    """A value read back (``.item()``) makes the host wait for the GPU: the step has the wait, the host's
    issuing time (``host_seconds``, against the GPU's busy time) only what it spent issuing ops."""
    clock = StepClock(GPU)
    clock.issue(Work("aten.add", "memory", 0, 1_600_000_000, torch.float32, issuer="plain"))  # 1 ms on the GPU
    busy = clock.device
    clock.issue(Work("aten._local_scalar_dense", "none", 0, 0, torch.float32, 0))
    clock.issue(Work("aten.add", "memory", 0, 64, torch.float32, issuer="plain"))
    issuing = 2 * 10e-6 * HOST_RATIO["plain"] + 1e-6  # two ops from Python under no_grad, the read a view's cost
    assert clock.issuing == pytest.approx(issuing)
    assert clock.host == pytest.approx(busy + 10e-6 * HOST_RATIO["plain"])  # issued after the wait
    a, b = torch.ones(1024, 1024), torch.ones(1024, 1024)  # real inputs: the run knows the sum it reads back
    predicted = profile(ReadsBack(), (a, b), device="meta", target=GPU, flops=False, memory=False).predicted
    assert predicted.host_seconds == pytest.approx(3 * 10e-6 * HOST_RATIO["plain"] + 1e-6)  # mm, sum, add; the read
    # the product (tens of us) starts once issued, the sum right after it; the host waits for both, then issues
    # the add: the step is the GPU's time and two ops' issuing, the product's before and the add's after the wait
    assert predicted.seconds == pytest.approx(predicted.gpu_seconds + 2 * 10e-6 * HOST_RATIO["plain"])


def test_kinds_of_kernels():
    assert kind_of("aten.addmm") == "matmul" and kind_of("aten.view") == "none"
    assert kind_of("aten.cudnn_batch_norm") == "norm" and kind_of("aten.cudnn_batch_norm_backward") == "norm_backward"
    assert kind_of("aten.add") == "memory"
    assert kind_of("aten._scaled_dot_product_cudnn_attention_backward") == "attention"
    x, depthwise, dense, rgb = (torch.empty(s, device="meta") for s in ((8, 32, 16, 16), (32, 1, 3, 3), (32, 32, 3, 3), (32, 3, 3, 3)))
    conv = (None, None, None, [1, 1], [1, 1], [1, 1], False, [0, 0])
    assert kind_of("aten.convolution", (x, depthwise, *conv[2:], 32)) == "conv_narrow"
    assert kind_of("aten.convolution", (x, dense, *conv[2:], 1)) == "conv"
    assert kind_of("aten.convolution", (x[:, :3], rgb, *conv[2:], 1)) == "conv_narrow"  # a first layer on RGB pixels
    backward = (x, x, depthwise, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 32, [True, True, False])
    assert kind_of("aten.convolution_backward", backward) == "conv_narrow_backward"
    dense_backward = (x, x, dense, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    assert kind_of("aten.convolution_backward", dense_backward) == "conv_backward"  # cuDNN's backward kernels
    assert kind_of("aten.mv") == "memory"
    # PyTorch's own batch-norm kernels (a model in half precision), not cuDNN's: constants of their own
    assert kind_of("aten.native_batch_norm") == "norm_native" and kind_of("aten.native_batch_norm_backward") == "norm_native_backward"
    assert kind_of("aten._native_batch_norm_legit_no_training") == "norm_native"


@pytest.mark.parametrize(
    ("dtype", "kinds"), [(torch.float32, {"norm", "norm_backward"}), (torch.float16, {"norm_native", "norm_native_backward"})]
)
def test_batch_norm_on_a_gpu_runs_cudnn_for_float32_weights_and_pytorchs_own_kernels_for_half(dtype, kinds):
    # eager CUDA (at::_batch_norm_impl_index) takes cuDNN's kernels unless the weights are half precision
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)).to(device="meta", dtype=dtype)
    ops = profile(model, torch.empty(4, 3, 16, 16, device="meta", dtype=dtype), train=True, target=GPU).predicted.ops
    assert {kind_of(row.op) for row in ops if "batch_norm" in row.op} == kinds


def test_the_matrix_products_behind_a_convolution_by_hand():
    """An implicit product: rows are output pixels, columns output channels, the reduction input
    channels times the kernel; its backward pass one product per gradient asked for."""
    x, w = torch.empty(8, 64, 56, 56, device="meta"), torch.empty(128, 64, 3, 3, device="meta")
    y = torch.nn.functional.conv2d(x, w, stride=2, padding=1)  # 8 x 128 x 28 x 28
    args = (x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1)
    assert gemms_of("aten.convolution", args, y) == (Gemm(8 * 28 * 28, 128, 64 * 9),)
    both = (y, x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    assert gemms_of("aten.convolution_backward", both, None) == (
        Gemm(8 * 56 * 56, 64, 128 * 9, 0.5),  # the input's gradient
        Gemm(128, 64 * 9, 8 * 28 * 28, 0.5),  # the weight's, reduced over the batch's pixels
    )
    weight_only = (*both[:10], [False, True, False])
    assert gemms_of("aten.convolution_backward", weight_only, None) == (Gemm(128, 64 * 9, 8 * 28 * 28, 1.0),)
    q = torch.empty(2, 12, 197, 64, device="meta")
    # a product per head: rows the queries, columns the head size, reduced over the keys
    assert gemms_of("aten._scaled_dot_product_flash_attention", (q, q, q), None) == (Gemm(2 * 12 * 197, 64, 197),)
    a, b = torch.empty(4, 100, 30, device="meta"), torch.empty(4, 30, 20, device="meta")
    assert gemms_of("aten.bmm", (a, b), None) == (Gemm(100, 20, 30, 1.0, 4),)  # four products of 100 x 20


def test_a_product_in_waves_of_tiles_and_a_smaller_tiles_cost_by_hand():
    """4096 x 4096 over 4096 on 100 SMs, a tile reaching 1 / (1 + 16 (1/rows + 1/columns)) of what the largest
    tile (256 x 128: 0.842) reaches: in tiles of 256 x 128, 512 tiles in 6 waves (600 slots) at 1; of
    128 x 128, 1024 in 11 waves (1100) at 0.8 / 0.842; of 128 x 64, 2048 in 21 (2100) at 0.727 / 0.842; of
    64 x 64, 4096 in 41 (4100) at 0.667 / 0.842. The library's pick is the fastest: 128 x 128, 0.8 / 0.842 x
    1024 / 1100 of the matmul efficiency; a reduction half the 4096 long costs 1 / (1 + 64 / 4096) more."""
    calibration = Calibration(efficiency={"matmul": 0.8, "memory": 1.0}, gemm_half={"k": 64}, tile_cost={"tensor": 16}, kernel_seconds=0.0)
    n = 4096
    work = Work("aten.mm", "matmul", 2 * n**3, 0, torch.bfloat16, 1, (Gemm(n, n, n),))
    seconds, bound = kernel_seconds(GPU, calibration, work)
    assert bound == "compute"
    largest = 1 / (1 + 16 * (1 / 256 + 1 / 128))
    assert seconds == pytest.approx(2 * n**3 / (1e15 * 0.8 * (0.8 / largest) * (1024 / 1100) * (n / (n + 64))))


def test_a_product_with_a_small_output_and_a_long_reduction_is_split_by_hand():
    """256 x 256 outputs reduced over 1024 (a convolution's weight gradient, in small): in 64 x 64 tiles, 16
    tiles would leave 84 of the GPU's 100 SMs idle, so the reduction is split in 4 (none shorter than 256):
    64 tiles in one wave, each over 256 (tiles of 128 x 128, split in 4 too, keep 84 idle)."""
    calibration = Calibration(efficiency={"matmul": 0.8, "attention": 0.8, "memory": 1.0}, gemm_half={}, tile_cost={}, kernel_seconds=0.0)
    m, n, k = 256, 256, 1024
    work = Work("aten.mm", "matmul", 2 * m * n * k, 0, torch.bfloat16, 1, (Gemm(m, n, k),))
    assert kernel_seconds(GPU, calibration, work)[0] == pytest.approx(2 * m * n * k / (1e15 * 0.8 * 64 / 100))
    # attention's kernels schedule their own work: not split, 16 tiles of 64 x 64 on the 100 SMs
    attention = work._replace(name="aten._scaled_dot_product_flash_attention", kind="attention")
    assert kernel_seconds(GPU, calibration, attention)[0] == pytest.approx(2 * m * n * k / (1e15 * 0.8 * 16 / 100))


def test_a_batched_product_is_never_split_by_hand():
    """Two 128 x 128 products reduced over 2048, batched: a batched product's kernels run one block per tile
    and batch entry whatever the reduction's length (the launch grids of NeuSight's kernel data), so in
    64 x 64 tiles its 8 tiles take one wave on 8 of the 100 SMs, each over the whole 2048. The same two
    products one at a time would each be split in 8 (none shorter than 256): 32 tiles in one wave."""
    calibration = Calibration(efficiency={"matmul": 0.8, "memory": 1.0}, gemm_half={}, tile_cost={}, kernel_seconds=0.0)
    m, n, k = 128, 128, 2048
    flops = 2 * 2 * m * n * k
    batched = Work("aten.bmm", "matmul", flops, 0, torch.bfloat16, 1, (Gemm(m, n, k, 1.0, 2),))
    assert kernel_seconds(GPU, calibration, batched)[0] == pytest.approx(flops / (1e15 * 0.8 * 8 / 100))
    single = Work("aten.mm", "matmul", flops // 2, 0, torch.bfloat16, 1, (Gemm(m, n, k),))
    assert kernel_seconds(GPU, calibration, single)[0] == pytest.approx(flops / 2 / (1e15 * 0.8 * 32 / 100))


def test_batch_norm_with_few_channels_is_bound_by_its_reductions_by_hand():
    """Training batch norm reduces each channel over the batch: with 16 channels, 16 reductions side
    by side move 16 x 20 GB/s, not the GPU's bandwidth; it reads its input twice (3 passes for 2)."""
    x = torch.empty(64, 16, 112, 112, device="meta")
    assert norm_work("aten.cudnn_batch_norm", (x, None, None, None, None, True, 0.1, 1e-5)) == (1.5, 16)
    assert norm_work("aten.cudnn_batch_norm", (x, None, None, None, None, False, 0.1, 1e-5)) == (1.0, 0)
    assert norm_work("aten.native_layer_norm", (torch.empty(8, 512, 768, device="meta"), [768])) == (1.5, 8 * 512)
    planes = torch.empty(32, 2048, 7, 7, device="meta")  # inference: one plane of 49 pixels per 256 threads
    assert norm_work("aten._native_batch_norm_legit_no_training", (planes,)) == (256 / 49, 0)
    # a rate per element: in cuDNN's kernels a half-precision input takes as long as a float32 one (its passes at
    # float32's bytes); PyTorch's own kernels have a rate per element of their own, their passes are their bytes'
    half = x.to(torch.float16)
    assert norm_work("aten.cudnn_batch_norm", (half, None, None, None, None, True, 0.1, 1e-5)) == (3.0, 16)
    assert norm_work("aten.native_batch_norm", (planes.to(torch.bfloat16), None, None, None, None, False, 0.1, 1e-5)) == (256 / 49, 0)
    assert norm_work("aten.native_layer_norm", (torch.empty(8, 512, 768, device="meta", dtype=torch.float16), [768])) == (1.5, 8 * 512)
    # a 2-d input (BatchNorm1d after a linear layer) or a channels-last one: PyTorch's channels-last kernel, no planes
    flat = torch.empty(256, 4096, device="meta")
    assert norm_work("aten.native_batch_norm", (flat, None, None, None, None, False, 0.1, 1e-5)) == (1.0, 0)
    last = planes.to(memory_format=torch.channels_last)
    assert norm_work("aten.native_batch_norm", (last, None, None, None, None, False, 0.1, 1e-5)) == (1.0, 0)
    calibration = Calibration(efficiency={"norm": 0.8, "memory": 0.8}, reduction_bandwidth={"norm": 20e9}, kernel_seconds=0.0)
    nbytes = 2 * x.numel() * 4
    work = Work("aten.cudnn_batch_norm", "norm", 0, nbytes, torch.float32, 1, (), 1.5, 16)
    assert kernel_seconds(GPU, calibration, work) == (pytest.approx(nbytes * 1.5 / (16 * 20e9)), "memory")
    many = work._replace(reductions=1024)  # enough channels: the bandwidth bounds it
    assert kernel_seconds(GPU, calibration, many)[0] == pytest.approx(nbytes * 1.5 / (2e12 * 0.8))


def test_pytorchs_own_batch_norm_goes_through_its_elements_at_a_rate_per_sm_and_cycle_by_hand():
    """PyTorch's own batch-norm kernels compute in float32 whatever their input: a float16 inference batch norm
    over 64x256x56x56 takes its elements over the SMs at the kind's rate, the same on an H100 and an H200 (the same
    132 SMs at 1.98 GHz), not 1.4 times longer on the H100 for its bandwidth."""
    x = torch.empty(64, 256, 56, 56, device="meta", dtype=torch.float16)
    weight, bias, mean, var = (torch.empty(256, device="meta", dtype=torch.float16) for _ in range(4))
    eval_args = (x, weight, bias, mean, var, False, 0.1, 1e-5)
    assert norm_elements("aten.native_batch_norm", eval_args) == x.numel()
    assert norm_elements("aten.native_batch_norm", (x, None, None, None, None, True, 0.1, 1e-5)) == x.numel() * 3 // 2  # twice over
    small = torch.empty(64, 1024, 7, 7, device="meta", dtype=torch.float16)  # 49 pixels a plane of 256 threads
    assert norm_elements("aten.native_batch_norm", (small, None, None, None, None, False, 0.1, 1e-5)) == math.ceil(small.numel() * 256 / 49)
    assert norm_elements("aten.cudnn_batch_norm", eval_args) == 0  # cuDNN's: priced by its bytes
    calibration = Calibration(efficiency={"norm": 0.8, "memory": 0.8, "norm_native_rate": 1.5}, kernel_seconds=0.0)
    seconds = {}
    for name in ("h100", "h200"):
        gpu = GPUS[name]
        work = op_features(
            Op(
                torch.ops.aten.native_batch_norm.default,
                "aten.native_batch_norm",
                eval_args,
                {},
                torch.ops.aten.native_batch_norm.default(*eval_args),
                "forward",
                (),
                None,
            ),
            FormulaTable(),
            "meta",
        )
        assert (work.kind, work.elements) == ("norm_native", x.numel())
        seconds[name] = kernel_seconds(gpu, calibration, work)[0]
        assert seconds[name] == pytest.approx(x.numel() / (132 * 1.98e9 * 1.5))
    # without the rate (a calibration fitted before it): by its bytes, read and written once, at cuDNN's bandwidth
    assert work.bytes == pytest.approx(2 * x.numel() * 2, rel=1e-4)  # (and its channels' statistics)
    by_bytes = kernel_seconds(GPUS["h100"], dataclasses.replace(calibration, efficiency={"norm": 0.8, "memory": 0.8}), work)[0]
    assert by_bytes == pytest.approx(work.bytes / (GPUS["h100"].bandwidth * 0.8))


def _features(func, *args):
    return op_features(
        Op(func, f"aten.{func._schema.name.split('::')[1]}", args, {}, func(*args), "forward", (), None), FormulaTable(), "meta"
    )


def test_an_elementwise_kernel_on_the_strided_path_takes_the_time_its_sms_take_by_hand():
    """A product by a per-channel scale (an EfficientNet's squeeze-and-excitation) broadcasts one operand: PyTorch's
    kernel works out its offset element by element, and where its elements and bytes take the SMs longer (at the
    calibration's rate and cycles a byte) than the bytes take the memory, that is its time; the same product of
    two tensors laid out alike loads whole vectors and is its bytes alone."""
    aten = torch.ops.aten
    x = torch.empty(64, 144, 56, 56, device="meta", dtype=torch.float16)
    scale = torch.empty(64, 144, 1, 1, device="meta", dtype=torch.float16)
    broadcast = _features(aten.mul.Tensor, x, scale)
    alike = _features(aten.mul.Tensor, x, x)
    assert (broadcast.kind, broadcast.elements) == ("memory", x.numel())
    assert alike.elements == 0
    assert _features(aten.copy_.default, torch.empty(64, 96, device="meta"), torch.empty(96, 64, device="meta").t()).elements == 64 * 96
    assert _features(aten.add.Tensor, x, torch.empty((), dtype=torch.float16)).elements == 0  # a host scalar: an argument
    assert _features(aten.sum.dim_IntList, x, [2, 3]).elements == 0  # a reduction, not an elementwise kernel
    # size-1 dimensions' strides do not matter; a slice with gaps takes the strided path whatever its operands
    row = torch.empty(8, 1, 16, device="meta")
    assert _features(aten.add.Tensor, row, torch.empty(8, 16, 1, device="meta").transpose(1, 2)).elements == 0
    sliced = torch.empty(8, 32, device="meta")[:, :16]
    assert _features(aten.mul.Tensor, sliced, sliced).elements == 8 * 16
    # a copy from the host: no elementwise kernel
    assert _features(aten.copy_.default, torch.empty(96, 64, device="meta"), torch.empty(64, 96).t()).elements == 0
    gpu = GPUS["h100"]
    nbytes = (2 * x.numel() + scale.numel()) * 2
    assert broadcast.bytes == nbytes
    by_bytes = nbytes / (gpu.bandwidth * 0.8)
    on_sms = (x.numel() / 1.5 + nbytes * 0.1) / (132 * 1.98e9)
    assert on_sms > by_bytes
    calibration = Calibration(efficiency={"memory": 0.8, "strided_rate": 1.5, "strided_byte_cycles": 0.1}, kernel_seconds=0.0)
    assert kernel_seconds(gpu, calibration, broadcast) == (pytest.approx(on_sms, rel=1e-6), "compute")
    assert kernel_seconds(gpu, calibration, alike)[0] == pytest.approx(3 * x.numel() * 2 / (gpu.bandwidth * 0.8), rel=1e-6)
    # on a GPU whose memory is slower than its SMs' work (an L4), the bytes: the larger of the two, not their sum
    slow = dataclasses.replace(gpu, bandwidth=gpu.bandwidth / 10)
    assert kernel_seconds(slow, calibration, broadcast) == (pytest.approx(by_bytes * 10, rel=1e-6), "memory")
    # a calibration without the rate (one fitted before it): its bytes alone
    before = Calibration(efficiency={"memory": 0.8}, kernel_seconds=0.0)
    assert kernel_seconds(gpu, before, broadcast)[0] == pytest.approx(by_bytes, rel=1e-6)


def test_a_calibration_without_pytorchs_own_batch_norm_constants_prices_it_as_cudnns():
    # a calibration file written before they existed, or one fitted on probes that never run them
    calibration = Calibration(efficiency={"norm": 0.8, "norm_backward": 0.6, "memory": 0.7}, reduction_bandwidth={"norm": 20e9})
    for native, cudnn in (("norm_native", "norm"), ("norm_native_backward", "norm_backward")):
        work = Work("aten.native_batch_norm", native, 0, 64 << 20, torch.float16, 1, (), 3.0, 16)
        assert kernel_seconds(GPU, calibration, work) == kernel_seconds(GPU, calibration, work._replace(kind=cudnn))


def test_an_op_on_host_tensors_runs_no_kernel_in_an_analytic_run():
    step = torch.zeros(())  # Adam's step count lives on the host
    op = Op(torch.ops.aten.add_.Tensor, "aten.add_", (step, torch.ones(())), {}, step, "optimizer", (), None)
    assert op_features(op, FormulaTable(), "meta").on_device is False
    assert op_features(op, FormulaTable(), "cpu").on_device is True  # a sharded step stands the GPU's tensors on the CPU
    model = nn.Linear(64, 64, device="meta")
    adam = profile(model, torch.empty(8, 64, device="meta"), train=True, target=GPU, optimizer=torch.optim.Adam(model.parameters()))
    # one foreach add over the state (the square root's eps), none over the step counts
    adds = [row for row in adam.predicted.ops if row.phase == "optimizer" and row.op == "aten._foreach_add_"]
    assert [row.calls for row in adds] == [1] and adds[0].bytes == 2 * (64 * 64 + 64) * 4  # read and written


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
    assert GPUS["l4"].calibration is GPUS["h100"].calibration  # one set of constants for every GPU


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
    # 2 * 4096^3 FLOPs on the float32 units (TF32 is off for matrix products) at half their peak, in 41
    # waves of 64 x 64 tiles over the 100 SMs (4096 tiles, the last wave 96 busy), and one kernel's fixed time
    assert seconds["2.0"] - seconds["0"] == pytest.approx(2 * 4096**3 / (50e12 * 0.5) * 4100 / 4096 + 2e-6)
