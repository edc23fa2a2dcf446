"""ATen's CUDA reductions as the cost model lays them out (engine/targets/reduce_kernel.py): the blocks
``setReduceConfig`` picks, worked by hand and against the kernels an H100 and an H200 ran, and the time
the split ones add beside their bytes."""

import dataclasses
import json
import re
import statistics

import pytest
import torch

from benchmarks import gpu_truth
from pytest_modelprof import GPUS
from pytest_modelprof.engine.calibrate import kernel_time
from pytest_modelprof.engine.targets.cost import Work, kernel_seconds
from pytest_modelprof.engine.targets.gpus import Calibration, threads_per_sm
from pytest_modelprof.engine.targets.reduce_kernel import blocks_per_output, launches

aten = torch.ops.aten


def sum_launches(shape, dims, dtype=torch.float32, memory_format=torch.contiguous_format):
    x = torch.empty(shape, device="meta", dtype=dtype).contiguous(memory_format=memory_format)
    return launches(aten.sum.dim_IntList, (x, dims), {}, aten.sum.dim_IntList(x, dims))


def test_a_sum_down_the_rows_splits_each_columns_inputs_across_blocks_as_setreduceconfig_does():
    # float32 (174762, 192).sum(0), by hand from Reduce.cuh: the reduced dimension is not the fastest, so lanes hold
    # outputs, 4 each (vectorised along them): 48 output vectors; 512 / 4 = 128 threads a block, 32 lanes by 4 rows;
    # 174762 inputs per output >= 256, so the rows split them (43691 each) and the 48 vectors take 2 blocks. An H100
    # (132 SMs of 2048 threads, 16 blocks of 128 each) targets 2112 blocks: each output's inputs go to
    # max(min(2112 / 2, 43691 / 16), 43691 / 256) = 1056 blocks, whose partials the last block's 4 rows step through
    (kernel,) = sum_launches((174762, 192), [0])
    assert (kernel.threads, kernel.vector, kernel.width, kernel.height, kernel.grid) == (128, 4, 32, 4, 2)
    assert (kernel.lanes_reduce, kernel.rows_split, kernel.values, kernel.stepping) == (False, True, 43691, 4)
    assert blocks_per_output(kernel, 132, 2048) == 1056
    assert blocks_per_output(kernel, 108, 2048) == 864  # an A100: 108 x 16 / 2
    # along the rows: lanes reduce one output together, 512 threads, 16 rows of one output each, no split
    (kernel,) = sum_launches((192, 5461), [1])
    assert (kernel.threads, kernel.vector, kernel.lanes_reduce, kernel.rows_split, kernel.grid) == (512, 1, True, False, 12)
    assert blocks_per_output(kernel, 132, 2048) == 1


def test_a_sum_over_an_nchw_tensors_batch_and_pixels_works_out_its_offsets_one_by_one():
    # contiguous: the pixels (fastest) and the batch cannot coalesce around the channels, two reduced dimensions
    # whose offsets each input works out; channels-last: batch and pixels coalesce into one, the channels fastest
    (kernel,) = sum_launches((32, 96, 56, 56), [0, 2, 3])
    assert kernel.offsets and kernel.lanes_reduce and kernel.elements == 32 * 96 * 56 * 56
    (kernel,) = sum_launches((32, 96, 56, 56), [0, 2, 3], memory_format=torch.channels_last)
    assert not kernel.offsets and not kernel.lanes_reduce and kernel.vector == 4
    assert sum_launches((4, 8), [1]) and not launches(aten.mm.default, (torch.empty(2, 2, device="meta"),) * 2, {}, None)


def test_the_layout_probes_ran_the_kernels_the_model_lays_out():
    # every sum of the layout probes (data/gpu-truth/h100-layout.json, h200-layout.json: down rows, along rows, over
    # an NCHW tensor's batch and pixels; 96 to 3072 outputs, 1 M to 67 M elements, float32 and bfloat16): the
    # output vector the kernel was compiled for (reduce_kernel<512 / vector, vector>) and whether a memset of
    # semaphores ran before it (blocks split each output's inputs) are what the model lays out for that GPU
    rows = 0
    for name in ("h100", "h200"):
        gpu = GPUS[name]
        path = gpu_truth.TRUTH / f"{name}-layout.json"
        for row in json.loads(path.read_text())["rows"]:
            if row["family"] != "reduction":
                continue
            func, args = gpu_truth._layout_call(row["case"], row["shape"], getattr(torch, row["dtype"]))
            (kernel,) = launches(func, args, {}, func(*args))
            launched = next(k for k in row["kernels"] if "reduce_kernel" in k)
            vector = int(re.search(r"reduce_kernel<\d+, (\d+)", launched).group(1))
            split = blocks_per_output(kernel, gpu.sm_count, threads_per_sm(gpu.compute_capability)) > 1
            assert (vector, any("Memset" in k for k in row["kernels"])) == (kernel.vector, split), row
            rows += 1
    assert rows == 432


def test_a_split_sum_adds_its_staging_steps_and_memset_and_an_nchw_sum_its_offsets():
    gpu = GPUS["h100"]
    calibration = Calibration(efficiency={"memory": 1.0, "reduction_rate": 2.0}, reduction_cycles={"staging": 500.0}, kernel_seconds=3e-6)
    x = torch.empty(174762, 192, device="meta")
    nbytes = x.numel() * 4 + 192 * 4
    work = Work("aten.sum", "memory", x.numel(), nbytes, torch.float32, launches=sum_launches(x.shape, [0]))
    # two kernels (the memset, the sum); its bytes at the bandwidth; 1056 / 4 = 264 staging steps of 500 cycles
    expected = 2 * 3e-6 + nbytes / gpu.bandwidth + 264 * 500 / gpu.boost_clock
    assert kernel_seconds(gpu, calibration, work)[0] == pytest.approx(expected, rel=1e-9)
    # bfloat16 32 x 3072 x 341: its elements at 2 per SM and cycle outlast its bytes
    elements = 32 * 3072 * 341
    work = Work("aten.sum", "memory", elements, elements * 2, torch.bfloat16, launches=sum_launches((32, 3072, 341, 1), [0, 2, 3]))
    expected = 3e-6 + elements / (2.0 * gpu.sm_count * gpu.boost_clock)
    assert kernel_seconds(gpu, calibration, work) == (pytest.approx(expected, rel=1e-9), "compute")
    # a calibration without the constants prices both by their bytes alone, a split one's memset beside them
    bare = Calibration(efficiency={"memory": 1.0}, reduction_cycles={}, kernel_seconds=3e-6)
    assert kernel_seconds(gpu, bare, work)[0] == pytest.approx(3e-6 + elements * 2 / gpu.bandwidth, rel=1e-9)
    split = Work("aten.sum", "memory", 174762 * 192, nbytes, torch.float32, launches=sum_launches((174762, 192), [0]))
    assert kernel_seconds(gpu, bare, split)[0] == pytest.approx(2 * 3e-6 + nbytes / gpu.bandwidth, rel=1e-9)
    # along the rows of 96 x 699050: lanes reduce one output together, a block of 32 x 16 threads an output, 1366
    # inputs a thread; 96 blocks of 512 threads on an H100 (528 of them fit) split each output across
    # max(min(div_up(528, 96), div_up(1366, 16)), div_up(1366, 256)) = 6 blocks, and all 512 threads of the last one
    # step through the 6 partials at once: one step
    (kernel,) = sum_launches((96, 699050), [1])
    assert kernel.stepping == 512 and blocks_per_output(kernel, 132, 2048) == 6
    elements = 96 * 699050
    work = Work("aten.sum", "memory", elements, elements * 4 + 96 * 4, torch.float32, launches=(kernel,))
    expected = 2 * 3e-6 + (elements * 4 + 96 * 4) / gpu.bandwidth + 500 / gpu.boost_clock
    assert kernel_seconds(gpu, calibration, work)[0] == pytest.approx(expected, rel=1e-9)


def test_a_sum_over_few_channels_works_out_its_offsets_on_the_sms_its_blocks_occupy():
    # float32 32 x 192 x 170 over its batch and pixels: 192 outputs of 32 x 170 = 5440 inputs; a block's 32 lanes
    # split each output's inputs, 170 a lane, under 256, so its 16 rows take an output each: 192 / 16 = 12 blocks,
    # none split. They work out the offsets on 12 of an H100's 132 SMs
    gpu = GPUS["h100"]
    (kernel,) = sum_launches((32, 192, 170, 1), [0, 2, 3])
    assert kernel.offsets and (kernel.grid, kernel.values, kernel.rows_split) == (12, 170, False)
    assert blocks_per_output(kernel, gpu.sm_count, 2048) == 1
    calibration = Calibration(efficiency={"memory": 1.0, "reduction_rate": 2.0}, reduction_cycles={}, kernel_seconds=0.0)
    elements = 32 * 192 * 170
    work = Work("aten.sum", "memory", elements, 0, torch.float32, launches=(kernel,))
    assert kernel_seconds(gpu, calibration, work)[0] == pytest.approx(elements / (2.0 * 12 * gpu.boost_clock), rel=1e-9)


def test_the_h200s_sums_take_the_time_the_h100s_constants_say():
    # the staging steps' cycles and the offsets' rate are fitted with the rest on the H100's layout probes; the
    # H200's (the same SMs and clock, 1.4 times the bandwidth; in no fit), against the shipped constants: a median
    # 15% off, where by their bytes alone (the calibration without them) 44% off, 0.56 of the time at the median
    gpu = GPUS["h200"]
    sums = [(works, seconds) for _, works, seconds in gpu_truth.layout_kernels(gpu) if works[0].launches]
    assert len(sums) == 216
    shipped = gpu.calibration
    bare = dataclasses.replace(
        shipped,
        efficiency={k: v for k, v in shipped.efficiency.items() if k != "reduction_rate"},
        reduction_cycles={k: v for k, v in shipped.reduction_cycles.items() if k != "staging"},
    )
    ratios = [kernel_time(gpu, works, shipped) / seconds for works, seconds in sums]
    before = [kernel_time(gpu, works, bare) / seconds for works, seconds in sums]
    assert statistics.median(abs(r - 1) for r in ratios) < 0.17
    assert statistics.median(abs(r - 1) for r in before) > 0.4 and statistics.median(before) < 0.6
