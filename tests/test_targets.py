"""CUDA as the target from a CPU-only machine: the GPU table, CUDA's kernel choices, and whole
analytic steps against the real H100 allocator figures in pytest_modelprof/data/gpu-truth."""

import collections
import dataclasses
import functools
import math
import statistics

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from benchmarks import gpu_truth
from pytest_modelprof import GPUS, GPUSpec, ProfileError, profile
from pytest_modelprof.engine.analytic.cuda import attention as kernels
from pytest_modelprof.engine.analytic.cuda.attention import CUDNN, EFFICIENT, FLASH, MATH, sdp_backend
from pytest_modelprof.engine.calibrate import kernel_time
from pytest_modelprof.engine.targets import cudnn
from pytest_modelprof.engine.targets.catalog import gpu_spec

MiB = 1 << 20


def test_the_gpu_table():
    for name in ("h100", "h100-pcie", "h200", "a100-80gb", "a100-40gb", "l4", "a10g", "rtx4090"):
        spec = GPUS[name]
        assert spec.memory_bytes > 16 * 2**30 and spec.bandwidth > 1e11 and spec.sm_count > 0
        assert spec.peak_flops["bfloat16"] > spec.peak_flops["float32"]
    assert gpu_spec("H100_SXM") is GPUS["h100"] and gpu_spec("A100") is GPUS["a100-80gb"]
    assert GPUS["h100"].compute_capability == (9, 0) and GPUS["a100-40gb"].compute_capability == (8, 0)
    with pytest.raises(ValueError, match=r"unknown target GPU 'h1000'.*h100"):
        gpu_spec("h1000")
    with pytest.raises(ValueError, match="must be positive"):
        GPUSpec("broken", 0, 1e12, {}, 10, (8, 0))


def qkv(dtype, heads=8, head_dim=64, kv_heads=None):
    q = torch.empty(2, heads, 128, head_dim, dtype=dtype, device="meta")
    k = torch.empty(2, kv_heads or heads, 128, head_dim, dtype=dtype, device="meta")
    return q, k, k


@pytest.mark.parametrize(
    ("gpu", "dtype", "extra", "backend"),
    [
        ("h100", torch.bfloat16, {}, CUDNN),  # measured: torch 2.11 on an H100 runs cuDNN attention
        ("h100", torch.bfloat16, {"dropout_p": 0.25}, CUDNN),
        ("a100-80gb", torch.bfloat16, {}, FLASH),  # cuDNN comes first on sm_90 and sm_10x only
        ("h100", torch.float32, {}, EFFICIENT),  # flash and cuDNN take half precision only
        ("a100-80gb", torch.float16, {"attn_mask": torch.empty(128, 128, device="meta")}, EFFICIENT),  # flash: no mask
    ],
)
def test_the_attention_backend_a_gpu_chooses(gpu, dtype, extra, backend):
    assert sdp_backend(GPUS[gpu], *qkv(dtype), **extra) == backend


def test_the_attention_backend_follows_the_users_switches_and_limits():
    assert sdp_backend(GPUS["rtx4090"], *qkv(torch.float32, head_dim=30)) == MATH  # no kernel for that alignment
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION]):
        assert sdp_backend(GPUS["h100"], *qkv(torch.bfloat16)) == EFFICIENT
    # sdp_utils.cpp: flash takes is_causal only for square score matrices (a decoding step is not one),
    # cuDNN no key sequence of one, nor deterministic mode
    q, k, v = qkv(torch.bfloat16)
    assert sdp_backend(GPUS["a100-80gb"], q[:, :, :1], k, v, is_causal=True) == EFFICIENT
    assert sdp_backend(GPUS["a100-80gb"], q[:, :, :1], k, v) == FLASH
    assert sdp_backend(GPUS["h100"], q, k[:, :, :1], v[:, :, :1]) == FLASH
    torch.use_deterministic_algorithms(True)
    try:
        assert sdp_backend(GPUS["h100"], q, k, v) == FLASH
    finally:
        torch.use_deterministic_algorithms(False)


def test_the_attention_backend_by_head_size_and_grouped_heads():
    # cuDNN: heads up to 256 on sm_90 (cuDNN 9.23 on; up to 128 before), multiples of 8; flash up to 256, padded to 8
    wide = CUDNN if kernels._cudnn_version() > 92200 else FLASH
    assert sdp_backend(GPUS["h100"], *qkv(torch.bfloat16, head_dim=256)) == wide
    assert sdp_backend(GPUS["h100"], *qkv(torch.bfloat16, head_dim=264)) == EFFICIENT  # beyond both
    assert sdp_backend(GPUS["h100"], *qkv(torch.bfloat16, head_dim=36)) == FLASH  # not a multiple of 8
    assert sdp_backend(GPUS["a100-80gb"], *qkv(torch.bfloat16, head_dim=256)) == FLASH
    # grouped-query attention: cuDNN and flash take it when asked for, memory-efficient attention does not
    assert sdp_backend(GPUS["h100"], *qkv(torch.bfloat16, kv_heads=2), enable_gqa=True) == CUDNN
    assert sdp_backend(GPUS["a100-80gb"], *qkv(torch.bfloat16, kv_heads=2), enable_gqa=True) == FLASH
    assert sdp_backend(GPUS["a100-80gb"], *qkv(torch.float32, kv_heads=2), enable_gqa=True) == MATH
    assert sdp_backend(GPUS["h100"], *qkv(torch.bfloat16, kv_heads=3), enable_gqa=True) == MATH  # 8 % 3
    # flash's backward on sm_86 and sm_89 takes no heads in (192, 224]
    q, k, v = (t.requires_grad_() for t in qkv(torch.bfloat16, head_dim=200))
    assert sdp_backend(GPUS["a10g"], q, k, v) == EFFICIENT
    with torch.no_grad():
        assert sdp_backend(GPUS["a10g"], q, k, v) == FLASH


def test_the_attention_backend_by_mask():
    q, k, v = qkv(torch.bfloat16)
    mask = torch.empty(2, 1, 128, 128, dtype=torch.bfloat16, device="meta")
    assert sdp_backend(GPUS["h100"], q, k, v, mask) == CUDNN
    # check_attn_mask_shape: cuDNN takes masks of 2 or 4 dimensions, and none that needs a gradient
    assert sdp_backend(GPUS["h100"], q, k, v, mask[:, 0]) == EFFICIENT
    assert sdp_backend(GPUS["h100"], q, k, v, mask.clone().requires_grad_()) == EFFICIENT
    # a mask whose last dimension is not contiguous: no fused kernel on the GPU
    assert sdp_backend(GPUS["h100"], q, k, v, mask.transpose(-1, -2)) == MATH


def test_cudnn_attention_and_dropout_by_release(monkeypatch):
    from pytest_modelprof.engine.analytic.cuda import attention as kernels

    # PyTorch 2.12 leaves cuDNN out for a dropout that is not a multiple of 1/16 (pull request 174245)
    monkeypatch.setattr(kernels, "TORCH_RELEASE", (2, 11))
    assert sdp_backend(GPUS["h100"], *qkv(torch.bfloat16), dropout_p=0.1) == CUDNN
    monkeypatch.setattr(kernels, "TORCH_RELEASE", (2, 12))
    assert sdp_backend(GPUS["h100"], *qkv(torch.bfloat16), dropout_p=0.1) == FLASH
    assert sdp_backend(GPUS["h100"], *qkv(torch.bfloat16), dropout_p=0.125) == CUDNN
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
    assert sdp_backend(GPUS["h100"], *qkv(torch.bfloat16)) == FLASH


class Block(nn.Module):
    def __init__(self, d=256, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv, self.out, self.norm = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.LayerNorm(d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(y.transpose(1, 2).reshape(b, s, d))


def test_a_training_step_on_a_target_gpu_runs_as_cuda_would_without_one():
    model, x = Block(), torch.randn(4, 128, 256)
    result = profile(model, x, train=True, autocast=torch.bfloat16, target="h100", optimizer=torch.optim.AdamW(model.parameters()))
    assert result.target == "h100" and result.device == "cuda:0" and result.analytic
    ops = {row.op for row in result.ops}
    assert {"aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_cudnn_attention_backward"} <= ops
    assert any(op.startswith("aten._foreach_") for op in ops)  # AdamW's CUDA default
    memory = result.memory
    assert memory.block_bytes == 512
    # cuBLAS's 32 MiB on sm_90 for the step's thread and for the autograd engine's, and cuBLASLt's 1 MiB
    # for the forward's addmm: 65 MiB, as measured before a steady H100 training step; the peak is
    # the attention's backward, whose cuDNN workspace holds a float row sum and a float query
    # gradient per query row and head (4 x 4 heads x 128 rows, heads of 64)
    assert memory.peak_breakdown["workspace"] == 65 * MiB + 4 * 4 * 128 * 4 * (1 + 64)
    assert memory.peak_breakdown["gradients"] <= sum(p.numel() * 4 for p in model.parameters())
    # the same step on CPU runs other kernels: attention as separate matmuls and softmax
    cpu = profile(model, x, train=True, autocast=torch.bfloat16, device="meta")
    assert "aten._scaled_dot_product_cudnn_attention" not in {row.op for row in cpu.ops}
    assert result.fits is True and cpu.fits is None


class Checkpointed(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=False)  # recomputed in the backward pass
        return x


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_activation_checkpointing_on_a_target(autocast):
    """The recompute runs on the run's (fake CUDA) parameters, under the autocast of its forward."""
    torch.manual_seed(0)
    model, x = Checkpointed(), torch.randn(8, 64)
    result = profile(model, x, train=True, target="h100", autocast=autocast)
    assert result.flops == profile(model, x, train=True, autocast=autocast).flops  # the real CPU run's
    # the backward pass recomputes each block up to the last tensor it saved (checkpoint's early stop):
    # all but its second linear layer (2 x 8 x 256 x 64 MACs and a bias), and not the two residual adds
    second = 2 * 8 * 256 * 64 + 8 * 64
    assert result.recompute_flops == result.forward_flops - 2 * second - 2 * 8 * 64

    (recomputed,) = [o for o in result.predicted.ops if o.phase == "recompute" and o.op == "aten.addmm"]
    # each block's first linear layer again, in the dtype of its forward (bf16 under autocast): bias, input
    # and weight read, output written
    element = 2 if autocast else 4
    assert (recomputed.calls, recomputed.bytes) == (2, 2 * element * (256 + 8 * 64 + 256 * 64 + 8 * 256))


class InnerAutocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 64)

    def forward(self, x):
        with torch.autocast("cuda", dtype=torch.bfloat16):  # as models do for a part of their forward
            return self.linear(x)


def test_autocast_inside_the_model_runs_as_on_the_target(recwarn):
    result = profile(InnerAutocast(), torch.randn(8, 64), target="h100")
    (product,) = [o for o in result.predicted.ops if o.op == "aten.addmm"]
    # bf16: 2 bytes for each of the bias (64), input (8 x 64), weight (64 x 64) read and output (8 x 64) written
    assert product.bytes == 2 * (64 + 8 * 64 + 64 * 64 + 8 * 64)
    assert not [w for w in recwarn if "Disabling autocast" in str(w.message)]


def test_what_does_not_fit_says_so():
    # 4 layers of 8192 x 8192 in fp32 with AdamW: 4 * 256 MiB of weights, as much of
    # gradients, twice as much of optimizer state: 4 GiB, over a made-up 3 GiB GPU
    small = GPUSpec("tiny", 3 * 2**30, 1e11, {"float32": 1e12}, 10, (8, 0))
    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(8192, 8192, bias=False) for _ in range(4)])
    result = profile(model, torch.empty(8, 8192, device="meta"), train=True, optimizer=torch.optim.AdamW(model.parameters()), target=small)
    assert result.memory.peak_bytes > 4 * 2**30
    assert result.fits is False and result.target == "tiny"
    assert profile(model, torch.empty(8, 8192, device="meta"), target="h100").fits is True


def test_a_target_is_a_gpu():
    with pytest.raises(Exception, match="target='h100' is a GPU"):
        profile(nn.Linear(4, 4), torch.randn(2, 4), device="cpu", target="h100")


# pytest_modelprof/data/gpu-truth: real allocator figures of an H100 --------------------------------

# measured here (peak / max_memory_allocated, reserved / max_memory_reserved): what is not
# yet within the bounds (3% and 5%), and why
OPEN: dict[str, str] = {}
OPEN_RESERVED = {
    # measured with the records' cuDNN (9.19): reserved after the first step, modelled / measured
    "vit_b_16-b32-eval-bf16": "reserved 0.768 (378 / 492 MiB after the first step): the fp32 weights converted to bf16 on the "
    "GPU before it leave cached segments",
    "resnet18-b64-train-fp32-sgdm": "reserved 0.899 (2408 / 2678 MiB after the first step, nothing added after): the "
    "segments cuDNN's workspaces leave differ from the record's",
    "resnet50-b32-eval-fp32": "reserved 1.225 (676 / 552 MiB after the first step): the 98.1 MiB workspace cuDNN's heuristics "
    "give a 1x1 convolution of a 98 MiB input takes a segment of its own, which the record does not show",
}
# With another cuDNN than the records' the convolution workspaces, and so the segments they leave,
# are that cuDNN's: a step with a cuDNN convolution is held to what is known open with the cuDNN
# loaded (the suite runs with torch 2.14's 9.24 and torch 2.11's 9.19, the records' own), and with
# a cuDNN of neither, a miss is an xfail that says its ratio.
OPEN_RESERVED_BY_CUDNN = {
    919: OPEN_RESERVED,
    924: {
        "resnet18-b64-train-fp32-sgdm": "reserved 0.925 with cuDNN 9.24: the segments its workspaces leave differ from the record's",
        "resnet50-b32-eval-fp32": "reserved 1.268 with cuDNN 9.24: a 1x1 convolution's workspace takes a segment of its own",
        "mobilenet_v3_large-b64-train-fp32-adamw": "reserved 1.122 with cuDNN 9.24 (1.037 with the records' 9.19): the segments its "
        "workspaces leave differ from the record's",
        "vit_b_16-b32-eval-bf16": OPEN_RESERVED["vit_b_16-b32-eval-bf16"],
    },
}


@functools.cache
def recorded_step(gpu, name):
    """The analytic step of a gpu-truth workload on ``gpu`` (h100, h200), and its record measured there."""
    model, inputs, keywords = gpu_truth.workload(name)
    return profile(model, inputs, target=gpu, **keywords), gpu_truth.records(gpu)[name]


def h100_step(name):
    result, record = recorded_step("h100", name)
    return result, record["steady_step"]


@pytest.mark.parametrize("name", sorted(gpu_truth.records()))
def test_an_h100_step_peaks_where_the_record_peaked(name):
    if name in OPEN:
        pytest.xfail(OPEN[name])
    result, record = h100_step(name)
    assert math.isclose(result.peak_memory_bytes, record["max_allocated"], rel_tol=0.03)


@pytest.mark.parametrize("name", sorted(gpu_truth.records()))
def test_an_h100_step_reserves_what_the_record_reserved(name):
    result, record = h100_step(name)
    ratio = result.memory.estimates["reserved_bytes"] / record["max_reserved"]
    within = abs(ratio - 1) <= 0.05
    known_open = OPEN_RESERVED
    if result.memory.estimates["cudnn_workspace_bytes"] and not gpu_truth.same_cudnn():
        library = cudnn.library()
        version = library.version if library is not None else None
        known_open = OPEN_RESERVED_BY_CUDNN.get(version // 100) if version is not None else None
        if known_open is None:
            if not within:
                pytest.xfail(
                    f"reserved {ratio:.3f} with cuDNN {version}, not the records' {gpu_truth.CUDNN}: its workspaces leave other segments"
                )
            return
    if name in known_open:
        assert not within, f"reserved {ratio:.3f}: within 5% now, take it off the open ones"
        pytest.xfail(known_open[name])
    assert within, f"reserved {ratio:.3f} of the record"


def test_the_shipped_calibration_predicts_the_recorded_h100_steps_as_the_docs_say():
    # docs/targets.md: "with the shipped fit, median error 2.4%, worst 24.3%" (the LSTM's training step): each step's
    # predicted time against its median measured one (20 steps timed with CUDA events), to the rounding of those figures
    errors = {
        name: abs(h100_step(name)[0].predicted.seconds / (record["step_ms_median"] / 1e3) - 1)
        for name, record in gpu_truth.records().items()
    }
    assert len(errors) == 9
    assert statistics.median(errors.values()) < 0.0245
    assert max(errors.values()) < 0.2435, errors


# pytest_modelprof/data/gpu-truth/h200.json: twenty workloads kept out of every fit, on an H200 ---------------
# (no H200 step went into the shipped calibration or the memory model; the constants of PyTorch's own batch-norm
# kernels come from one-layer probes on the H200 whose shapes no held-out step has)

HELD_OUT = sorted(name for name in gpu_truth.records("h200") if gpu_truth.heldout(name))
# measured here, with the records' cuDNN (9.19) and with 9.24 alike: peak / max_memory_allocated
OPEN_HELD_OUT = {
    # float16, per op (h200-scratch.json): in the three inference steps every convolution's workspace is the
    # model's to 0.1 MiB but for 1x1 ones, where cuDNN's heuristics asked here pick engines with a workspace
    # (the input and output in another layout) and the H200 ran ones without
    "resnext50_32x4d-b64-eval-fp16": "peak 1.163 (516 / 444 MiB): 1x1 convolutions modelled with workspaces (up to 196 MiB) "
    "that the H200's engines did not take",
    "deeplabv3_resnet50-b4-eval-fp16": "peak 1.102 (338 / 306 MiB): 1x1 convolutions modelled with workspaces (up to 48 MiB) "
    "that the H200's engines did not take",
    "mobilenet_v2-b128-eval-fp16": "peak 1.068 (763 / 714 MiB): 1x1 convolutions modelled with workspaces (up to 343 MiB) "
    "that the H200's engines did not take",
    "efficientnet_b0-b64-train-autocast_fp16-adamw": "peak 0.962 (112 MiB short): 1x1 convolutions' backward passes took "
    "larger workspaces than modelled (100 MiB against 25 MiB), their forward passes none where some are modelled",
}


def test_the_h200_records_hold_twenty_held_out_workloads_and_the_shared_ones():
    records = gpu_truth.records("h200")
    assert len(HELD_OUT) == 20
    assert set(gpu_truth.records()) <= set(records)  # the nine fitted on, measured again on the H200
    assert {record["gpu"] for record in records.values()} == {"NVIDIA H200"}


@pytest.mark.parametrize("name", HELD_OUT)
def test_a_held_out_h200_step_peaks_where_the_record_peaked(name):
    if name in OPEN_HELD_OUT:
        pytest.xfail(OPEN_HELD_OUT[name])
    result, record = recorded_step("h200", name)
    assert math.isclose(result.peak_memory_bytes, record["steady_step"]["max_allocated"], rel_tol=0.03)


def test_the_shipped_calibration_predicts_the_held_out_h200_steps_as_the_docs_say():
    # docs/targets.md's table (H200, 20 workloads kept out of every fit): median error 3.8%, worst 30.0%
    # (benchmarks/predicted_vs_h200.py)
    errors = {
        name: abs(step.predicted.seconds / (record["step_ms_median"] / 1e3) - 1)
        for name in HELD_OUT
        for step, record in [recorded_step("h200", name)]
    }
    assert statistics.median(errors.values()) < 0.0385
    assert max(errors.values()) < 0.3, errors


@pytest.mark.skipif(not gpu_truth.records("h100-heldout"), reason="the held-out H100 records are not in this checkout")
def test_pytorchs_own_batch_norms_take_the_time_of_their_elements_on_an_h100_as_on_an_h200():
    # float16 and bfloat16 inference: PyTorch's own batch-norm kernels, whose rate per element is fitted on one-layer
    # probes on an H200 (shapes no held-out step has). On an H100 (the same SMs and clock, 0.7 times the bandwidth)
    # they took 1.0-1.1 times as long as on the H200 (pytest_modelprof/data/gpu-truth/h100-heldout.json); priced by
    # their bytes, as before the rate, they came out 1.3 to 1.7 times too slow there
    records = gpu_truth.records("h100-heldout")
    ratios = {}
    for name in (
        "resnext50_32x4d-b64-eval-fp16",
        "mobilenet_v2-b128-eval-fp16",
        "resnet18-b256-eval-bf16",
        "deeplabv3_resnet50-b4-eval-fp16",
    ):
        model, inputs, keywords = gpu_truth.workload(name)
        result = profile(model, inputs, target="h100", flops=False, memory=False, **keywords)
        measured = sum(op["self_device_us"] for op in records[name]["ops"] if op["op"] == "aten::native_batch_norm") * 1e-6
        ratios[name] = sum(row.seconds for row in result.predicted.ops if row.op == "aten.native_batch_norm") / measured
    assert all(0.85 < ratio < 1.25 for ratio in ratios.values()), ratios


def test_the_held_out_h200_steps_pooling_takes_the_time_of_its_index_arithmetic():
    # the pooling kinds' rates are fitted on the H100 steps' three max pools (ResNet-18's forward and backward,
    # ResNet-50's forward); here, each pooling op of the held-out H200 steps, max and average, forward and backward,
    # in float32, float16 and bfloat16, against its kernel time there. Priced by their bytes, as before the
    # pooling kinds, they came out 1.3 to 7 times too fast
    ratios = {}
    for name in HELD_OUT:
        result, record = recorded_step("h200", name)
        measured: dict[str, float] = collections.defaultdict(float)
        for op in record["ops"]:
            if op["op"].startswith(("aten::max_pool", "aten::avg_pool")):
                measured[op["op"].replace("::", ".")] += op["self_device_us"] * 1e-6
        for op, seconds in measured.items():
            ratios[name, op] = sum(row.seconds for row in result.predicted.ops if row.op == op) / seconds
    assert len(ratios) >= 15
    assert statistics.median(abs(ratio - 1) for ratio in ratios.values()) < 0.1
    assert all(0.5 < ratio < 1.5 for ratio in ratios.values()), ratios


def test_the_held_out_h200_steps_strided_elementwise_kernels_add_their_index_arithmetic():
    # an elementwise kernel with an operand broadcast or laid out otherwise than its output (ConvNeXt's layer scale,
    # EfficientNet's squeeze-and-excitation, Swin's shifted windows) works out each operand's offset element by
    # element; the constants of that work are fitted with the rest on the H100 steps and the H100's layout probes.
    # Here, each such operator (name and shapes) of three held-out H200 steps against its kernel time there: a
    # median 21% off (1.21 of it), where by their bytes alone (the calibration without them) 38% off (0.66 of it)
    gpu = GPUS["h200"]
    names = [
        "convnext_tiny-b32-train-autocast_bf16-adamw",
        "efficientnet_b0-b64-train-autocast_fp16-adamw",
        "swin_t-b32-train-autocast_bf16-adamw",
    ]
    records = gpu_truth.records("h200")
    without = dataclasses.replace(gpu.calibration, efficiency={k: v for k, v in gpu.calibration.efficiency.items() if k != "strided_rate"})
    ratios, before = [], []
    for observed in gpu_truth.observed(gpu, {name: records[name] for name in names}):
        for works, seconds in observed.matched.values():
            if any(w.kind == "memory" and w.elements for w in works):
                ratios.append(kernel_time(gpu, works, gpu.calibration) / seconds)
                before.append(kernel_time(gpu, works, without) / seconds)
    assert len(ratios) >= 50
    assert statistics.median(abs(r - 1) for r in ratios) < 0.25
    assert statistics.median(before) < 0.8  # (what the rate fixes)


@pytest.mark.skipif(not gpu_truth.layout_kernels(GPUS["h200"]), reason="the H200's layout probes are not in this checkout")
def test_the_h200s_layout_probes_take_the_time_the_h100s_constants_say():
    # elementwise kernels by their operands' layout (data/gpu-truth/layout_probes.py), measured on an H100 (in the
    # fit) and an H200 (not): on the strided path the SMs set the time, so a float16 product by a per-channel scale
    # over 64 M elements took 176 us on the H100 and 165 us on the H200, whose memory is 1.4 times as fast. The
    # H200's, against the shipped constants: the vector path a median 6% off, the strided one 12% (by its bytes
    # alone, as without the constants: 41% off, 0.59 of it)
    gpu = GPUS["h200"]
    kernels = [(works, seconds) for _, works, seconds in gpu_truth.layout_kernels(gpu) if seconds > 8e-6 and not works[0].launches]
    ratios = {
        path: [kernel_time(gpu, works, gpu.calibration) / seconds for works, seconds in kernels if bool(works[0].elements) == strided]
        for path, strided in (("vector", False), ("strided", True))
    }
    assert len(ratios["strided"]) >= 80 and len(ratios["vector"]) >= 20
    assert statistics.median(abs(r - 1) for r in ratios["vector"]) < 0.1
    assert statistics.median(abs(r - 1) for r in ratios["strided"]) < 0.15
    products = [works for works, _ in kernels if works[0].name == "aten.mul" and works[0].elements and works[0].dtype == torch.float16]
    scale = max(products, key=lambda works: works[0].elements)  # by a per-channel scale, over 67 M elements
    h100 = kernel_time(GPUS["h100"], scale, gpu.calibration)
    assert kernel_time(gpu, scale, gpu.calibration) == pytest.approx(h100, rel=0.1)


def held_out_kernel_ratios(*ops, steps=HELD_OUT):
    """Per held-out H200 step of ``steps`` that runs any of ``ops`` ("aten.native_layer_norm"): its predicted kernel
    time of them over the record's."""
    ratios = {}
    recorded_ops = {op.replace(".", "::", 1) for op in ops}
    for name in steps:
        result, record = recorded_step("h200", name)
        measured = sum(row["self_device_us"] for row in record["ops"] if row["op"] in recorded_ops) * 1e-6
        if measured:
            ratios[name] = sum(row.seconds for row in result.predicted.ops if row.op in ops) / measured
    return ratios


def test_the_held_out_h200_steps_layer_norms_take_the_time_of_their_rows():
    # a layer norm's forward pass gives each row a block of its own: over a ConvNeXt's or a Swin's rows of 96-384
    # channels that, not the bytes, is its time. The cycles a row takes are fitted with the rest on the H100 steps
    # (rows of 768); here, the held-out H200 steps' layer norms (rows of 96 to 1536; fp32, fp16, bf16) against their
    # kernel time there: 0.88 to 1.37 of it, a median 12% off (the most, ConvNeXt's and Swin's rows of 96 to 768).
    # Priced by their bytes they came out 0.31 to 0.92 of it (a median 29% off)
    ratios = held_out_kernel_ratios("aten.native_layer_norm")
    assert len(ratios) == 7
    assert statistics.median(abs(ratio - 1) for ratio in ratios.values()) < 0.15
    assert all(0.8 < ratio < 1.4 for ratio in ratios.values()), ratios


def test_the_held_out_h200_steps_layer_norms_backward_passes_take_the_time_of_their_weight_gradient_blocks():
    # a layer norm's backward pass sums the weight's and bias's gradients down the rows in blocks of 32 columns, each
    # walking every row: a 768-wide norm keeps 24 of the H200's SMs at work (engine/targets/norm_kernel.py). The blocks'
    # rate is fitted with the rest on the H100 steps and the H200's one-layer probes; here, the held-out H200 steps'
    # layer norms' backward passes (rows of 96 to 1024; fp32 and bf16), each step's against its kernel time there:
    # 0.74 to 1.10 of it, a median 10% off (ConvNeXt's and Swin's the least: over their most rows, 96 wide, the rows split).
    # Priced by their bytes alone they came out 0.50 to 0.97 of it (a median 36% off)
    ratios = held_out_kernel_ratios("aten.native_layer_norm_backward")
    assert len(ratios) == 5
    assert statistics.median(abs(ratio - 1) for ratio in ratios.values()) < 0.15
    assert all(0.7 < ratio < 1.2 for ratio in ratios.values()), ratios


def test_the_held_out_h200_steps_float32_products_on_cuda_cores_lose_issue_slots_to_their_other_instructions():
    # with TF32 off (torch's default for matrix products) a float32 product runs on the CUDA cores; an H200's
    # schedulers have a warp's worth of FP32 lanes each, so the product's other instructions take issue slots from
    # its FMAs (simt_issue, fitted with the rest on the H100 steps and the H200's probes: targets/gpus.py). The
    # held-out steps whose time is mostly such products, an MLP's and a ViT-B/32's training steps: their products'
    # predicted kernel time against the record's, 1.02 and 1.01 of it (0.92 and 0.91 with the FMAs at the whole peak)
    ratios = held_out_kernel_ratios("aten.mm", "aten.addmm", steps=["mlp4x2048-b4096-train-fp32-sgdm", "vit_b_32-b64-train-fp32-adamw"])
    assert len(ratios) == 2
    assert all(0.93 < ratio < 1.07 for ratio in ratios.values()), ratios


def test_a_cpu_tensor_made_inside_the_model_is_explained_on_a_target():
    class Positions(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(16, 8)

        def forward(self, x):
            return x + self.embed(torch.arange(x.shape[1]))  # no device=: on the CPU, as on a real GPU

    with pytest.raises(ProfileError, match=r"make tensors inside the model on their inputs' device"):
        profile(Positions(), torch.randn(2, 16, 8), target="h100")


def test_autocast_casts_a_float_attention_mask_as_on_the_gpu():
    # scaled_dot_product_attention is on CUDA autocast's lower-precision list: every fp32 argument is cast
    class Biased(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(64, 64, bias=False)
            self.register_buffer("bias", torch.zeros(4, 16, 16))

        def forward(self, x):
            q = self.q(x).view(2, 16, 4, 16).transpose(1, 2)
            return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=self.bias)

    result = profile(Biased(), torch.randn(2, 16, 64), target="h100", autocast=torch.bfloat16)
    assert result.op("aten._to_copy").calls == 3  # the input, the weight, the mask


class RelativeBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(64, 64)
        self.bias = nn.Parameter(torch.zeros(4, 16, 16))

    def forward(self, x):
        q = self.q(x).view(2, 16, 4, 16).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=self.bias)


def test_a_trainable_attention_bias_takes_memory_efficient_attention_as_on_the_gpu():
    # cuDNN attention, first on an H100 in bf16, takes no mask that needs a gradient (sdp_utils.cpp's
    # check_attn_mask_shape); flash takes no mask: the memory-efficient kernel runs, and its backward
    # gives the bias its gradient
    result = profile(RelativeBias(), torch.randn(2, 16, 64), train=True, target="h100", autocast=torch.bfloat16)
    assert result.op("aten._scaled_dot_product_efficient_attention").calls == 1
    assert result.op("aten._scaled_dot_product_efficient_attention_backward").calls == 1


def test_memory_efficient_attention_pads_a_mask_whose_rows_are_not_aligned():
    # attention.cpp's preprocess_mask: a mask whose strides are not multiples of 8 elements is copied into
    # rows padded to a multiple of 8, which the kernel keeps for its backward pass
    class Masked(nn.Module):
        def __init__(self, row):
            super().__init__()
            self.q = nn.Linear(64, 64)
            self.register_buffer("mask", torch.zeros(2, 1, 20, row))

        def forward(self, x):
            q = self.q(x).view(2, 20, 4, 16).transpose(1, 2)
            return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=self.mask[..., :20])

    x = torch.randn(2, 20, 64)
    padded = profile(Masked(row=20), x, train=True, target="h100")  # fp32: memory-efficient attention
    kept = profile(Masked(row=24), x, train=True, target="h100")  # the same mask, in rows of 24 floats
    assert padded.op("aten.constant_pad_nd").calls == 1
    with pytest.raises(KeyError):
        kept.op("aten.constant_pad_nd")
    # the padded copy (2 x 20 rows of 24 floats) is held beside the buffer's rows of 20, where the buffer
    # of rows of 24 is used as it is; CUDA's allocator rounds each block up to 512 bytes
    assert padded.peak_memory_bytes - kept.peak_memory_bytes == math.ceil(2 * 20 * 20 * 4 / 512) * 512


def test_flash_attention_runs_heads_padded_to_a_multiple_of_8():
    # attention.cpp pads q, k and v to a multiple of 8 for the flash kernel, scaled by the heads' own
    # size, and slices the output back: the kernel computes on heads of 40 where the model has 36
    class Heads36(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(144, 144)

        def forward(self, x):
            q = self.q(x).view(2, 16, 4, 36).transpose(1, 2)
            return torch.nn.functional.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(2, 16, 144)

    result = profile(Heads36(), torch.randn(2, 16, 144), target="a100", autocast=torch.bfloat16)
    assert result.op("aten.constant_pad_nd").calls == 3
    flash = result.op("aten._scaled_dot_product_flash_attention")
    assert flash.calls == 1
    assert flash.macs == 2 * 2 * 4 * 16 * 16 * 40  # scores and weighted sum, over padded heads of 40


def test_cudnn_attention_comes_first_by_gpu_cuda_and_cudnn(monkeypatch):
    # check_prefer_cudnn_attention: sm_9x and sm_10x from cuDNN 9.15.1; CUDA 12 builds on x.0 and x.3 only
    blackwell = GPUSpec("b-next", 180 << 30, 8e12, {"bfloat16": 2.2e15}, 148, (10, 1))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(kernels, "_cudnn_version", lambda: 91900)
    assert sdp_backend(blackwell, *qkv(torch.bfloat16)) == CUDNN
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert sdp_backend(blackwell, *qkv(torch.bfloat16)) == FLASH
    assert sdp_backend(GPUS["h100"], *qkv(torch.bfloat16)) == CUDNN
    monkeypatch.setattr(kernels, "_cudnn_version", lambda: 91400)  # older than 9.15.1
    assert sdp_backend(GPUS["h100"], *qkv(torch.bfloat16)) == FLASH
