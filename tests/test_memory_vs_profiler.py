"""The memory meter against PyTorch's own record of a real CPU training step.

torch.profiler with profile_memory=True records every allocation and free of the step
(its "[memory]" events, in time order); their running sum's maximum, plus the tensors
resident before the step (weights, buffers, inputs), is the step's true peak.
"""

import pytest
import torch
import torchvision

from models import TinyTransformer
from pytest_modelprof import profile


def profiler_peak(model, x):
    model.train()
    resident = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers(), x]}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        model(x).sum().backward()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    assert len(events) > 100  # the record is there
    total = peak = 0
    for _, nbytes in events:
        total += nbytes
        peak = max(peak, total)
    model.zero_grad(set_to_none=True)
    return sum(resident.values()) + peak


@pytest.mark.parametrize(
    "factory, inputs",
    [
        (lambda: torchvision.models.resnet18(num_classes=10), lambda: torch.randn(8, 3, 64, 64)),
        (lambda: TinyTransformer(vocab=500, width=128, layers=4), lambda: torch.randint(0, 500, (8, 64))),
    ],
    ids=["cnn", "transformer"],
)
def test_peak_within_two_percent_of_the_profilers_record(factory, inputs):
    model, x = factory(), inputs()
    recorded = profiler_peak(model, x)
    measured = profile(model, x, train=True).peak_memory_bytes
    assert abs(measured - recorded) / recorded < 0.02
