"""Custom kernels: torch.library ops listed as uncounted until a formula counts them; quantized products
(int8, weight-only int8 and int4, fp8) counted by hand and priced on a target at their math's peak."""

import dataclasses

import pytest
import torch
from torch import nn

from models import Fn
from pytest_modelprof import GPUS, profile, register_flop_formula, unregister_flop_formula
from pytest_modelprof.engine.targets.cost import math_peak
from pytest_modelprof.engine.targets.gpus import Calibration

aten = torch.ops.aten

# ----------------------------------------------------------------------------- torch.library.custom_op


@torch.library.custom_op("modelprof_kernels::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


def _save_output(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.scale = inputs[1]


def _scaled_tanh_backward(ctx, grad):
    (y,) = ctx.saved_tensors
    return grad * (ctx.scale - y * y / ctx.scale), None  # d/dx s tanh(x) = s (1 - tanh^2) = s - y^2 / s


scaled_tanh.register_autograd(_scaled_tanh_backward, setup_context=_save_output)
SCALED_TANH = torch.ops.modelprof_kernels.scaled_tanh
NAME = "modelprof_kernels.scaled_tanh"


def tanh_then_scale(x, scale, *, out_val):
    return 2 * out_val.numel()


class TwoCalls(nn.Module):
    """A projection, then the custom op twice."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 16, bias=False)

    def forward(self, x):
        return scaled_tanh(scaled_tanh(self.proj(x), 2.0), 0.5)


ROWS = 3
PROJECTION = 2 * ROWS * 8 * 16  # FLOPs of the projection
PER_CALL = 2 * ROWS * 16  # tanh and multiply per output element
RUNS = [{}, {"device": "meta"}, {"target": "h100"}]
RUN_IDS = ["real", "meta", "h100"]


@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
def test_a_custom_op_without_formula_is_listed_uncounted_with_its_calls(run):
    result = profile(TwoCalls(), torch.randn(ROWS, 8), **run)
    assert result.uncounted == {NAME: 2}
    assert result.flops == PROJECTION


@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
def test_a_run_s_formulas_count_a_custom_op(run):
    result = profile(TwoCalls(), torch.randn(ROWS, 8), formulas={SCALED_TANH: tanh_then_scale}, **run)
    assert result.uncounted == {}
    assert result.flops == PROJECTION + 2 * PER_CALL
    assert result.op(NAME).calls == 2 and result.op(NAME).flops == 2 * PER_CALL


@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
def test_the_registration_hook_counts_a_custom_op(run):
    register_flop_formula(SCALED_TANH, tanh_then_scale)
    try:
        result = profile(TwoCalls(), torch.randn(ROWS, 8), **run)
    finally:
        unregister_flop_formula(SCALED_TANH)
    assert result.uncounted == {}
    assert result.flops == PROJECTION + 2 * PER_CALL


@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
def test_a_custom_op_s_backward_is_counted_op_by_op(run):
    result = profile(TwoCalls(), torch.randn(ROWS, 8), train=True, **run)
    assert result.uncounted == {NAME: 2}  # the forward calls; its registered backward runs ATen ops
    outputs = ROWS * 16
    # per call: y * y, / scale, scale - that, grad * that; then the projection's weight gradient
    assert result.backward_flops == 2 * 4 * outputs + PROJECTION
    assert result.forward_flops == PROJECTION


def test_a_custom_op_on_a_target_is_a_kernel_of_its_own():
    result = profile(TwoCalls(), torch.randn(ROWS, 8), formulas={SCALED_TANH: tanh_then_scale}, target="h100")
    row = next(op for op in result.predicted.ops if op.op == NAME)
    assert row.calls == 2 and row.flops == 2 * PER_CALL
    assert row.bytes == 2 * 2 * ROWS * 16 * 4  # each call reads its input and writes its output, fp32


# ----------------------------------------------------------------------------- torch.library.triton_op

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

TRITON = triton is not None and hasattr(torch.library, "triton_op")
if TRITON:

    @triton.jit
    def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)

    @torch.library.triton_op("modelprof_kernels::triton_add", mutates_args=())
    def triton_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        torch.library.wrap_triton(_add_kernel)[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64)
        return out

    @triton_add.register_fake
    def _(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)


@pytest.mark.skipif(not TRITON, reason="triton (and torch.library.triton_op) not installed")
@pytest.mark.parametrize("run", RUNS[1:], ids=RUN_IDS[1:])  # a Triton kernel needs a GPU to run for real
def test_a_triton_op_runs_analytically_uncounted_until_a_formula_counts_it(run):
    model = Fn(lambda x: triton_add(x, x))
    x = torch.randn(4, 32)
    assert profile(model, x, **run).uncounted == {"modelprof_kernels.triton_add": 1}
    with_formula = profile(model, x, formulas={torch.ops.modelprof_kernels.triton_add: lambda x, y, *, out_val: out_val.numel()}, **run)
    assert with_formula.uncounted == {} and with_formula.flops == 4 * 32


# ----------------------------------------------------------------------------- quantized products

M, K, N = 32, 64, 48


def needs(name):
    return pytest.mark.skipif(not hasattr(aten, name), reason=f"this torch has no aten.{name}")


def int8(*shape):
    return torch.randint(-128, 128, shape, dtype=torch.int8)


def counted(run, fn, *inputs):
    """The profile of ``fn`` on ``inputs``, every op counted. A real run is skipped where this torch's CPU kernel
    does not take them: some releases have none, or one for tensor-wise fp8 scales only."""
    if not run:
        try:
            fn(*inputs)
        except RuntimeError as error:  # NotImplementedError too: no CPU kernel at all
            pytest.skip(f"this torch's CPU kernel does not take these inputs: {str(error).splitlines()[0][:120]}")
    result = profile(Fn(fn), inputs, **run)
    assert result.uncounted == {}
    return result


@needs("_int_mm")
@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
def test_int8_product_is_m_n_k_macs(run):
    result = counted(run, aten._int_mm, int8(M, K), int8(K, N))
    assert result.macs == M * N * K and result.flops == 2 * M * N * K


@needs("_weight_int8pack_mm")
@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
def test_weight_only_int8_product_is_m_n_k_macs(run):
    x, scales = torch.randn(M, K, dtype=torch.bfloat16), torch.rand(N, dtype=torch.bfloat16)
    result = counted(run, aten._weight_int8pack_mm, x, int8(N, K), scales)
    assert result.macs == M * N * K and result.flops == 2 * M * N * K


@needs("_weight_int4pack_mm_for_cpu")
@needs("_convert_weight_to_int4pack_for_cpu")
@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
def test_weight_only_int4_product_on_the_cpu_is_m_n_k_macs(run):
    group = 32
    packed = aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (N, K), dtype=torch.int32), 2)  # (N, K / 2) bytes
    scales_and_zeros = torch.rand(K // group, N, 2, dtype=torch.bfloat16)
    x = torch.randn(M, K, dtype=torch.bfloat16)
    result = counted(run, lambda x, w, sz: aten._weight_int4pack_mm_for_cpu(x, w, group, sz), x, packed, scales_and_zeros)
    assert result.macs == M * N * K and result.flops == 2 * M * N * K


@needs("_weight_int4pack_mm")
@pytest.mark.parametrize("run", RUNS[1:], ids=RUN_IDS[1:])  # tinygemm's kernel is CUDA's only
def test_weight_only_int4_product_is_m_n_k_macs(run):
    group, inner_k_tiles = 32, 2
    packed = torch.empty(N // 8, K // (inner_k_tiles * 16), 32, inner_k_tiles // 2, dtype=torch.int32, device="meta")  # CUDA's tiles
    scales_and_zeros = torch.empty(K // group, N, 2, dtype=torch.bfloat16, device="meta")
    x = torch.empty(M, K, dtype=torch.bfloat16, device="meta")
    result = counted(run, lambda x, w, sz: aten._weight_int4pack_mm(x, w, group, sz), x, packed, scales_and_zeros)
    assert result.macs == M * N * K and result.flops == 2 * M * N * K


def scaled(a, b, scale_a, scale_b):
    return aten._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)


def fp8(rows, columns, dtype=torch.float8_e4m3fn):
    return torch.randn(rows, columns).to(dtype)


TENSOR_WISE = (torch.tensor(0.5), torch.tensor(2.0))
ROW_WISE = (torch.rand(M, 1), torch.rand(1, N))


@needs("_scaled_mm")
@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize(
    "scales, second",
    [(TENSOR_WISE, torch.float8_e4m3fn), (ROW_WISE, torch.float8_e4m3fn), (TENSOR_WISE, torch.float8_e5m2)],
    ids=["tensor-wise", "row-wise", "e4m3-e5m2"],
)
def test_fp8_product_is_m_n_k_macs(run, scales, second):
    b = fp8(N, K, second).t()  # column-major, as cuBLASLt takes it
    result = counted(run, scaled, fp8(M, K), b, *scales)
    assert result.macs == M * N * K and result.flops == 2 * M * N * K


@needs("_scaled_mm")
@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
def test_fp8_product_with_a_bias_adds_it_per_output(run):
    def with_bias(a, b, scale_a, scale_b, bias):
        return aten._scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=torch.bfloat16)

    result = counted(run, with_bias, fp8(M, K), fp8(N, K).t(), *TENSOR_WISE, torch.randn(N, dtype=torch.bfloat16))
    assert result.macs == M * N * K and result.flops == 2 * M * N * K + M * N


@needs("_scaled_mm_v2")
@pytest.mark.skipif(not hasattr(torch.nn.functional, "scaled_mm"), reason="this torch has no torch.nn.functional.scaled_mm")
@pytest.mark.parametrize("run", RUNS, ids=RUN_IDS)
def test_functional_scaled_mm_is_m_n_k_macs(run):
    row_wise = torch.nn.functional.ScalingType.RowWise

    def functional(a, b, scale_a, scale_b):
        return torch.nn.functional.scaled_mm(a, b, scale_a, row_wise, scale_b, row_wise)

    result = counted(run, functional, fp8(M, K), fp8(N, K).t(), *ROW_WISE)
    assert result.macs == M * N * K and result.flops == 2 * M * N * K


# ----------------------------------------------------------------------------- their peaks on a target

FLAT = Calibration(  # no cost to a short reduction or a small tile: only the waves of tiles over the SMs
    efficiency={"matmul": 0.5, "memory": 0.8}, gemm_half={}, tile_cost={}, kernel_seconds=2e-6, host_seconds=10e-6, view_seconds=1e-6
)
BIG = 8192  # a square product large enough to be bound by its math on every GPU of the table
# BIG x BIG in 64 x 64 tiles: 16384 tiles, in 125 waves over the H100's 132 SMs (16500 slots), 152 over the
# A100's 108 (16416): the waves' share of the product's time beyond its FLOPs at the peak
WAVES = {"h100": 16500 / 16384, "a100-80gb": 16416 / 16384}
TERA = 1e12


def predicted_row(target, fn, *inputs):
    """The target's predicted row of the one product ``fn`` runs on meta ``inputs``."""
    (row,) = (op for op in profile(Fn(fn), inputs, target=target).predicted.ops if op.flops)
    return row


def meta(dtype, *shape):
    return torch.empty(shape, dtype=dtype, device="meta")


def fp8_inputs():
    one = torch.ones((), device="meta")
    return meta(torch.float8_e4m3fn, BIG, BIG), meta(torch.float8_e4m3fn, BIG, BIG).t(), one, one


def test_the_peaks_are_the_datasheets_dense_figures():
    h100, a100 = GPUS["h100"].peak_flops, GPUS["a100-80gb"].peak_flops
    assert h100["float8"] == pytest.approx(3958 / 2 * TERA, rel=1e-3) and h100["int8"] == pytest.approx(3958 / 2 * TERA, rel=1e-3)
    assert a100["int8"] == 624 * TERA and "float8" not in a100
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        assert math_peak(GPUS["h100"], "matmul", dtype) == h100["float8"]
    assert math_peak(GPUS["h100"], "matmul", torch.int8) == h100["int8"]


@needs("_scaled_mm")
def test_an_fp8_product_on_h100_runs_at_the_fp8_peak_by_hand():
    row = predicted_row(dataclasses.replace(GPUS["h100"], calibration=FLAT), scaled, *fp8_inputs())
    assert row.op == "aten._scaled_mm" and row.bound == "compute"
    assert row.seconds == pytest.approx(2 * BIG**3 / (1978.9 * TERA * 0.5) * WAVES["h100"] + 2e-6)  # 1.1 ms; its 268 MB take 0.1 ms
    assert row.bytes == 2 * BIG * BIG + 2 * BIG * BIG + 2 * 4  # fp8 operands, bf16 output, two fp32 scales


@needs("_scaled_mm")
def test_an_fp8_product_takes_half_the_time_of_a_bf16_one_on_the_calibrated_h100():
    fp8_row = predicted_row("h100", scaled, *fp8_inputs())
    bf16_row = predicted_row("h100", torch.mm, meta(torch.bfloat16, BIG, BIG), meta(torch.bfloat16, BIG, BIG))
    assert fp8_row.bound == bf16_row.bound == "compute"
    fixed = GPUS["h100"].calibration.kernel_seconds  # each kernel's, beside its math
    assert (fp8_row.seconds - fixed) / (bf16_row.seconds - fixed) == pytest.approx(989.4 / 1978.9)


@needs("_scaled_mm")
def test_an_fp8_product_on_a_gpu_without_fp8_runs_at_its_float16_peak():
    row = predicted_row(dataclasses.replace(GPUS["a100-80gb"], calibration=FLAT), scaled, *fp8_inputs())
    assert row.seconds == pytest.approx(2 * BIG**3 / (312 * TERA * 0.5) * WAVES["a100-80gb"] + 2e-6)


@needs("_int_mm")
@pytest.mark.parametrize("gpu, tops", [("h100", 1978.9), ("a100-80gb", 624)])
def test_an_int8_product_runs_at_the_int8_peak_by_hand(gpu, tops):
    target = dataclasses.replace(GPUS[gpu], calibration=FLAT)
    row = predicted_row(target, aten._int_mm, meta(torch.int8, BIG, BIG), meta(torch.int8, BIG, BIG))
    assert row.bound == "compute"
    assert row.seconds == pytest.approx(2 * BIG**3 / (tops * TERA * 0.5) * WAVES[gpu] + 2e-6)


@needs("_weight_int8pack_mm")
def test_a_weight_only_int8_product_runs_on_cuda_cores():
    # CUDA's kernel computes each output element in one thread, in float32: the CUDA cores' peak, not the tensor cores'
    rows = 256
    inputs = meta(torch.bfloat16, rows, BIG), meta(torch.int8, BIG, BIG), meta(torch.bfloat16, BIG)
    row = predicted_row(dataclasses.replace(GPUS["h100"], calibration=FLAT), aten._weight_int8pack_mm, *inputs)
    assert row.bound == "compute"
    assert row.seconds == pytest.approx(2 * rows * BIG * BIG / (67 * TERA) + 2e-6)


@needs("_weight_int4pack_mm")
def test_a_weight_only_int4_product_runs_on_bf16_tensor_cores():
    group, inner_k_tiles = 128, 8
    packed = meta(torch.int32, BIG // 8, BIG // (inner_k_tiles * 16), 32, inner_k_tiles // 2)
    inputs = meta(torch.bfloat16, BIG, BIG), packed, meta(torch.bfloat16, BIG // group, BIG, 2)
    target = dataclasses.replace(GPUS["h100"], calibration=FLAT)
    row = predicted_row(target, lambda x, w, sz: aten._weight_int4pack_mm(x, w, group, sz), *inputs)
    assert row.seconds == pytest.approx(2 * BIG**3 / (989.4 * TERA * 0.5) * WAVES["h100"] + 2e-6)
