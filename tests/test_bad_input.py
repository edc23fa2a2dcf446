"""Bad input gets a clear error, and nothing is left behind after success or failure."""

import logging

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_globals

from models import TinyCNN
from pytest_modelprof import ProfileError, profile


def leftovers(model):
    """Everything a profile could forget to undo."""
    return {
        "global hooks": len(module_globals._global_forward_pre_hooks) + len(module_globals._global_forward_hooks),
        "module hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules()),
        "dispatch modes": torch._C._len_torch_dispatch_stack(),
        "grad mode": torch.is_grad_enabled(),
    }


CLEAN = {"global hooks": 0, "module hooks": 0, "dispatch modes": 0, "grad mode": True}


class Exploding(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(4, 4)
        self.body = nn.Sequential(nn.ReLU(), Boom())

    def forward(self, x):
        return self.body(self.stem(x))


class Boom(nn.Module):
    def forward(self, x):
        raise ValueError("kaboom")


@pytest.mark.parametrize("device", [None, "meta"], ids=["real", "analytic"])
def test_model_error_names_the_module_and_chains_the_cause(device):
    model = Exploding()
    with pytest.raises(ProfileError, match=r"module 'body\.1' \(Boom\) raised ValueError: kaboom") as info:
        profile(model, torch.randn(2, 4), device=device)
    assert isinstance(info.value.__cause__, ValueError)
    assert leftovers(model) == CLEAN
    assert model.training


@pytest.mark.parametrize("device", [None, "meta"], ids=["real", "analytic"])
def test_wrong_input_shape_names_the_layer(device):
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(5, 2))
    with pytest.raises(ProfileError, match=r"module '1' \(Linear\) raised RuntimeError"):
        profile(model, torch.randn(3, 4), device=device)
    assert leftovers(model) == CLEAN


class Misshapen(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(5))

    def forward(self, x):
        return x * self.scale  # (3, 4) by (5,): no broadcast


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_a_models_own_error_is_told_once_in_an_analytic_run():
    logger, records = logging.getLogger("torch._subclasses.fake_tensor"), _Records()
    logger.addHandler(records)  # torch's loggers do not propagate to pytest's
    try:
        with pytest.raises(ProfileError, match=r"module '<root>' \(Misshapen\) raised RuntimeError"):
            profile(Misshapen(), torch.randn(3, 4), device="meta")
    finally:
        logger.removeHandler(records)
    assert records.records == []  # fake mode's traceback of the failed meta kernel is not logged before it


@pytest.mark.parametrize("inputs", [3, None, "text", {1: torch.zeros(1)}])
def test_inputs_of_the_wrong_kind(inputs):
    with pytest.raises(TypeError, match=r"inputs must be|string keys"):
        profile(nn.Linear(1, 1), inputs)


def test_not_a_module():
    with pytest.raises(TypeError, match=r"expects a torch\.nn\.Module"):
        profile(lambda x: x, torch.zeros(1))


def test_loss_that_is_not_a_scalar():
    model = nn.Linear(3, 2)
    with pytest.raises(ProfileError, match=r"loss must be a scalar tensor, got \(4, 2\)"):
        profile(model, torch.randn(4, 3), train=True, loss_fn=lambda out: out)
    assert leftovers(model) == CLEAN


def test_output_with_no_grad_path():
    model = nn.Linear(3, 2).requires_grad_(False)
    with pytest.raises(ProfileError, match="nothing to backpropagate"):
        profile(model, torch.randn(4, 3), train=True)
    assert leftovers(model) == CLEAN


def test_unavailable_device():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ProfileError, match="CUDA is not available"):
        profile(nn.Linear(1, 1), torch.zeros(1, 1), device="cuda")


def test_meta_model_needs_analytic_mode():
    with torch.device("meta"):
        model = nn.Linear(2, 2)
    with pytest.raises(ProfileError, match="device='meta'"):
        profile(model, torch.zeros(1, 2, device="meta"))


@pytest.mark.parametrize("device", [None, "meta"], ids=["real", "analytic"])
def test_caller_model_inputs_and_rng_are_left_as_they_were(device):
    model = TinyCNN()
    model.features[1].eval()  # a mixed train/eval model
    flags = [m.training for m in model.modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    images = torch.randn(2, 3, 16, 16)
    images_before = images.clone()
    rng = torch.get_rng_state()

    first = profile(model, images, train=True, device=device)
    second = profile(model, images, train=True, device=device)

    assert first.to_dict() == second.to_dict()
    assert [m.training for m in model.modules()] == flags
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(images, images_before)
    assert torch.equal(torch.get_rng_state(), rng)
    assert leftovers(model) == CLEAN


@pytest.mark.parametrize("options", [{}, {"device": "meta"}, {"target": "h100"}], ids=["real", "analytic", "cuda-target"])
def test_a_module_shared_by_two_parents_keeps_its_own_parameters(options):
    # one block reached under two names (CoaT's shared convolutions, a weight-shared encoder): the
    # run swaps its tensors in under both names, and must give the caller's back under both
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            block = nn.Linear(8, 8)
            self.first, self.second = nn.Sequential(block, nn.ReLU()), nn.Sequential(block, nn.Tanh())

        def forward(self, x):
            return self.second(self.first(x))

    model = Shared()
    params = list(model.parameters())
    profile(model, torch.randn(2, 8), train=True, **options)
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    assert all(type(p) is nn.Parameter and p.device.type == "cpu" for p in model.parameters())
    assert model.first[0] is model.second[0] and model.first[0].weight is params[0]


def test_inputs_changed_in_place_by_the_model_are_not_the_callers():
    class InPlace(nn.Module):
        def forward(self, x):
            return x.mul_(2).relu_()

    x = torch.randn(5)
    before = x.clone()
    profile(InPlace(), x)
    assert torch.equal(x, before)


class Rescaling(nn.Module):
    """RWKV's habit: the first inference rescales the weights in place and records it on the module, and
    caches a table on itself."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.rescaled = False

    def forward(self, x):
        if not self.rescaled:
            with torch.no_grad():
                self.linear.weight.div_(2)
            self.rescaled = True
            self.table = torch.ones(4, device=x.device)
        return self.linear(x) * self.table


@pytest.mark.parametrize(
    "options", [{"device": "meta"}, {"device": "meta", "train": True}, {"target": "h100"}], ids=["eval", "train", "cuda-target"]
)
def test_what_an_analytic_run_records_on_the_model_is_undone(options):
    # the rescaling went to fake tensors, not the caller's: the caller's module must not say it is done
    model = Rescaling()
    weight = model.linear.weight.detach().clone()
    first = profile(model, torch.randn(2, 4), **options)
    assert model.rescaled is False and not hasattr(model, "table")
    assert torch.equal(model.linear.weight, weight)
    assert profile(model, torch.randn(2, 4), **options).flops == first.flops  # and the next run rescales again


def test_a_real_run_keeps_what_the_model_did():
    # a real inference run works on the caller's tensors: the weights were rescaled, as in eager use, and the
    # record stays with them
    model = Rescaling()
    weight = model.linear.weight.detach().clone()
    profile(model, torch.randn(2, 4))
    assert model.rescaled is True and torch.equal(model.linear.weight, weight / 2)


@pytest.mark.parametrize("autocast", [torch.int8, torch.float64, "bf16"])
def test_an_autocast_that_is_no_lower_precision_is_refused(autocast):
    with pytest.raises(ValueError, match=r"autocast= takes the lower precision to run in, torch\.bfloat16 or torch\.float16"):
        profile(nn.Linear(4, 4), torch.randn(2, 4), train=True, autocast=autocast)


def test_a_device_torch_does_not_know_is_named():
    with pytest.raises(ValueError, match=r"device='tpu' is not a device torch knows"):
        profile(nn.Linear(4, 4), torch.randn(2, 4), device="tpu")
