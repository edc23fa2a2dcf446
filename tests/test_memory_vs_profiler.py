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


def profiler_category_maxima(model, x, optimizer):
    """Each category's maximum over the step, by torch.profiler's own memory categories
    (``torch.profiler._memory_profiler``: it classifies every tensor from the recorded graph)."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, Category, MemoryProfileTimeline

    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(torch.device("cpu"))
    return {
        category: max(row[index + 1] for row in sizes) for category, index in _CATEGORY_TO_INDEX.items() if category is not None
    }, Category


def test_category_maxima_agree_with_the_profilers_categories():
    model = torchvision.models.resnet18(num_classes=10)
    x = torch.randn(8, 3, 64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(x).sum().backward()  # a first step makes the momentum buffers: both then see a steady-state step
    optimizer.step()
    optimizer.zero_grad()
    theirs, category = profiler_category_maxima(model, x, optimizer)
    ours = profile(model, x, train=True, optimizer=optimizer).memory.category_max
    assert ours["parameters"] == theirs[category.PARAMETER]
    assert ours["gradients"] == theirs[category.GRADIENT]
    assert ours["optimizer_state"] == theirs[category.OPTIMIZER_STATE]
    assert ours["activations"] == pytest.approx(theirs[category.ACTIVATION], rel=1e-3)
