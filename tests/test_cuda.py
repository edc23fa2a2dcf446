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
