"""The kernel model's GPU figures: the spec table, power-capped clocks, TF32 as the run had it, recurrent
steps, the fit to kernels timed on their own (NeuSight's data, and synthetic), and NCCL's collectives."""

import dataclasses
import math

import pytest
import torch
from torch import nn

from benchmarks import neusight
from pytest_modelprof import GPUS, profile
from pytest_modelprof.engine.calibrate import KernelFit, fit_kernels, kernel_parameters
from pytest_modelprof.engine.meters import Meter
from pytest_modelprof.engine.meters.predicted import issuer
from pytest_modelprof.engine.targets.collectives import call_seconds, collective_seconds
from pytest_modelprof.engine.targets.cost import Work, kernel_seconds
from pytest_modelprof.engine.targets.gpus import FITTED, Calibration, clock_fraction, simt_batched_tiles, simt_fma_share
from pytest_modelprof.engine.targets.products import Gemm, gemms_of

aten = torch.ops.aten
LOW_POWER = {"t4", "p4", "l4"}  # the 70-75 W cards


def test_every_gpu_of_the_table_has_the_figures_the_model_reads():
    for name, gpu in GPUS.items():
        assert gpu.l2_bytes > 0 and gpu.boost_clock > 0, name
        assert gpu.calibration is FITTED, name  # one set of constants for every GPU
        fraction = clock_fraction(gpu)
        assert (fraction < 1) == (name in LOW_POWER), (name, fraction)
    # the peaks are the boost clock's: FP32 lanes x 2 FLOPs x clock (V100 PCIe 5120 lanes at 1380 MHz)
    assert GPUS["v100-pcie"].peak_flops["float32"] == pytest.approx(5120 * 2 * 1380e6, rel=0.02)
    assert GPUS["t4"].peak_flops["float32"] == pytest.approx(2560 * 2 * 1590e6, rel=0.01)
    assert "bfloat16" not in GPUS["t4"].peak_flops and "tf32" not in GPUS["v100"].peak_flops


def test_a_power_capped_gpu_runs_its_math_at_the_clock_its_limit_holds_by_hand():
    """A T4's float32 peak, 8.1 TFLOP/s, would draw 8.1e12 / (16.3e12 / 295) = 147 W at Turing's FLOP/s per
    watt (a Quadro RTX 8000's, which holds its boost): 70 W holds 70 / 146.6 of it, at that fraction of the
    clock if the power grows as the clock, at its square root if as its square; idle half the time, it needs
    only half the power."""
    t4 = GPUS["t4"]
    share = 70 / (8.1e12 / (16.3e12 / 295))
    assert clock_fraction(t4) == pytest.approx(share)
    assert clock_fraction(t4, exponent=2.0) == pytest.approx(math.sqrt(share))
    assert clock_fraction(t4, duty=0.5) == pytest.approx(2 * share)
    assert clock_fraction(t4, duty=0.1) == 1.0
    assert clock_fraction(GPUS["h100"]) == 1.0 and clock_fraction(GPUS["v100-pcie"]) == 1.0
    # a product's math runs at that clock; its memory time does not
    calibration = Calibration(efficiency={"matmul_simt": 1.0, "memory": 1.0}, gemm_half={}, tile_cost={}, kernel_seconds=0.0)
    work = Work("aten.mm", "matmul", 2 * 4096**3, 0, torch.float32, 1, (Gemm(4096, 4096, 4096),))
    unlimited = dataclasses.replace(t4, power=0.0)
    assert kernel_seconds(t4, calibration, work)[0] == pytest.approx(kernel_seconds(unlimited, calibration, work)[0] / share)


def test_a_simt_product_loses_fma_lanes_or_issue_slots_to_its_other_instructions_where_the_architecture_shares_them():
    """Pascal has no integer lanes, GA10x and Ada run integers on half their FP32 lanes: ``simt_integer``
    integer instructions per FMA take lanes from the FMAs. Hopper's and data-centre Blackwell's schedulers have a warp's
    worth of FP32 lanes and issue one instruction a cycle: ``simt_issue`` other instructions per FMA take
    issue slots from them. Volta's, Turing's and GA100's have half as many lanes, and issue the others while an
    FMA holds them: a product on their CUDA cores runs its FMAs at all of the peak; on TF32's tensor cores,
    every GPU does."""
    calibration = Calibration(simt_integer=0.3, simt_issue=0.1)
    assert [simt_fma_share(GPUS[n], calibration) for n in ("p100", "p4", "l4", "rtx4090")] == [pytest.approx(1 / 1.3)] * 4
    assert [simt_fma_share(GPUS[n], calibration) for n in ("h100", "h200", "b200")] == [pytest.approx(1 / 1.1)] * 3
    assert [simt_fma_share(GPUS[n], calibration) for n in ("v100", "t4", "a100-80gb", "a100-pcie-40gb")] == [1.0] * 4
    # float64 runs on units of its own, which neither loss touches
    assert [simt_fma_share(GPUS[n], calibration, torch.float64) for n in ("p100", "l4", "h100")] == [1.0] * 3
    # and the fit looks for the figure where the loss is, on CUDA cores only
    mm = Work("aten.mm", "matmul", 2 * 1024**3, 0, torch.float32, 1, (Gemm(1024, 1024, 1024),))
    loss = {("simt_integer", None), ("simt_issue", None)}

    def fitted(gpu, work):
        return loss & set(kernel_parameters([(GPUS[gpu], work)]))

    assert fitted("h100", mm) == {("simt_issue", None)} and fitted("l4", mm) == {("simt_integer", None)}
    assert fitted("a100-80gb", mm) == fitted("h100", mm._replace(tf32=True)) == fitted("h100", mm._replace(dtype=torch.float64)) == set()
    # the architectures whose FP32 lanes the model shares are those with 128 of them an SM (two schedulers of 32 on
    # the P100), read off the spec table's float32 peak: a warp's worth a scheduler
    for name, gpu in GPUS.items():
        lanes = gpu.peak_flops.get("float32", 0.0) / (2 * gpu.sm_count * gpu.boost_clock) if gpu.boost_clock else 0.0
        if lanes and gpu.compute_capability[0] >= 7:
            assert (simt_fma_share(gpu, calibration) < 1) == (lanes > 96), (name, lanes)
    work = Work("aten.mm", "matmul", 2 * 4096**3, 0, torch.float32, 1, (Gemm(4096, 4096, 4096),))
    more, less = Calibration(simt_integer=0.5, kernel_seconds=0.0), Calibration(simt_integer=0.25, kernel_seconds=0.0)
    l4, h100, a100 = GPUS["l4"], GPUS["h100"], GPUS["a100-80gb"]
    assert kernel_seconds(l4, more, work)[0] == pytest.approx(kernel_seconds(l4, less, work)[0] * 1.5 / 1.25)
    assert kernel_seconds(h100, more, work)[0] == pytest.approx(kernel_seconds(h100, less, work)[0])
    assert kernel_seconds(a100, more, work)[0] == pytest.approx(kernel_seconds(a100, less, work)[0])
    issue = dataclasses.replace(less, simt_issue=0.2)
    assert kernel_seconds(h100, issue, work)[0] == pytest.approx(kernel_seconds(h100, less, work)[0] * 1.2)
    assert kernel_seconds(l4, issue, work)[0] == pytest.approx(kernel_seconds(l4, less, work)[0])
    tf32 = work._replace(tf32=True)
    assert kernel_seconds(l4, more, tf32)[0] == pytest.approx(kernel_seconds(l4, less, tf32)[0])


def test_a_batched_simt_product_is_priced_in_the_tiles_its_library_runs_it_in():
    """cuBLAS runs every batched float32 product of an A100 in 128x128 tiles (NeuSight's kernel names: all 16,661
    of them): each item of a batch whose output is 32x32 takes a whole tile, as one whose output is 128x128
    does, so with the reduction long enough that the math decides, both take the same time; where the library
    has smaller tiles (a P100's, here any), the small product takes tiles of 4096 outputs (a quarter of 128x128,
    at a smaller tile's lower efficiency): less than a third of the time."""
    calibration = dataclasses.replace(FITTED, kernel_seconds=0.0)

    def bmm(gpu: str, rows: int, batch: int = 4096, k: int = 8192, layout: str = "nn") -> float:
        flops = 2 * batch * rows * rows * k
        work = Work("aten.bmm", "matmul", flops, 0, torch.float32, 1, (Gemm(rows, rows, k, 1.0, batch, layout),))
        return kernel_seconds(GPUS[gpu], calibration, work)[0]

    assert simt_batched_tiles(GPUS["a100-80gb"]) == ((128, 128),)
    assert bmm("a100-80gb", 32) == pytest.approx(bmm("a100-80gb", 128))
    assert bmm("p100", 32) < bmm("p100", 128) / 3
    # the data hold the tiles of row-major operands' products only ("nn"); a transposed one's may be any
    assert bmm("a100-80gb", 32, layout="tn") < bmm("a100-80gb", 128, layout="tn") / 3
    x, w = torch.empty(4, 32, 64, device="meta"), torch.empty(4, 16, 64, device="meta")
    assert [g.layout for g in gemms_of("aten.bmm", (x, w.transpose(1, 2).contiguous()), None)] == ["nn"]
    assert [g.layout for g in gemms_of("aten.bmm", (x, w.transpose(1, 2)), None)] == ["tn"]  # q @ k.transpose(-1, -2)
    assert [g.layout for g in gemms_of("aten.mm", (x[0], w[0].t()), None)] == ["tn"]  # linear: x @ w.t()


def test_the_batched_tiles_are_those_the_data_ran_as_rows_and_columns_of_the_output():
    """cuBLAS is column-major: its kernel ``volta_sgemm_AxB_nn`` covers a row-major output in tiles of A of its
    columns by B of its rows, so its launch grid is ceil(columns / A) x ceil(rows / B) x batch. Read off every
    batched "nn" product a V100 and a T4 ran (NeuSight's rows: ``k`` output columns, ``m`` rows), each grid says
    so, and each tile, as (rows, columns), is one the model offers that GPU; no other tile is offered."""
    seen: dict[str, set[tuple[int, int]]] = {"v100-pcie": set(), "t4": set()}
    for row in neusight.rows():
        gpu = neusight.GPU_NAMES[row["gpu"]]
        name = row["kernel_name"]
        if row["op"] != "bmm" or gpu not in seen or int(row["b"]) < 2 or "sliced" in name or not name.endswith("_nn"):
            continue
        across, down = (int(n) for n in name.removesuffix("_nn").rsplit("_", 1)[1].split("x"))
        grid = tuple(int(n) for n in row["grid"].split("x"))
        assert grid == (math.ceil(int(row["k"]) / across), math.ceil(int(row["m"]) / down), int(row["b"])), row
        seen[gpu].add((down, across))
    for gpu, tiles in seen.items():
        assert set(simt_batched_tiles(GPUS[gpu])) == tiles, gpu


def test_a_pooling_kernel_is_priced_by_its_elements_index_arithmetic_by_hand():
    """A max pool's kernel works out each element's window from its index: its time is its elements at the kind's
    rate per SM and cycle, on every SM at the boost clock, where that is longer than its bytes take; the forward
    pass's elements are its input's (64 x 64 x 112 x 112, ResNet's stem), the backward pass's the input whose
    gradient it computes. A calibration without the kind's rate prices it by its bytes, as before it had one."""
    h100 = GPUS["h100"]
    calibration = Calibration(efficiency={"memory": 1.0, "pool": 0.5, "pool_backward": 0.25}, kernel_seconds=0.0)
    cycles = 132 * 1980e6
    x = torch.empty(64, 64, 112, 112, device="meta")
    forward = neusight.work_of_call(aten.max_pool2d_with_indices.default, (x, [3, 3], [2, 2], [1, 1]))
    assert forward.kind == "pool" and forward.elements == 64 * 64 * 112 * 112
    assert kernel_seconds(h100, calibration, forward) == (pytest.approx(64 * 64 * 112 * 112 / (cycles * 0.5)), "compute")
    half = neusight.work_of_call(aten.max_pool2d_with_indices.default, (x.bfloat16(), [3, 3], [2, 2], [1, 1]))  # the same arithmetic
    assert kernel_seconds(h100, calibration, half)[0] == pytest.approx(kernel_seconds(h100, calibration, forward)[0])
    indices = torch.empty(64, 64, 56, 56, dtype=torch.long, device="meta")
    backward = neusight.work_of_call(
        aten.max_pool2d_with_indices_backward.default, (indices.float(), x, [3, 3], [2, 2], [1, 1], [1, 1], False, indices)
    )
    assert backward.kind == "pool_backward" and backward.elements == x.numel()
    assert kernel_seconds(h100, calibration, backward)[0] == pytest.approx(x.numel() / (cycles * 0.25))
    # input, output and int64 indices, read and written once
    assert forward.bytes == 4 * x.numel() + (4 + 8) * indices.numel()
    by_bytes = Calibration(efficiency={"memory": 1.0}, kernel_seconds=0.0)
    assert kernel_seconds(h100, by_bytes, forward) == (pytest.approx(forward.bytes / h100.bandwidth), "memory")
    # average pooling's backward pass goes over its input's gradient too; a 3-d pool runs other kernels (its backward
    # pass scatters over the output's gradient), not measured: priced by its bytes
    average = neusight.work_of_call(aten.avg_pool2d_backward.default, (indices.float(), x, [2, 2], [2, 2], [0, 0], False, True, None))
    assert average.kind == "pool_backward" and average.elements == x.numel()
    volume = neusight.work_of_call(
        aten.max_pool3d_with_indices.default, (torch.empty(2, 8, 16, 16, 16, device="meta"), [2, 2, 2], [2, 2, 2])
    )
    assert volume.kind == "memory" and volume.elements == 0


def test_a_layer_norms_rows_each_take_their_cycles_by_hand():
    """A layer norm's forward pass gives each row a block: over ConvNeXt's first stage (32 x 56 x 56 rows of 96
    channels) its time is its rows at the kind's cycles each, on every SM at the boost clock, not its bytes
    (read twice, written once: 1.5 passes); over rows of 4096 it is its bytes. Its backward pass has no such
    figure. A calibration without one prices the rows by their bytes, as before it had one."""
    h100 = GPUS["h100"]
    calibration = Calibration(
        efficiency={"memory": 1.0, "norm": 1.0, "norm_backward": 1.0}, reduction_cycles={"norm": 500.0}, kernel_seconds=0.0
    )
    cycles = 132 * 1980e6
    x, weight = torch.empty(32, 56, 56, 96, device="meta"), torch.empty(96, device="meta")
    narrow = neusight.work_of_call(aten.native_layer_norm.default, (x, [96], weight, weight, 1e-6))
    assert narrow.kind == "norm" and narrow.reductions == 32 * 56 * 56
    assert kernel_seconds(h100, calibration, narrow) == (pytest.approx(32 * 56 * 56 * 500 / cycles), "compute")
    by_bytes = dataclasses.replace(calibration, reduction_cycles={})
    assert kernel_seconds(h100, by_bytes, narrow) == (pytest.approx(narrow.bytes * 1.5 / h100.bandwidth), "memory")
    wide_x, wide_weight = torch.empty(16384, 4096, device="meta"), torch.empty(4096, device="meta")
    wide = neusight.work_of_call(aten.native_layer_norm.default, (wide_x, [4096], wide_weight, wide_weight, 1e-5))
    assert kernel_seconds(h100, calibration, wide) == (pytest.approx(wide.bytes * 1.5 / h100.bandwidth), "memory")
    mean, rstd = torch.empty(32, 56, 56, 1, device="meta"), torch.empty(32, 56, 56, 1, device="meta")
    backward = neusight.work_of_call(aten.native_layer_norm_backward.default, (x, x, [96], mean, rstd, weight, weight, [True, True, True]))
    assert backward.kind == "norm_backward"
    assert kernel_seconds(h100, calibration, backward) == kernel_seconds(h100, by_bytes, backward)


class MatMul(nn.Module):
    def forward(self, a, b):
        return a @ b


def test_float32_products_run_on_tf32_tensor_cores_only_where_the_run_allowed_it():
    a, b = (torch.empty(4096, 4096, device="meta") for _ in range(2))
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        simt = profile(MatMul(), (a, b), target="a100-80gb", flops=False, memory=False).predicted.ops[0]
        torch.backends.cuda.matmul.allow_tf32 = True
        tensor = profile(MatMul(), (a, b), target="a100-80gb", flops=False, memory=False).predicted.ops[0]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    # 156 TFLOP/s of TF32 against 19.5 of float32 on CUDA cores: several times faster, whatever the efficiencies
    assert simt.bound == tensor.bound == "compute" and simt.seconds > 4 * tensor.seconds


def test_neusights_kernels_are_read_as_their_launches_show():
    """The data's first T4 linear row: 58 x 13 input, 141 output features; its kernel, volta_sgemm_32x128_tn,
    launched a 5 x 1 grid: ceil(141 / 32) x ceil(58 / 128), so the output is 58 x 141 reduced over 13."""
    data = [m for m in neusight.measurements(3) if m.op == "linear" and m.gpu.name == "t4"]
    assert len(data) == 3 and all(m.work.kind == "matmul" and not m.work.tf32 for m in data)
    first = next(row for row in neusight.rows() if row["op"] == "linear" and row["gpu"] == "Tesla T4")
    assert (first["m"], first["n"], first["k"], first["kernel_name"], first["grid"]) == (
        "58",
        "13",
        "141",
        "volta_sgemm_32x128_tn",
        "5x1x1",
    )
    assert neusight.work_of(first).gemms == (Gemm(58, 141, 13, layout="tn"),)
    # the layout read off the operands is the one in the kernels' names (cuBLAS's letters), on every GPU
    seen: dict[tuple[str, str], int] = {}
    for row in neusight.rows():
        if row["op"] in ("bmm", "linear") and seen.get((row["op"], row["gpu"]), 0) < 3:
            seen[(row["op"], row["gpu"])] = seen.get((row["op"], row["gpu"]), 0) + 1
            assert row["kernel_name"].endswith("_" + neusight.work_of(row).gemms[0].layout), row
    assert len(seen) == 10
    kinds = {m.kind for m in neusight.measurements(1)}
    assert kinds == {"bmm", "linear", "conv", "elementwise", "softmax", "layer norm"}


def test_fitting_kernels_timed_on_their_own_recovers_the_constants_behind_them():
    """Kernels on a T4 and a V100 timed with a fixed cost per class, made by known constants: the fit, from
    the round defaults, predicts each of them again."""
    true = dataclasses.replace(
        FITTED, efficiency={**FITTED.efficiency, "matmul_simt": 0.7, "memory": 0.6}, tile_cost={"simt": 8.0}, kernel_seconds=4e-6
    )
    overhead = {"linear": 30e-6, "elementwise": 20e-6}
    made = KernelFit(true, overhead)
    timed = []
    for gpu in (GPUS["t4"], GPUS["v100-pcie"]):
        for n in (64, 256, 1024, 2048, 4096):
            product = Work("aten.mm", "matmul", 2 * n * n * 512, 4 * (2 * n * 512 + n * n), torch.float32, 1, (Gemm(n, n, 512),))
            add = Work("aten.add", "memory", n * n, 12 * n * n, torch.float32)
            timed += [(gpu, w, kind, made.seconds(gpu, w, kind)) for w, kind in ((product, "linear"), (add, "elementwise"))]
    fitted = fit_kernels(timed)
    for gpu, work, kind, seconds in timed:  # (a class's fixed cost and each kernel's trade off against each other)
        assert fitted.seconds(gpu, work, kind) == pytest.approx(seconds, rel=0.03)


GiB = 2**30


def test_collectives_reach_the_published_bus_bandwidths_and_small_ones_their_latency():
    """nccl-tests' figures: ~370 GB/s of bus bandwidth for an all-gather over H100 NVLink, ~480 GB/s for its
    NVLS all-reduce, 46-49 GB/s per 400 Gb/s NIC between nodes (8 to a DGX node); an 8 KiB all-gather is NCCL's LL protocol's,
    6.6 us and 0.6 us a hop, at a third of the bandwidth."""
    h100, a100 = GPUS["h100"], GPUS["a100-80gb"]

    def bus_bandwidth(gpu, kind, ranks, nodes):
        return 8 * GiB / call_seconds(gpu, kind, 8 * GiB, ranks, nodes)  # large enough that the latency is lost in it

    assert bus_bandwidth(h100, "all_gather", 8, 1) == pytest.approx(370e9, rel=0.01)
    assert bus_bandwidth(h100, "all_reduce", 8, 1) == pytest.approx(480e9, rel=0.01)
    # across two nodes, NCCL's channels cross through all eight NICs of a node (380 GB/s): NVLink still bounds it;
    # a group of one GPU per node crosses through one NIC
    assert bus_bandwidth(h100, "reduce_scatter", 16, 2) == pytest.approx(370e9, rel=0.01)
    assert bus_bandwidth(h100, "reduce_scatter", 2, 2) == pytest.approx(47.5e9, rel=0.01)
    assert bus_bandwidth(GPUS["l4"], "all_gather", 16, 2) == pytest.approx(100e9 / 8 * 47.5 / 50, rel=0.01)  # one 100 Gb/s NIC a node
    assert bus_bandwidth(a100, "all_reduce", 8, 1) == pytest.approx(300e9 * 370 / 450, rel=0.01)  # no NVLS: a ring
    small = 8 * 1024
    assert call_seconds(h100, "all_gather", small, 8, 1) == pytest.approx((6.6 + 7 * 0.6) * 1e-6 + small / (370e9 / 3))
    assert call_seconds(h100, "all_gather", small, 1, 1) == 0.0  # one rank moves nothing
    # the calls of a row are priced at their mean size
    assert collective_seconds(h100, "all_gather", 4, 4 * small, 8, 1) == pytest.approx(4 * call_seconds(h100, "all_gather", small, 8, 1))
    assert collective_seconds(dataclasses.replace(h100, interconnect=0.0), "all_gather", 1, small, 8, 1) is None


def test_every_op_run_for_an_autograd_node_is_issued_by_the_engine_the_losss_backward_too():
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    issuers = {}

    class Issuers(Meter):
        def op(self, op):
            tensors = [t for t in (*op.args, op.out) if isinstance(t, torch.Tensor)]
            issuers.setdefault((op.phase, op.name), set()).add(issuer(op, tensors))

    loss = nn.CrossEntropyLoss()
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    profile(model, x, train=True, loss_fn=lambda out: loss(out, y), meters=[Issuers()], flops=False, memory=False)
    assert issuers[("loss", "aten.nll_loss_backward")] == {"engine"}  # run by the loss's node, in the backward pass
    assert issuers[("forward", "aten.addmm")] == {"recorded"} and issuers[("backward", "aten.mm")] == {"engine"}


def test_figures_a_model_cannot_run_with_are_refused():
    with pytest.raises(ValueError, match="power_exponent must be positive"):
        Calibration(power_exponent=0.0)
    with pytest.raises(ValueError, match="simt_integer must be zero or more"):
        Calibration(simt_integer=-0.1)
    with pytest.raises(ValueError, match="simt_issue must be zero or more"):
        Calibration(simt_issue=-0.1)
    with pytest.raises(ValueError, match="peak_flops must give a positive FLOP/s"):
        dataclasses.replace(GPUS["h100"], peak_flops={})


def test_a_small_all_reduce_across_many_nodes_goes_up_and_down_a_tree_by_hand():
    """512 H100s on 64 nodes, 8 KiB: a ring's 1022 steps (126 of them between nodes) cost 884 us of LL
    latency; a tree's LL costs 6.8 us and, up and down, 7 NVLink hops of 0.6 and log2(64) = 6 network hops of
    5.0: 75.2 us, at a quarter of 90% of the ring's bandwidth (370 GB/s: NVLink bounds the nodes' 8 NICs)."""
    small = 8 * 1024
    tree = (6.8 + 2 * (7 * 0.6 + 6 * 5.0)) * 1e-6 + small / (0.9 * 370e9 / 4)
    assert call_seconds(GPUS["h100"], "all_reduce", small, 512, 64) == pytest.approx(tree)
