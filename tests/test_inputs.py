"""The forms ``inputs`` may take, and where the run happens."""

import pytest
import torch
from torch import nn

from pytest_modelprof import profile


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 3, bias=False)
        self.b = nn.Linear(5, 3, bias=False)

    def forward(self, x, y=None, *, scale=1.0):
        out = self.a(x)
        if y is not None:
            out = out + self.b(y)
        return out * scale


X, Y = torch.randn(2, 4), torch.randn(2, 5)
BOTH = 2 * 2 * 4 * 3 + 2 * 2 * 5 * 3 + 2 * 3 + 2 * 3  # two linears, the add, the scale


@pytest.mark.parametrize(
    "inputs",
    [
        (X, Y),
        [X, Y],
        {"x": X, "y": Y},
        ((X,), {"y": Y}),
        ((X, Y), {"scale": 2.0}),
    ],
    ids=["tuple", "list", "dict", "args-kwargs", "args-scalar-kwarg"],
)
def test_input_forms(inputs):
    assert profile(TwoInputs(), inputs).flops == BOTH


def test_single_tensor():
    assert profile(TwoInputs(), X).flops == 2 * 2 * 4 * 3 + 2 * 3


def test_explicit_cpu_device_equals_default():
    model = TwoInputs()
    assert profile(model, (X, Y), device="cpu").to_dict() == profile(model, (X, Y)).to_dict()


def test_profile_reports_where_it_ran():
    real = profile(TwoInputs(), (X, Y))
    analytic = profile(TwoInputs(), (X, Y), device="meta")
    assert (real.device, real.analytic) == ("cpu", False)
    assert (analytic.device, analytic.analytic) == ("cpu", True)


def test_parameter_and_size_figures():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2).requires_grad_(False))
    result = profile(model, torch.randn(3, 4))
    assert result.params == 4 * 8 + 8 + 2 * 8 + 8 * 2 + 2
    assert result.trainable_params == 4 * 8 + 8 + 2 * 8
    assert result.buffers == 8 + 8 + 1  # running mean, running var, batches tracked
    assert result.param_bytes == 4 * result.params
    assert result.model_size_bytes == 4 * result.params + 4 * 16 + 8
    assert result.module("0").params == 40


def test_unknown_module_path_lists_the_known_ones():
    result = profile(TwoInputs(), (X, Y))
    with pytest.raises(KeyError, match="no module at path 'c'"):
        result.module("c")
    with pytest.raises(KeyError, match="did not run"):
        result.op("aten.convolution")
