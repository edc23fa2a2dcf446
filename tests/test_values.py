"""Analytic runs that read values: those that follow from constants and from the caller's real tensors."""

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from pytest_modelprof import ProfileError, profile
from pytest_modelprof.engine.analytic.values import KnownValues


class CausalEncoder(nn.Module):
    """nn.TransformerEncoder given a causal mask it builds itself: the encoder compares the mask with a
    causal one (``_detect_is_causal_mask``) to take its causal path."""

    def __init__(self, d=64, causal=True, hint=None):
        super().__init__()
        self.causal, self.hint = causal, hint
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x):
        s = x.shape[1]
        if self.causal:
            mask = nn.Transformer.generate_square_subsequent_mask(s, device=x.device)
        else:  # each token attends to all but itself: not causal
            mask = torch.zeros(s, s, device=x.device).masked_fill(torch.eye(s, device=x.device, dtype=torch.bool), float("-inf"))
        return self.encoder(x, mask=mask, is_causal=self.hint)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("train", [False, True])
def test_an_encoder_with_a_mask_runs_analytically_as_the_real_run(causal, train):
    torch.manual_seed(0)
    model, x = CausalEncoder(causal=causal), torch.randn(2, 16, 64)
    real = profile(model, x, train=train)
    analytic = profile(model, x, train=train, device="meta")
    assert analytic.flops == real.flops
    assert analytic.peak_memory_bytes == real.peak_memory_bytes


@pytest.mark.parametrize("causal", [True, False])
def test_the_causal_mask_is_told_apart_on_a_gpu_target(causal):
    """On an H100 a causal mask drops out for SDPA's is_causal (its kernels skip the masked scores); any
    other mask reaches the kernel. Detected from the mask's values, as passing the hint would."""
    torch.manual_seed(0)
    x = torch.randn(2, 16, 64)
    detected = profile(CausalEncoder(causal=causal), x, train=True, target="h100")
    hinted = profile(CausalEncoder(causal=causal, hint=causal), x, train=True, target="h100")

    def attention(result):
        return sorted((o.op, o.phase, o.calls, o.flops, o.bytes) for o in result.predicted.ops if "attention" in o.op)

    assert attention(detected) and attention(detected) == attention(hinted)


class Lengths(nn.Module):
    """Slices each batch to its longest sequence, read from an input (``.item()``)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, lengths):
        longest = int(lengths.max().item())
        return self.proj(x[:, :longest])


def test_a_value_read_from_a_real_input_sizes_the_run():
    x, lengths = torch.randn(4, 32, 8), torch.tensor([3, 10, 7, 5])
    analytic = profile(Lengths(), (x, lengths), device="meta")
    # the longest of the 4 lengths (a max over 4), then the linear layer over 4 x 10 rows: 2 FLOPs a MAC, a bias add
    assert analytic.flops == 4 + 4 * 10 * (2 * 8 * 8 + 8)
    assert analytic.flops == profile(Lengths(), (x, lengths)).flops


def test_a_value_of_a_meta_input_is_refused_clearly():
    x, lengths = torch.empty(4, 32, 8, device="meta"), torch.empty(4, dtype=torch.long, device="meta")
    with pytest.raises(ProfileError, match=r"module '<root>' \(Lengths\) raised .*an analytic run knows the values only of"):
        profile(Lengths(), (x, lengths), device="meta")


class Selected(nn.Module):
    """Keeps the tokens of a mask built from positions: nonzero on a tensor of known values."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        keep = torch.arange(x.shape[0], device=x.device) % 3 == 0
        return self.proj(x[keep])


def test_an_output_sized_by_known_values_is_exact():
    x = torch.randn(10, 8)
    analytic = profile(Selected(), x, device="meta")
    # the mask (a remainder and a comparison over 10 positions), then the linear layer over rows 0, 3, 6, 9
    assert analytic.flops == 10 + 10 + 4 * (2 * 8 * 8 + 8)
    assert analytic.flops == profile(Selected(), x).flops


def fake_run(body):
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode, KnownValues() as values:
        return body(values)


def test_values_follow_views_and_writes():
    def body(values):
        base = torch.zeros(6)
        view = base[:3]
        view.add_(2)  # known operands: the base sees the write through its view
        assert base.sum().item() == 6
        weight = torch.empty(3).uniform_()  # random: no value
        assert values.value(weight) is None
        view.copy_(weight)  # a write of unknown values through the view: the base is unknown too
        assert values.value(view) is None and values.value(base) is None
        return True

    assert fake_run(body)


def test_in_place_updates_of_a_list_are_followed():
    """What an optimizer does to its step counters (``_foreach_add_`` returns nothing)."""

    def body(values):
        steps = [torch.tensor(0.0), torch.tensor(4.0)]
        torch._foreach_add_(steps, 1)
        return [s.item() for s in steps]

    assert fake_run(body) == [1.0, 5.0]


def test_uninitialised_and_large_tensors_have_no_value():
    def body(values):
        from pytest_modelprof.engine.analytic.values import LIMIT

        assert values.value(torch.empty(4)) is None
        assert values.value(torch.zeros(LIMIT + 1)) is None
        assert values.value(torch.zeros(4)) is not None
        return True

    assert fake_run(body)


class MaskedHidden(nn.Module):
    """Keeps the hidden states of the positions a mask of known values picks (the states themselves are not known)."""

    def __init__(self):
        super().__init__()
        self.embed, self.proj = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = self.embed(x)
        keep = torch.arange(h.shape[0], device=x.device) % 3 == 0
        return self.proj(h[keep]), h.masked_select(keep[:, None]).sum()


def test_an_output_sized_by_a_known_mask_over_unknown_values_is_exact():
    x = torch.empty(10, 8, device="meta")
    analytic = profile(MaskedHidden(), x, device="meta")
    # embed over 10 rows, the mask (remainder, comparison), proj over rows 0, 3, 6, 9, the sum of their 4 x 8 states
    assert analytic.flops == 10 * (2 * 8 * 8 + 8) + 10 + 10 + 4 * (2 * 8 * 8 + 8) + 4 * 8


class Table(nn.Module):
    """Keeps a plain tensor attribute (not a buffer), and writes into a slice of it."""

    def __init__(self):
        super().__init__()
        self.table = torch.zeros(4, 8)
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        rows = self.table[:2]
        rows.add_(1)  # known operands: worked out on the run's copy, never on the caller's tensor
        return self.proj(x) + rows.sum()


def test_an_analytic_run_never_writes_into_the_callers_tensors():
    model = Table()
    profile(model, torch.randn(2, 8), device="meta")
    assert torch.equal(model.table, torch.zeros(4, 8))


class LayerDrop(nn.Module):
    """Skips each layer with probability ``p`` in training, as LayerDrop does."""

    def __init__(self, p):
        super().__init__()
        self.layers, self.p = nn.ModuleList(nn.Linear(8, 8) for _ in range(3)), p

    def forward(self, x):
        for layer in self.layers:
            if self.p > 0 and self.training and torch.rand([]) < self.p:
                continue
            x = layer(x)
        return x


def test_a_random_draw_read_in_python_is_explained():
    with pytest.raises(
        ProfileError, match=r"\(LayerDrop\) raised RandomValueRead.*reads a random number in Python.*layer-drop probability of 0"
    ):
        profile(LayerDrop(0.5), torch.randn(4, 8), train=True, device="meta")


def test_a_value_computed_from_a_random_draw_is_explained_too():
    class Jitter(nn.Module):
        def forward(self, x):
            shift = (torch.rand(1) * 4).long()  # computed from a draw: still a draw
            return x.roll(int(shift), 0)

    with pytest.raises(ProfileError, match="reads a random number in Python"):
        profile(Jitter(), torch.randn(4, 8), device="meta")


def test_without_the_random_skip_every_layer_is_profiled():
    model, x = LayerDrop(0.0), torch.randn(4, 8)
    analytic = profile(model, x, train=True, device="meta")
    # each layer's product (4 x 8 x 8) forward and for its weight's gradient; for its input's, all but the first
    assert analytic.macs == profile(model, x, train=True).macs == (3 + 3 + 2) * 4 * 8 * 8


def test_a_value_computed_from_the_weights_after_dropout_is_not_called_a_draw():
    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.drop = nn.Linear(8, 8), nn.Dropout(0.1)

        def forward(self, x):
            h = self.drop(self.fc(x))
            return h * 2 if h.abs().max() > 1 else h  # computed from the weights: not a draw alone

    with pytest.raises(ProfileError) as error:
        profile(Gate(), torch.randn(4, 8), train=True, device="meta")
    assert "an analytic run knows the values only of" in str(error.value)
    assert "random number in Python" not in str(error.value)


def test_an_in_place_draw_into_a_new_tensor_is_a_draw():
    class Coin(nn.Module):
        def forward(self, x):
            return x.flip(0) if torch.empty(()).uniform_() < 0.5 else x

    with pytest.raises(ProfileError, match="reads a random number in Python"):
        profile(Coin(), torch.randn(4, 8), device="meta")


class _TracerAware(nn.Module):
    """Attention as transformers writes it: the padding mask is read (all ones: causal attention, no mask)
    unless ``is_tracing`` says the tensor is traced, fake tensors included; then the mask is built."""

    def __init__(self, import_utils):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.import_utils = import_utils

    def forward(self, x, padding_mask):
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, 8)).transpose(1, 3).unbind(2)
        if not self.import_utils.is_fake_tensor(padding_mask) and bool(padding_mask.all()):
            return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        mask = causal & padding_mask[:, None, None, :].bool()
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("ones", [True, False])
def test_a_library_that_traces_fake_tensors_takes_its_eager_path(monkeypatch, ones):
    # transformers' is_tracing counts fake tensors as a trace, through transformers.utils.import_utils.is_fake_tensor
    import sys
    import types

    from torch._subclasses.fake_tensor import FakeTensor

    import_utils = types.ModuleType("transformers.utils.import_utils")
    import_utils.is_fake_tensor = lambda t: isinstance(t, FakeTensor)
    monkeypatch.setitem(sys.modules, "transformers.utils.import_utils", import_utils)
    model, x = _TracerAware(import_utils), torch.randn(2, 6, 16)
    padding = torch.ones(2, 6, dtype=torch.long) if ones else torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    real = profile(model, (x, padding))
    analytic = profile(model, (x, padding), device="meta")
    assert {o.op for o in analytic.ops} == {o.op for o in real.ops}
    assert (analytic.flops, analytic.peak_memory_bytes) == (real.flops, real.peak_memory_bytes)
    assert import_utils.is_fake_tensor(torch.empty(1, device="meta")) is False  # put back as it was


class Gaussian(nn.Module):
    """A policy head: a normal distribution whose scale is computed from the weights. ``torch.distributions``
    validates it (``if not torch._is_all_true(scale > 0): raise``), reading values an analytic run lacks."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)

    def forward(self, x):
        loc, scale = self.fc(x).chunk(2, dim=-1)
        policy = torch.distributions.Normal(loc, nn.functional.softplus(scale), validate_args=True)
        return -policy.log_prob(x).mean() + nn.functional.gaussian_nll_loss(loc, x, scale.exp())


@pytest.mark.parametrize("train", [False, True])
def test_a_check_that_raises_when_it_fails_is_taken_to_pass(train):
    x = torch.randn(4, 8)
    analytic, real = (profile(Gaussian(), x, train=train, device=device) for device in ("meta", None))
    assert (analytic.flops, analytic.peak_memory_bytes) == (real.flops, real.peak_memory_bytes)
    assert analytic.uncounted == real.uncounted == {}


class Checked(nn.Module):
    def __init__(self, check):
        super().__init__()
        self.fc, self.check = nn.Linear(8, 8), check

    def forward(self, x):
        h = self.fc(x)
        self.check(h)
        return h * 2


def _assert_finite(h):
    assert torch.isfinite(h).all(), "non-finite activations"


def _raise_if_any_negative(h):
    if torch.any(h.abs() < 0):
        raise ValueError(f"negative magnitudes in a tensor of shape {tuple(h.shape)}")


def _raise_unless_all_true(h):
    if not torch._is_all_true(h.abs() >= 0):
        raise ValueError("negative magnitudes")


@pytest.mark.parametrize("check", [_assert_finite, _raise_if_any_negative, _raise_unless_all_true])
def test_checks_of_either_sense_are_answered_with_the_passing_value(check):
    x = torch.randn(4, 8)
    analytic = profile(Checked(check), x, device="meta")
    # the linear layer (2 FLOPs a MAC and the bias), the check, the doubling. The check, per element: isfinite's
    # four ops (ATen's composite: (h == h) * (h.abs() != inf)), or abs and a comparison; then the reduction's one
    per_element = (4 if check is _assert_finite else 2) + 1
    assert analytic.flops == 4 * 8 * (2 * 8 + 1) + per_element * 4 * 8 + 4 * 8
    assert analytic.flops == profile(Checked(check), x).flops


def _branch_on_values(h):
    if (h > 0).all():
        h.mul_(2)  # a branch that goes on either way: which one the real run takes depends on the weights


def _bool_called(h):
    if not bool((h.abs() < 1e4).all()):
        raise ValueError("activations out of range")


@pytest.mark.parametrize("check", [_branch_on_values, _bool_called])
def test_a_read_that_is_not_a_check_that_raises_is_still_refused(check):
    with pytest.raises(ProfileError, match="an analytic run knows the values only of"):
        profile(Checked(check), torch.randn(4, 8), device="meta")


class Guarded(nn.Module):
    """Clamps its activations when they overflow, as DETR's training layers do."""

    def __init__(self, test):
        super().__init__()
        self.fc, self.test = nn.Linear(8, 8), test

    def forward(self, x):
        h = self.fc(x)
        if self.test(h):
            h = h.clamp(-1e4, 1e4)
        return h * 2


@pytest.mark.parametrize(
    "test, test_ops",
    [
        (lambda h: not torch.isfinite(h).all(), 4 + 1),  # isfinite's four ops (see above), all
        (lambda h: torch.isinf(h).any() or torch.isnan(h).any(), 1 + 1 + 1 + 1),
        (lambda h: (h != h).any(), 1 + 1),
    ],
    ids=["isfinite", "isinf-isnan", "self-inequality"],
)
def test_unknown_values_are_taken_to_be_finite(test, test_ops):
    x = torch.randn(4, 8)
    analytic = profile(Guarded(test), x, train=True, device="meta")
    assert analytic.flops == profile(Guarded(test), x, train=True).flops
    # no clamp: the linear layer's product forward and for the weight's gradient (2 FLOPs a MAC), its bias and
    # the bias's gradient, the doubling and its gradient, the loss (a sum), and the test's ops, one per element each
    assert analytic.flops == 2 * 2 * 4 * 8 * 8 + 4 * 8 + 4 * 8 + 2 * 4 * 8 + 4 * 8 + test_ops * 4 * 8


class Masked(nn.Module):
    """Puts -inf where a mask says (the mask's value known or not), then tests its scores for infinities."""

    def __init__(self, bias):
        super().__init__()
        self.fc, self.bias = nn.Linear(8, 8), bias

    def forward(self, x, mask):
        scores = self.fc(x) + torch.log(mask) if self.bias else self.fc(x).masked_fill(mask == 0, float("-inf"))
        if torch.isinf(scores).all(dim=-1).any():  # rows masked out in full
            scores = scores.nan_to_num()
        return scores.softmax(-1)


@pytest.mark.parametrize("bias", [False, True], ids=["masked_fill", "log-of-a-known-mask"])
def test_values_a_model_makes_infinite_are_not_taken_to_be_finite(bias):
    mask = torch.ones(4, 8)
    mask[0] = 0
    with pytest.raises(ProfileError, match="an analytic run knows the values only of"):
        profile(Masked(bias), (torch.randn(4, 8), mask), device="meta")


class OneHot(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.fc, self.classes = nn.Linear(8, 4), classes

    def forward(self, x, labels):
        chosen = nn.functional.one_hot(self.fc(x).argmax(-1), num_classes=4)  # indices the run does not know
        given = nn.functional.one_hot(input=labels, num_classes=self.classes)  # indices it knows, by keyword
        return self.fc(x) * chosen + given[:, :4]


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_one_hot_runs_the_devices_kernel_not_the_fake_kernels_comparison(train):
    x, labels = torch.randn(16, 8), torch.randint(0, 4, (16,))
    analytic, real = (profile(OneHot(6), (x, labels), train=train, device=device) for device in ("meta", None))
    assert (analytic.flops, analytic.peak_memory_bytes) == (real.flops, real.peak_memory_bytes)
    # the CPU kernel checks the indices (a min and max over them: one op per index, two in PyTorch 2.11), then
    # scatters ones into zeros
    ops = {row.op: row for row in analytic.ops if row.phase == "forward"}
    checks = [ops[op] for op in ("aten.aminmax", "aten.min", "aten.max") if op in ops]
    assert [op.op for op in checks] in (["aten.aminmax"], ["aten.min", "aten.max"])
    assert all(op.calls == 2 and op.flops == 2 * 16 for op in checks)
    assert "aten.eq" not in ops and ops["aten.scatter_"].calls == 2


def test_one_hot_on_a_gpu_target_checks_nothing():
    result = profile(OneHot(6), (torch.randn(16, 8), torch.randint(0, 4, (16,))), target="h100")
    ops = {row.op for row in result.ops}
    assert "aten.aminmax" not in ops and "aten.scatter_" in ops


def test_one_hot_of_known_indices_out_of_range_fails_as_the_kernel_does():
    x, labels = torch.randn(16, 8), torch.full((16,), 5)
    with pytest.raises(ProfileError, match="Class values must be smaller than num_classes"):
        profile(OneHot(4), (x, labels), device="meta")
    with pytest.raises(ProfileError, match="Class values must be smaller than num_classes"):
        profile(OneHot(4), (x, labels))


class RunningLow(nn.Module):
    """Keeps the lowest activation seen, in a buffer that starts at +inf (as an observer's running minimum
    does), overwritten by each step's minimum before it is tested."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("low", torch.tensor(float("inf")))

    def forward(self, x):
        h = self.fc(x)
        self.low.copy_(h.amin())
        if self.low == float("inf"):  # nothing seen yet: a branch that goes on either way
            return h
        return h - self.low


def test_a_value_overwritten_with_a_finite_one_is_finite_again():
    x = torch.randn(4, 8)
    analytic = profile(RunningLow(), x, device="meta")
    # the linear layer (2 FLOPs a MAC and the bias), the minimum, the test against inf, the subtraction
    assert analytic.flops == 4 * 8 * (2 * 8 + 1) + 4 * 8 + 1 + 4 * 8
    assert analytic.flops == profile(RunningLow(), x).flops
