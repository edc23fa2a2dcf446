"""Real CUDA runs: the same figures as analytic mode. Skipped without a GPU."""

import pytest
import torch

from models import TinyCNN, TinyTransformer, flop_figures
from pytest_modelprof import profile

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("factory, inputs", [(TinyCNN, torch.randn(2, 3, 16, 16)), (TinyTransformer, torch.randint(0, 50, (2, 12)))])
def test_cuda_run_equals_analytic_run_claiming_cuda(factory, inputs, train):
    model = factory().cuda()
    real = profile(model, inputs.cuda(), train=train)
    analytic = profile(model, inputs.cuda(), train=train, device="meta")
    assert real.device.startswith("cuda") and analytic.device.startswith("cuda")
    assert real.uncounted == {}
    assert flop_figures(real) == flop_figures(analytic)


def test_cpu_model_profiled_on_cuda_is_not_moved():
    model = TinyCNN()
    result = profile(model, torch.randn(2, 3, 16, 16), device="cuda")
    assert result.device.startswith("cuda")
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert flop_figures(result) == flop_figures(profile(model.cuda(), torch.randn(2, 3, 16, 16).cuda()))


def test_cuda_latency_agrees_with_events_timed_by_hand():
    from pytest_modelprof import Timing

    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).cuda().eval()
    x = torch.randn(8192, 2048, device="cuda")  # milliseconds per call: one call per repeat, as timed by hand
    ours, theirs = [], []
    for _ in range(3):  # interleaved, so that clocks and neighbours reach both alike
        ours.append(profile(model, x, memory=False, latency=Timing(budget=0.5, calibrate=False)).latency_seconds)
        with torch.no_grad():
            for _ in range(5):
                model(x)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            samples = []
            for _ in range(50):
                start.record()
                model(x)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3)
        theirs.append(sorted(samples)[len(samples) // 2])
    ours.sort()
    theirs.sort()
    assert ours[1] == pytest.approx(theirs[1], rel=0.05)


def test_cuda_operator_times_hold_kernel_time():
    from pytest_modelprof import Timing

    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU()).cuda()
    result = profile(model, torch.randn(512, 1024, device="cuda"), train=True, latency=Timing(budget=0.3, layers=True))
    assert result.machine.startswith("cuda-")
    kernels = [o for o in result.op_times if o.self_device_seconds > 0]
    assert {o.phase for o in kernels} >= {"forward", "backward"}
    assert result.module("0").forward_device_seconds > 0 and result.module("0").backward_device_seconds > 0


def test_monitor_reads_the_caching_allocator():
    from pytest_modelprof import MemoryMonitor

    model = TinyCNN().cuda()
    optimizer = torch.optim.Adam(model.parameters())
    with MemoryMonitor(model, optimizer) as monitor:
        for _ in range(3):
            torch.cuda.reset_peak_memory_stats()
            model(torch.randn(4, 3, 16, 16, device="cuda")).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            expected = (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved())
            row = monitor.record()
            assert (row.cuda_allocated, row.cuda_max_allocated, row.cuda_reserved) == expected
    assert monitor.profile().peak_memory_bytes == max(r.cuda_max_allocated for r in monitor.rows)


def test_reserved_estimate_against_the_allocator():
    # a fresh allocator state: what the step reserves is what the model estimates
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()
    x = torch.randn(256, 2048, device="cuda")
    estimated = profile(model, x, train=True).memory
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_reserved()
    result = profile(model, x, train=True)
    measured = torch.cuda.max_memory_reserved() - before
    assert estimated.category_max["workspace"] > 0
    assert result.memory.estimates["reserved_bytes"] == pytest.approx(measured + before, rel=0.05)


def test_a_real_cuda_step_records_the_allocators_figures_beside_the_modelled_ones():
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    x = torch.randn(256, 1024, device="cuda")
    memory = profile(model, x, train=True, optimizer=torch.optim.AdamW(model.parameters())).memory
    measured = memory.measured
    assert measured["max_reserved_bytes"] >= measured["max_allocated_bytes"] >= measured["start_allocated_bytes"] > 0
    # the model's peak counts the step's tensors and workspaces; the allocator's counts them and
    # whatever else the process holds (here, the caller's model and input, copied for the run)
    assert memory.peak_bytes <= measured["max_allocated_bytes"]


@pytest.mark.parametrize("case", ["cnn", "transformer", "lstm"])
def test_the_analytic_target_counts_the_flops_of_the_real_gpu_step(case):
    import torchvision

    if case == "cnn":
        model, x, autocast = torchvision.models.resnet18(num_classes=10), torch.randn(8, 3, 64, 64), None
    elif case == "transformer":
        layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, norm_first=True)
        model, x, autocast = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), torch.randn(4, 128, 256), torch.bfloat16
    else:
        model, x, autocast = torch.nn.LSTM(64, 128, 2, batch_first=True), torch.randn(8, 50, 64), None
    optimizer = torch.optim.AdamW(model.parameters())
    analytic = profile(model, x, train=True, optimizer=optimizer, autocast=autocast, target="h100")
    model, x = model.cuda(), x.cuda()
    real = profile(model, x, train=True, optimizer=torch.optim.AdamW(model.parameters()), autocast=autocast)
    assert analytic.flops == real.flops
    assert analytic.uncounted == real.uncounted == {}
