"""Outputs that CPU kernels size at run time, against the kernels themselves.

oneDNN's LSTM keeps a workspace for the backward pass whose size oneDNN chooses; PyTorch's
meta kernel declares it empty. The engine's size of it is checked here against the
workspace the CPU kernel returns, and analytic training steps against real ones.
"""

import re

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from pytest_modelprof import ProfileError, profile
from pytest_modelprof.engine.analytic.kernel_outputs import KernelOutputs, onednn_lstm_workspace_bytes

aten = torch.ops.aten

DTYPES = [torch.float32, torch.bfloat16]
# (input, hidden, steps, batch): rows padded or not, a multiple of 256 (padded once more), tiny and larger
SHAPES = [(16, 32, 10, 4), (3, 5, 2, 1), (100, 37, 9, 6), (7, 513, 4, 3), (1000, 20, 5, 7), (256, 256, 12, 8), (512, 1024, 16, 2)]


def kernel_workspace(input_size, hidden, steps, batch, dtype):
    """The workspace the CPU kernel returns for one layer trained forward."""
    x = torch.randn(steps, batch, input_size, dtype=dtype)
    w_ih, w_hh = torch.randn(4 * hidden, input_size, dtype=dtype), torch.randn(4 * hidden, hidden, dtype=dtype)
    bias, h, c = torch.zeros(4 * hidden, dtype=dtype), torch.zeros(batch, hidden, dtype=dtype), torch.zeros(batch, hidden, dtype=dtype)
    with torch.enable_grad():
        out = aten.mkldnn_rnn_layer(x, w_ih, w_hh, bias, bias, h, c, False, [], 2, hidden, 1, True, False, False, True)
    return out[3].numel() * out[3].element_size()


def bf16_lstm_runs_on_onednn():
    lstm = nn.LSTM(4, 8).to(torch.bfloat16)
    return "aten.mkldnn_rnn_layer" in {op.op for op in profile(lstm, torch.randn(3, 2, 4, dtype=torch.bfloat16)).ops}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_workspace_is_the_kernels(shape, dtype):
    if dtype is torch.bfloat16 and not bf16_lstm_runs_on_onednn():
        pytest.skip("this CPU runs bfloat16 LSTMs without oneDNN")
    element = torch.finfo(dtype).bits // 8
    assert onednn_lstm_workspace_bytes(shape[2], shape[3], shape[0], shape[1], element, element) == kernel_workspace(*shape, dtype)


def test_the_workspace_by_hand():
    """LSTM(16 -> 32), 10 steps of 4, float32: each part page-aligned (4096 bytes).
    gates 10*4*128*4 = 20480 (5 pages); ht 10*4*32*4 = 5120 (2); states, cell states and the three
    gradients of states, 2*11*4*32*4 = 11264 each (3 pages each, five parts): 22 pages."""
    assert onednn_lstm_workspace_bytes(10, 4, 16, 32, 4, 4) == 22 * 4096


class Recurrent(nn.Module):
    def __init__(self, bidirectional=False, batch_first=True):
        super().__init__()
        self.lstm = nn.LSTM(12, 24, num_layers=2, batch_first=batch_first, bidirectional=bidirectional)
        self.head = nn.Linear(24 * (2 if bidirectional else 1), 3)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bidirectional", [False, True], ids=["one way", "both ways"])
def test_an_analytic_lstm_step_holds_what_a_real_one_does(bidirectional, dtype):
    if dtype is torch.bfloat16 and not bf16_lstm_runs_on_onednn():
        pytest.skip("this CPU runs bfloat16 LSTMs without oneDNN")
    model = Recurrent(bidirectional).to(dtype)
    x = torch.randn(3, 9, 12, dtype=dtype)
    real, analytic = profile(model, x, train=True), profile(model, x, train=True, device="meta")
    assert "aten.mkldnn_rnn_layer" in {op.op for op in real.ops}
    assert analytic.peak_memory_bytes == real.peak_memory_bytes
    assert analytic.memory.category_max == real.memory.category_max


def test_inference_keeps_no_workspace():
    """Without autograd the kernel returns no workspace, and neither does the analytic run."""
    model = Recurrent()
    x = torch.randn(3, 9, 12)
    real, analytic = profile(model, x), profile(model, x, device="meta")
    assert analytic.peak_memory_bytes == real.peak_memory_bytes
    assert analytic.memory.category_max == real.memory.category_max


def test_a_fold_keeps_the_columns_storage():
    """col2im makes its output like the columns and shrinks it to the image: a fold of 3x3 patches
    over a 6x6 image (36 columns of 4*9 values, batch 2) holds 2*36*36 floats, not the image's 2*4*36."""
    fold = nn.Fold(output_size=(6, 6), kernel_size=3, padding=1)
    x = torch.randn(2, 4 * 9, 36)
    columns = 2 * 36 * 36 * 4
    real, analytic = profile(fold, x), profile(fold, x, device="meta")
    assert real.peak_memory_bytes == analytic.peak_memory_bytes == 2 * columns  # the input and the output


def test_a_fold_into_a_larger_image_holds_the_image():
    """Patches that do not cover the image (kernel 2, stride 3): the output is grown to the image."""
    fold = nn.Fold(output_size=(8, 8), kernel_size=2, stride=3)
    x = torch.randn(2, 4 * 4, 9)
    image = 2 * 4 * 8 * 8 * 4
    real, analytic = profile(fold, x), profile(fold, x, device="meta")
    assert real.peak_memory_bytes == analytic.peak_memory_bytes == 2 * 16 * 9 * 4 + image


def test_an_unfold_whose_stride_passes_its_kernel_keeps_the_image_storage():
    """im2col makes its output like the image and resizes it to the columns: 2x2 patches every 3 pixels
    of a 9x9 image (2 x 4 channels) take 2*16*9 floats but hold the image's 2*4*81."""
    unfold = nn.Unfold(kernel_size=2, stride=3)
    x = torch.randn(2, 4, 9, 9)
    image = 2 * 4 * 81 * 4
    real, analytic = profile(unfold, x), profile(unfold, x, device="meta")
    assert real.peak_memory_bytes == analytic.peak_memory_bytes == 2 * image


@pytest.mark.parametrize(
    "loss",
    [nn.functional.mse_loss, nn.functional.smooth_l1_loss, nn.functional.soft_margin_loss, nn.functional.binary_cross_entropy],
    ids=lambda f: f.__name__,
)
def test_a_reduced_loss_keeps_the_elementwise_storage(loss):
    """The scalar loss of these kernels is made for the elementwise loss and resized: a loss over
    a 4x3x16x16 output holds 4*3*16*16 floats through the backward pass, in a real step and an analytic one."""
    model = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1), nn.Sigmoid())
    x, target = torch.randn(4, 3, 16, 16), torch.rand(4, 3, 16, 16)
    real = profile(model, x, train=True, loss_fn=lambda out: loss(out, target))
    analytic = profile(model, x, train=True, loss_fn=lambda out: loss(out, target), device="meta")
    held = {op.op: op.allocated_bytes for op in real.ops}[f"aten.{loss.__name__}"]
    assert held == 4 * 3 * 16 * 16 * 4
    assert {op.op: op.allocated_bytes for op in analytic.ops}[f"aten.{loss.__name__}"] == held
    assert analytic.peak_memory_bytes == real.peak_memory_bytes


def _layouts():
    """Inputs laid out as models make them: transposed (2-d and 3-d), channels-last, contiguous."""
    return {
        "2d transposed": torch.randn(6, 5).t(),
        "3d transposed": torch.randn(4, 6, 5).transpose(1, 2),
        "channels last": torch.randn(2, 6, 5, 3).to(memory_format=torch.channels_last),
        "contiguous": torch.randn(2, 6, 5, 3),
    }


def _norm_ops(x):
    """Ops whose layout rule KernelOutputs carries, called on ``x`` (channels: dim 1)."""
    channels, rows = x.shape[1], x.shape[:-1]
    ones, zeros = torch.ones(channels), torch.zeros(channels)
    return {
        "batch norm": lambda t: aten.native_batch_norm(t, ones, zeros, zeros.clone(), ones.clone(), True, 0.1, 1e-5)[0],
        "batch norm, eval": lambda t: aten._native_batch_norm_legit_no_training(t, ones, zeros, zeros, ones, 0.1, 1e-5)[0],
        "batch norm backward": lambda t: aten.native_batch_norm_backward(
            t, t, ones, zeros, ones, zeros, ones, True, 1e-5, [True, True, True]
        )[0],
        "layer norm backward": lambda t: aten.native_layer_norm_backward(
            t, t, [t.shape[-1]], torch.zeros(*rows, 1), torch.ones(*rows, 1), torch.ones(t.shape[-1]), None, [True, True, False]
        )[0],
        "group norm backward": lambda t: aten.native_group_norm_backward(
            t, t, torch.zeros(t.shape[0], 1), torch.ones(t.shape[0], 1), ones, t.shape[0], channels, t[0, 0].numel(), 1, [True, True, True]
        )[0],
        "log_softmax backward": lambda t: aten._log_softmax_backward_data(t, t.contiguous(), 1, t.dtype),
        "log_sigmoid": lambda t: aten.log_sigmoid_forward(t)[0],
        "huber backward": lambda t: aten.huber_loss_backward(torch.tensor(1.0), t, t.contiguous(), 1, 1.0),
        "dropout backward": lambda t: aten.native_dropout_backward(t, t > 0, 2.0),
    }


@pytest.mark.parametrize("layout", list(_layouts()))
@pytest.mark.parametrize("op", list(_norm_ops(torch.empty(2, 3, 4, 5))))
def test_an_output_is_laid_out_as_the_kernel_lays_it_out(op, layout):
    x = _layouts()[layout]
    func = _norm_ops(x)[op]
    real = func(x)
    with FakeTensorMode(allow_non_fake_inputs=True) as fake_mode, KernelOutputs():
        fake = func(fake_mode.from_tensor(x))
    assert fake.stride() == real.stride()


def test_a_transposed_layer_norm_gradient_is_not_copied_twice():
    """A layer norm whose output is transposed before a linear layer (as PVT's spatial reduction
    does): the real kernel returns a contiguous input gradient, so the next linear layer's
    backward does not copy it; the analytic step holds what the real one does."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.fc = nn.LayerNorm(16), nn.Linear(16, 16)

        def forward(self, x):
            return self.fc(self.norm(x).transpose(1, 2).transpose(1, 2) + x)

    model = Block()
    x = torch.randn(2, 16, 16).transpose(1, 2)
    real, analytic = profile(model, x, train=True), profile(model, x, train=True, device="meta")
    assert [(op.op, op.calls, op.allocated_bytes) for op in analytic.ops] == [(op.op, op.calls, op.allocated_bytes) for op in real.ops]
    assert analytic.peak_memory_bytes == real.peak_memory_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 0], ids=["no padding", "padding"])
def test_an_embedding_bag_maps_its_indices_as_the_cpu_kernel_does(mode, dtype, padding_idx):
    """offset2bag: none on the fast path of a sum, else one entry per index, made one longer."""
    bag = nn.EmbeddingBag(50, 8, mode=mode, padding_idx=padding_idx).to(dtype)
    indices, offsets = torch.randint(1, 50, (40,)), torch.arange(0, 40, 5)
    for train in (False, True):
        real = profile(bag, (indices, offsets), train=train)
        analytic = profile(bag, (indices, offsets), train=train, device="meta")
        assert [(op.op, op.allocated_bytes) for op in analytic.ops] == [(op.op, op.allocated_bytes) for op in real.ops]
        assert analytic.peak_memory_bytes == real.peak_memory_bytes


def layouts():
    """Tensors laid out every way a model makes them: each order of their dimensions in memory, with
    dimensions of size 1 (whose strides views and kernels set otherwise), and a transposed view."""
    made = []
    for shape in [(1, 8, 4, 4), (2, 3, 4, 4), (1, 1, 3, 5), (3, 1, 4, 1), (1, 4, 2, 3, 3), (2, 1, 5)]:
        n = len(shape)
        for order in ([*range(n)], [*reversed(range(n))], [0, *range(2, n), 1], [1, 0, *range(2, n)]):
            made.append(torch.randn([shape[d] for d in order]).permute([order.index(d) for d in range(n)]))
    made.append(torch.randn(1, 16, 8).transpose(1, 2).view(1, 8, 4, 4))  # an attention output viewed as an image
    return made


POINTWISE = {
    "exp": torch.exp,
    "times a number": lambda a: a * 2,
    "plus a 0-dim tensor": lambda a: a + torch.tensor(1.0),
    "number minus": lambda a: 1 - a,
    "compared with a number": lambda a: a > 0,
    "where, number": lambda a: torch.where(a > 0, a, 0.0),
    "times its contiguous self": lambda a: a * a.contiguous(),
    "plus a broadcast row": lambda a: a + torch.randn(a.shape[-1]),
    "divided, rounding": lambda a: torch.div(a, 2, rounding_mode="floor"),
    "copysign, number": lambda a: torch.copysign(a, -1.0),
    "number to the power": lambda a: torch.pow(2.0, a),
    "nan_to_num": torch.nan_to_num,
    "bf16 times a number": lambda a: a.bfloat16() * 3,
}


@pytest.mark.parametrize("op", POINTWISE.values(), ids=POINTWISE.keys())
def test_pointwise_outputs_are_laid_out_as_the_cpu_kernels_lay_them_out(op):
    # ATen's TensorIterator lays out an output by its operands' strides, a number or 0-dim operand included;
    # PyTorch's fake kernels differ on dimensions of size 1 and 0-dim operands
    for t in layouts():
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, KernelOutputs():
            fake = op(mode.from_tensor(t))
        assert fake.stride() == op(t).stride(), (tuple(t.shape), t.stride())


def test_views_are_strided_as_the_cpu_kernels_stride_them():
    from pytest_modelprof.engine.analytic.kernel_outputs import view_strides

    for t in layouts():
        for shape in ([-1], [t.shape[0], -1], [*t.shape[:-1], 1, t.shape[-1]], [1, *t.shape]):
            try:
                real = t.view(shape)
            except RuntimeError:  # no view of this layout: the engine says so too
                assert view_strides(tuple(t.shape), t.stride(), tuple(t.reshape(shape).shape)) is None
                continue
            assert view_strides(tuple(t.shape), t.stride(), tuple(real.shape)) == real.stride()


class ImageAttention(nn.Module):
    """A VAE's attention block at batch 1: the attention output viewed back as an image, scaled,
    upsampled and convolved (diffusers' VQModel decoder)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.shortcut = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        y = self.proj(x.view(b, c, h * w).transpose(1, 2)).transpose(1, 2).view(b, c, h, w)
        y = self.conv(nn.functional.interpolate((y + x) / 2, scale_factor=2.0))
        return self.shortcut(y.contiguous())


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_an_attention_output_viewed_as_an_image_is_not_copied_in_one_run_only(train):
    model, x = ImageAttention(), torch.randn(1, 8, 4, 4)
    real, analytic = profile(model, x, train=train), profile(model, x, train=train, device="meta")
    assert [(o.op, o.calls, o.allocated_bytes) for o in analytic.ops] == [(o.op, o.calls, o.allocated_bytes) for o in real.ops]
    assert analytic.peak_memory_bytes == real.peak_memory_bytes


@pytest.mark.parametrize(
    "product",
    [
        lambda x: torch.mm(x, x.t().bfloat16()),
        lambda x: torch.addmm(x.new_zeros(4), x, x.t().bfloat16()),
        lambda x: torch.nn.functional.linear(x, x.bfloat16()),
        lambda x: torch.mv(x, x[0].bfloat16()),
        lambda x: torch.nn.functional.conv1d(x[None], x[:, :, None].bfloat16()),
        lambda x: torch.nn.functional.conv1d(x[None], x[:, :, None], x[0].bfloat16()),
    ],
)
def test_a_matrix_product_of_two_dtypes_is_refused_as_the_kernels_refuse_it(product):
    # PyTorch's meta kernels of mm, addmm, mv and convolution take a float32 and a bfloat16 operand; the CPU
    # kernels refuse them
    class Mixed(nn.Module):
        def forward(self, x):
            return product(x)

    x = torch.randn(4, 4)
    with pytest.raises(RuntimeError):
        product(x)
    with pytest.raises(ProfileError, match=r"same dtype|should be the same"):
        profile(Mixed(), x, device="meta")


def test_a_backward_pass_that_autocast_left_in_two_dtypes_fails_as_on_the_gpu():
    # CUDA's autocast runs acos in float32 (the CPU's leaves it in bfloat16): the function saves a float32
    # tensor, its backward pass, outside autocast, multiplies it by the bfloat16 gradient, which CUDA refuses
    class Arc(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, v):
            angles = torch.acos(torch.matmul(q, q.transpose(-1, -2)).clamp(-1, 1))
            ctx.save_for_backward(angles)
            return torch.matmul(angles, v)

        @staticmethod
        def backward(ctx, grad):
            (angles,) = ctx.saved_tensors
            return None, torch.matmul(angles.transpose(-1, -2), grad)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.v = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return Arc.apply(self.q(x), self.v(x))

    x = torch.randn(4, 8)
    assert profile(Model(), x, train=True, autocast=torch.bfloat16, device="meta").flops > 0  # the CPU's autocast
    with pytest.raises(ProfileError, match=r"backward pass of Model.*same dtype.*custom_fwd/custom_bwd"):
        profile(Model(), x, train=True, autocast=torch.bfloat16, target="h100")


@pytest.mark.parametrize("norm", ["layer", "group", "batch"])
@pytest.mark.parametrize(
    ("input_dtype", "weight_dtype"), [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.bfloat16, torch.float64)]
)
def test_a_normalisation_of_mixed_precision_is_taken_or_refused_as_the_cpu_kernels_do(norm, input_dtype, weight_dtype):
    # the CPU kernels take parameters of another dtype only as float32 for a reduced-precision input
    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(8, dtype=weight_dtype))

        def forward(self, x):
            if norm == "layer":
                return torch.nn.functional.layer_norm(x, (8,), self.weight, self.weight)
            if norm == "group":
                return torch.nn.functional.group_norm(x.transpose(1, 2), 2, self.weight, self.weight)
            return torch.nn.functional.batch_norm(x.transpose(1, 2), None, None, self.weight, self.weight, training=True)

    x = torch.randn(2, 4, 8, dtype=input_dtype)
    try:
        Norm()(x)
    except RuntimeError as error:
        with pytest.raises(ProfileError, match=re.escape(str(error))):
            profile(Norm(), x, device="meta")
    else:
        assert profile(Norm(), x, device="meta").flops == profile(Norm(), x).flops
