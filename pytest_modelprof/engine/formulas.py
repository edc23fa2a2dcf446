"""FLOP formulas: one small pure function per ATen op family.

Counting convention (the README's "How FLOPs are counted" repeats it for users):

* A multiply-accumulate (MAC) is 2 FLOPs.
* MACs are counted for the matrix-like ops only: the matmul family, convolutions,
  attention (scores and weighted sum) and the gate matmuls of fused RNN kernels.
* FLOPs include everything counted: ``2 * MACs`` plus bias and accumulator adds
  (1 per element added), plus the elementwise work of each op.
* An elementwise kernel costs, per output element, the number of arithmetic steps
  in its textbook definition, a transcendental function (exp, log, tanh, erf,
  sigmoid, sqrt, ...) being one step: ``add`` 1, ``silu`` 2 (sigmoid, multiply),
  ``gelu`` 5 (erf form) or 9 (tanh form), ``softmax`` 5 (max, subtract, exp, sum,
  divide) per element. The tables below give every figure.
* Reductions cost 1 per input element (``var``/``std`` 3, ``norm`` 2).
* Sorting and selection count comparisons: ``sort`` n * ceil(log2 n) per sorted row,
  ``topk`` n * ceil(log2 k), ``kthvalue``/``median`` n, ``nonzero`` n; ``histc`` 3 per
  element, ``bincount`` 1.
* Normalisation layers: statistics 4 per element (mean 1, variance 3), normalise 2
  (subtract, multiply), affine 1 for the weight and 1 for the bias.
* Pooling: one step per window element per output (max compares, average adds),
  plus the average's divide; adaptive windows are summed exactly.
* FFTs: 5 N log2 N per complex transform of N points (half for a real side), pairwise
  distances 3 per pair and feature plus a root, binary searches ceil(log2(n + 1)).
* Data movement (views, copies, concatenation, indexing, padding, nearest-neighbour
  upsampling, embedding lookups) and tensor creation (including random numbers)
  cost 0 FLOPs; they are still listed in the operator table.
* Convolutions and pooling count every window position, padding included.
  Causal attention counts the full score matrix, as the dense kernels compute it; the
  fused kernels called with ``is_causal=True`` skip the masked scores, and those FLOPs
  are also reported apart (``OpCost.skipped``, ``Profile.skipped_flops``), so that
  ``Profile.useful_flops`` counts only the scores computed.

Each formula takes the op's arguments as the op received them, plus ``out_val``
(the op's output), and returns an :class:`OpCost`, a plain ``int`` (FLOPs, no
MACs), or ``None`` when this particular call cannot be counted (it is then listed
as uncounted). Formulas never run the op, and they count from shapes, so they work
unchanged on real, meta and fake tensors; the few ops whose work follows their
operands' values (variable-length attention's offsets, an adaptive RoI grid, the
matrix exponential's Taylor degree) read them on real tensors and are listed as
uncounted where the run has none.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import flop_counter as _torch_flop_counter
from torch.utils._python_dispatch import _disable_current_modes

aten = torch.ops.aten


class OpCost(NamedTuple):
    """The cost of one op call: FLOPs, and the MACs among them (``flops >= 2 * macs``).

    ``skipped``: of those FLOPs, the ones the kernel does not do though the dense count
    includes them (causal attention's masked scores); the profile's ``useful_flops``
    leaves them out."""

    flops: int
    macs: int = 0
    skipped: int = 0


Formula = Callable[..., "OpCost | int | None"]

BUILTIN: dict[Any, Formula] = {}


def _op(name: str) -> Any:
    """The ATen op ``name``, or None where this torch release has no such op."""
    return getattr(aten, name, None)


def bound_arguments(func: Any, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments by the names of ``func``'s schema; one the call left out (the dispatcher drops
    trailing arguments equal to their defaults) is its default. Without a schema: none."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return {}
    bound: dict[str, Any] = {}
    for index, argument in enumerate(schema.arguments):
        if index < len(args):
            bound[argument.name] = args[index]
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
        else:
            bound[argument.name] = argument.default_value if argument.has_default_value() else None
    return bound


def _register(*names: str) -> Callable[[Formula], Formula]:
    def wrap(formula: Formula) -> Formula:
        for name in names:
            _set(name, formula)
        return formula

    return wrap


def _set(name: str, formula: Formula) -> None:
    op = _op(name)
    if op is not None:
        BUILTIN[op] = formula


def _first_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    for item in value:
        if isinstance(item, torch.Tensor):
            return item
    raise TypeError("op produced no tensor")


def _matmul(macs: int, added: int = 0) -> OpCost:
    return OpCost(2 * macs + added, macs)


# ---------------------------------------------------------------- matmul family


@_register("mm", "_scaled_mm")
def mm(a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    m, k = a.shape
    return _matmul(m * k * b.shape[1])


@_register("addmm", "addmm_")
def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    m, k = a.shape
    n = b.shape[1]
    return _matmul(m * k * n, m * n)


@_register("_addmm_activation")
def addmm_activation(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
    # addmm with its activation in the matrix product's epilogue (cuBLASLt): GELU (tanh form) or ReLU per output
    m, k = a.shape
    n = b.shape[1]
    activation = GELU_TANH_FLOPS if kwargs.get("use_gelu", False) else ELEMENTWISE["relu"]
    return _matmul(m * k * n, m * n * (1 + activation))


@_register("bmm")
def bmm(a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, m, k = a.shape
    return _matmul(batch * m * k * b.shape[2])


@_register("baddbmm", "baddbmm_")
def baddbmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, m, k = a.shape
    n = b.shape[2]
    return _matmul(batch * m * k * n, batch * m * n)


@_register("addbmm", "addbmm_")
def addbmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # sum over the batch of a[i] @ b[i], then + bias: batch * m * n adds in all
    batch, m, k = a.shape
    n = b.shape[2]
    return _matmul(batch * m * k * n, batch * m * n)


@_register("addr", "addr_")
def addr(bias: torch.Tensor, u: torch.Tensor, v: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # bias + outer(u, v): a product of contraction length 1 (one MAC per element), plus the add
    m, n = u.shape[0], v.shape[0]
    return _matmul(m * n, m * n)


@_register("_grouped_mm")
def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: Any = None, bias: Any = None, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # groups of products (mixture-of-experts layers), by the operands' ranks:
    #   2d x 3d: tokens (M_total, K) split by offs over experts (G, K, N) -> (M_total, N): M_total K N
    #   3d x 3d: (G, M, K) x (G, K, N) -> (G, M, N): G M K N
    #   3d x 2d: (G, M, K) x (K, N_total) split by offs -> (M, N_total): M K N_total
    #   2d x 2d: (M, K_total) x (K_total, N), K split by offs -> (G, M, N): M K_total N (weight gradients)
    if a.dim() == 2 and b.dim() == 2:
        macs = a.shape[0] * a.shape[1] * b.shape[1]
    else:
        macs = _first_tensor(out_val).numel() * a.shape[-1]
    return _matmul(macs, _first_tensor(out_val).numel() if bias is not None else 0)


@_register("mv")
def mv(a: torch.Tensor, v: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return _matmul(a.shape[0] * a.shape[1])


@_register("addmv", "addmv_")
def addmv(bias: torch.Tensor, a: torch.Tensor, v: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return _matmul(a.shape[0] * a.shape[1], a.shape[0])


@_register("dot", "vdot")
def dot(a: torch.Tensor, b: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return _matmul(a.numel())


# ---------------------------------------------------------------- convolution


def conv_macs(weight_shape: Sequence[int], batch: int, spatial: Sequence[int]) -> int:
    """MACs of a convolution: every weight meets every position of ``spatial``.

    ``spatial`` is the output's spatial size for a convolution and the input's for a
    transposed one. The weight's shape already divides channels by ``groups``
    (``(C_out, C_in/groups, *k)``, or ``(C_in, C_out/groups, *k)`` transposed), so
    grouped and depthwise convolutions need no special case.
    """
    return batch * math.prod(spatial) * math.prod(weight_shape)


@_register(
    "convolution",
    "_convolution",
    "convolution_overrideable",
    "cudnn_convolution",
    "cudnn_convolution_transpose",
    "mkldnn_convolution",
    "_slow_conv2d_forward",
    "slow_conv3d_forward",
    "slow_conv_transpose2d",
    "slow_conv_transpose3d",
    "slow_conv_dilated2d",
    "slow_conv_dilated3d",
)
def convolution(x: torch.Tensor, weight: torch.Tensor, bias: Any = None, *args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
    out = _first_tensor(out_val)
    transposed = _conv_is_transposed(x, weight, out, args, kwargs)
    spatial = x.shape[2:] if transposed else out.shape[2:]
    macs = conv_macs(weight.shape, x.shape[0], spatial)
    return _matmul(macs, out.numel() if bias is not None else 0)


def _conv_is_transposed(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    if "transposed" in kwargs:
        return bool(kwargs["transposed"])
    # convolution(input, weight, bias, stride, padding, dilation, transposed, ...)
    if len(args) >= 4 and isinstance(args[3], bool):
        return args[3]
    # The dedicated transposed kernels take output_padding where others take dilation;
    # their weight's first dimension is C_in, not C_out.
    return weight.shape[0] == x.shape[1] and weight.shape[0] != out.shape[1]


@_register("convolution_backward")
def convolution_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
    output_mask: Sequence[bool],
    *_: Any,
    out_val: Any = None,
    **__: Any,
) -> OpCost:
    # grad_input is a (transposed) convolution of grad_out with the weight and
    # grad_weight a convolution of the input with grad_out: each does exactly the
    # forward's multiply-accumulates, whatever ``groups`` is.
    spatial = x.shape[2:] if transposed else grad_out.shape[2:]
    forward_macs = conv_macs(weight.shape, x.shape[0], spatial)
    macs = forward_macs * (int(output_mask[0]) + int(output_mask[1]))
    bias_grad_adds = grad_out.numel() if output_mask[2] else 0
    return _matmul(macs, bias_grad_adds)


# ---------------------------------------------------------------- attention

SOFTMAX_FLOPS = 5  # max, subtract, exp, sum, divide
SOFTMAX_BACKWARD_FLOPS = 4  # y * (g - sum(g * y))


def attention_cost(query_shape: Sequence[int], key_shape: Sequence[int], value_shape: Sequence[int], masked: bool) -> OpCost:
    """Forward attention over ``(..., heads, seq, dim)`` tensors, GQA included.

    MACs: scores ``Q K^T`` and output ``P V`` for every query head. FLOPs add, per
    score, the scaling, the softmax and (with a mask) the mask add.
    """
    *batch, heads, s_q, d_qk = query_shape
    scores = math.prod(batch) * heads * s_q * key_shape[-2]
    return _attention_forward(scores, d_qk, value_shape[-1], masked)


def _attention_forward(scores: int, d_qk: int, d_v: int, masked: bool) -> OpCost:
    macs = scores * (d_qk + d_v)
    return OpCost(2 * macs + scores * (1 + SOFTMAX_FLOPS + int(masked)), macs)


def attention_backward_cost(query_shape: Sequence[int], key_shape: Sequence[int], value_shape: Sequence[int]) -> OpCost:
    """Backward of fused attention: recomputed scores, then dV, dP, dQ and dK.

    MACs per score: ``d_qk`` (recompute) + ``d_v`` (dV) + ``d_v`` (dP) + ``2 d_qk``
    (dQ, dK). FLOPs add the softmax recompute from the saved log-sum-exp (2 per
    score), its backward, and the row sums ``D = rowsum(dO * O)`` (2 per output).
    """
    *batch, heads, s_q, d_qk = query_shape
    d_v = value_shape[-1]
    scores = math.prod(batch) * heads * s_q * key_shape[-2]
    return _attention_backward(scores, math.prod(batch) * heads * s_q * d_v, d_qk, d_v)


def _attention_backward(scores: int, outputs: int, d_qk: int, d_v: int) -> OpCost:
    macs = scores * (3 * d_qk + 2 * d_v)
    return OpCost(2 * macs + scores * (2 + SOFTMAX_BACKWARD_FLOPS) + 2 * outputs, macs)


def causal_scores(s_q: int, s_k: int) -> int:
    """Scores a causal mask keeps of an ``s_q x s_k`` matrix: query ``i`` sees keys ``0..i``
    (``torch.ones(s_q, s_k).tril()``, as ``scaled_dot_product_attention(is_causal=True)``)."""
    if s_q <= s_k:
        return s_q * (s_q + 1) // 2
    return s_k * (s_k + 1) // 2 + (s_q - s_k) * s_k


def _is_causal(packet: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The call's ``is_causal`` argument, found by the op's schema (its position differs per kernel)."""
    return bool(bound_arguments(packet.default, args, kwargs).get("is_causal"))


def _sdpa(packet: Any) -> Formula:
    def formula(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
        masked = kwargs.get("attn_mask") is not None or kwargs.get("attn_bias") is not None
        masked = masked or any(isinstance(a, torch.Tensor) for a in args)
        cost = attention_cost(q.shape, k.shape, v.shape, masked)
        if not _is_causal(packet, (q, k, v, *args), kwargs):
            return cost
        s_q, s_k = q.shape[-2], k.shape[-2]
        per_score = cost.flops // (math.prod(q.shape[:-2]) * s_q * s_k)
        return cost._replace(skipped=per_score * math.prod(q.shape[:-2]) * (s_q * s_k - causal_scores(s_q, s_k)))

    return formula


def _sdpa_backward(packet: Any) -> Formula:
    def formula(
        grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any
    ) -> OpCost:
        cost = attention_backward_cost(q.shape, k.shape, v.shape)
        if not _is_causal(packet, (grad_out, q, k, v, *args), kwargs):
            return cost
        s_q, s_k, d_qk, d_v = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
        rows = math.prod(q.shape[:-2])
        per_score = 2 * (3 * d_qk + 2 * d_v) + 2 + SOFTMAX_BACKWARD_FLOPS
        return cost._replace(skipped=per_score * rows * (s_q * s_k - causal_scores(s_q, s_k)))

    return formula


for _name in (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
):
    if _op(_name) is not None:
        _set(_name, _sdpa(_op(_name)))
        if _op(f"{_name}_backward") is not None:
            _set(f"{_name}_backward", _sdpa_backward(_op(f"{_name}_backward")))


def _has_values(t: torch.Tensor) -> bool:
    return t.device.type != "meta" and not isinstance(t, FakeTensor)


@contextlib.contextmanager
def beneath_the_run() -> Iterator[None]:
    """Tensor work that is no op of the step: beneath the run's dispatch and function modes, untracked
    by autograd."""
    with _disable_current_modes(), torch._C.DisableTorchFunction(), torch.no_grad():
        yield


def _from_values(read: Callable[..., Any]) -> Callable[..., Any]:
    """``read(values, ...)`` on the CPU copy of its first argument's values, beneath the run; None
    where the run has no values (meta and fake tensors)."""

    def reading(t: torch.Tensor, *rest: Any, **options: Any) -> Any:
        if not _has_values(t):
            return None
        with beneath_the_run():
            return read(t.detach().cpu(), *rest, **options)

    return reading


def _kernel_attention(name: str, backward: bool, offsets_at: int) -> None:
    """Register the low-level CUDA attention kernel ``name``.

    These take ``(batch, seq, heads, dim)`` tensors, or packed variable-length
    batches described by cumulative offsets (``args[offsets_at]``). Dense inputs are
    counted from their shapes. Packed batches are counted per sequence by
    torch.utils.flop_counter's own formula, read from its registry (never registered
    into it); it counts the matmuls only, so the scores are recovered from its MACs
    and the softmax work is added as for every other attention kernel. (Its formulas
    for the dense efficient-attention kernels read the layout as (batch, heads, seq,
    dim) and count heads squared instead of sequence squared, so they are not used.)
    """
    packet = _op(name)
    if packet is None:
        return
    by_torch = _torch_flop_counter.flop_registry.get(packet)

    def formula(*args: Any, out_val: Any = None, **kwargs: Any) -> OpCost | None:
        q, k, v = args[1:4] if backward else args[:3]
        d_qk, d_v = q.shape[-1], v.shape[-1]
        if args[offsets_at] is None:
            swap = (q.shape[0], q.shape[2], q.shape[1], d_qk), (k.shape[0], k.shape[2], k.shape[1], d_qk)
            v_shape = (v.shape[0], v.shape[2], v.shape[1], d_v)
            if backward:
                return attention_backward_cost(swap[0], swap[1], v_shape)
            return attention_cost(swap[0], swap[1], v_shape, masked=not name.startswith("_flash") and args[3] is not None)
        if by_torch is None or not _has_values(args[offsets_at]):
            return None  # sequence lengths unknown (analytic run): listed as uncounted
        macs = int(by_torch(*args, out_val=out_val, **kwargs)) // 2
        if backward:
            return _attention_backward(macs // (3 * d_qk + 2 * d_v), q.numel() // d_qk * d_v, d_qk, d_v)
        return _attention_forward(macs // (d_qk + d_v), d_qk, d_v, masked=False)

    BUILTIN[packet] = formula


_kernel_attention("_flash_attention_forward", backward=False, offsets_at=3)
_kernel_attention("_flash_attention_backward", backward=True, offsets_at=6)
_kernel_attention("_efficient_attention_forward", backward=False, offsets_at=4)
_kernel_attention("_efficient_attention_backward", backward=True, offsets_at=6)


def _total(*costs: OpCost) -> OpCost:
    """The cost of several parts of one op, added."""
    return OpCost(sum(c.flops for c in costs), sum(c.macs for c in costs), sum(c.skipped for c in costs))


def _projections(tokens: int, in_features: int, out_features: int, bias: bool) -> OpCost:
    macs = tokens * in_features * out_features
    return _matmul(macs, tokens * out_features if bias else 0)


def _multi_head_attention(batch: int, s_q: int, s_k: int, embed: int, heads: int, self_attention: bool, masked: bool) -> OpCost:
    """Input projections, attention and output projection of ``nn.MultiheadAttention``."""
    if self_attention:
        in_proj = _projections(batch * s_q, embed, 3 * embed, bias=True)
    else:
        q_proj = _projections(batch * s_q, embed, embed, bias=True)
        kv_proj = _projections(batch * s_k, embed, 2 * embed, bias=True)
        in_proj = _total(q_proj, kv_proj)
    head_dim = embed // heads
    attention = attention_cost((batch, heads, s_q, head_dim), (batch, heads, s_k, head_dim), (batch, heads, s_k, head_dim), masked)
    out_proj = _projections(batch * s_q, embed, embed, bias=True)
    return _total(in_proj, attention, out_proj)


@_register("_native_multi_head_attention")
def native_multi_head_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim: int,
    num_head: int,
    *args: Any,
    out_val: Any = None,
    **kwargs: Any,
) -> OpCost | None:
    if query.is_nested:  # each sequence on its own (self-attention of a nested batch)
        lengths = _nested_lengths(query)
        if lengths is None or not (query is key and key is value):
            return None
        return _total(*(_multi_head_attention(1, n, n, embed_dim, num_head, True, False) for n in lengths))
    batch, s_q, _ = query.shape
    mask = kwargs.get("mask", args[4] if len(args) > 4 else None)
    self_attention = query is key and key is value
    return _multi_head_attention(batch, s_q, key.shape[1], embed_dim, num_head, self_attention, mask is not None)


LAYER_NORM_FLOPS = 8  # statistics 4, normalise 2, weight 1, bias 1


def _nested_lengths(t: torch.Tensor) -> list[int] | None:
    """The sequence lengths of a nested tensor's components (what ``nn.TransformerEncoder`` packs a padded
    batch into, in eval with a padding mask); None where they are not known (a fake nested tensor)."""
    try:
        sizes = t._nested_tensor_size()
    except (RuntimeError, NotImplementedError, AttributeError):
        return None
    if isinstance(sizes, FakeTensor) or sizes.device.type == "meta" or sizes.dim() != 2:
        return None
    return [int(row[0]) for row in sizes.tolist()]


@_register("_transformer_encoder_layer_fwd")
def transformer_encoder_layer(
    src: torch.Tensor, embed_dim: int, num_heads: int, *args: Any, out_val: Any = None, **kwargs: Any
) -> OpCost | None:
    if src.is_nested:  # each sequence on its own, its padding left out
        lengths = _nested_lengths(src)
        if lengths is None:
            return None
        return _total(*(_encoder_layer(1, n, embed_dim, num_heads, args, kwargs) for n in lengths))
    batch, seq, _ = src.shape
    return _encoder_layer(batch, seq, embed_dim, num_heads, args, kwargs)


def _encoder_layer(batch: int, seq: int, embed_dim: int, num_heads: int, args: Sequence[Any], kwargs: dict[str, Any]) -> OpCost:
    use_gelu = args[4]
    ffn_weight_1 = args[11]
    hidden = ffn_weight_1.shape[0]
    mask = kwargs.get("mask", args[15] if len(args) > 15 else None)
    tokens = batch * seq
    attention = _multi_head_attention(batch, seq, seq, embed_dim, num_heads, True, mask is not None)
    ffn_1 = _projections(tokens, embed_dim, hidden, bias=True)
    ffn_2 = _projections(tokens, hidden, embed_dim, bias=True)
    activation = tokens * hidden * (ELEMENTWISE["gelu"] if use_gelu else ELEMENTWISE["relu"])
    norms_and_residuals = tokens * embed_dim * 2 * (LAYER_NORM_FLOPS + 1)
    return OpCost(
        attention.flops + ffn_1.flops + ffn_2.flops + activation + norms_and_residuals,
        attention.macs + ffn_1.macs + ffn_2.macs,
    )


# ---------------------------------------------------------------- recurrent layers

# mode numbers of ATen's RNN kernels, and the elementwise work of one cell per
# hidden unit after the gate matmuls and the sum of their two halves:
# LSTM: 3 sigmoids + tanh on the gates, c' = f*c + i*g (3), h' = o*tanh(c') (2)
# GRU: 2 sigmoids, n = tanh(x_n + r*h_n) (3), h' = (1-z)*n + z*h (4)
RNN_CELL_FLOPS = {0: 1, 1: 1, 2: 9, 3: 9}  # RNN_RELU, RNN_TANH, LSTM, GRU


def rnn_layer_cost(steps_times_batch: int, gate_rows: int, input_size: int, hidden_size: int, mode: int, has_biases: bool) -> OpCost:
    """One direction of one recurrent layer over a sequence.

    MACs per step and sample: ``W_ih x`` and ``W_hh h``, i.e. ``gates * (input + hidden)``.
    FLOPs add the sum of the two matmuls and two biases per gate row, then the cell.
    """
    macs = steps_times_batch * gate_rows * (input_size + hidden_size)
    adds = steps_times_batch * gate_rows * (1 + 2 * int(has_biases))
    cell = steps_times_batch * hidden_size * RNN_CELL_FLOPS.get(mode, 1)
    return OpCost(2 * macs + adds + cell, macs)


@_register("mkldnn_rnn_layer")
def mkldnn_rnn_layer(x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (input, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, batch_sizes, mode, hidden_size, num_layers, has_biases, ...)
    mode, hidden_size, has_biases = args[6], args[7], args[9]
    steps_times_batch = x.numel() // x.shape[-1]
    return rnn_layer_cost(steps_times_batch, w_ih.shape[0], w_ih.shape[1], hidden_size, mode, has_biases)


@_register("mkldnn_rnn_layer_backward")
def mkldnn_rnn_layer_backward(
    x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, *args: Any, out_val: Any = None, **__: Any
) -> OpCost:
    # Gradients for inputs/hidden states and for both weight matrices: twice the
    # forward's MACs; the cell's backward is counted as twice its forward.
    mode, hidden_size, has_biases = args[11], args[12], args[14]
    steps_times_batch = x.numel() // x.shape[-1]
    forward = rnn_layer_cost(steps_times_batch, w_ih.shape[0], w_ih.shape[1], hidden_size, mode, has_biases)
    return OpCost(2 * forward.flops, 2 * forward.macs)


@_register("_cudnn_rnn")
def cudnn_rnn(x: torch.Tensor, weights: list[torch.Tensor], weight_stride0: int, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (input, weight, weight_stride0, weight_buf, hx, cx, mode, hidden_size, proj_size, num_layers, ...)
    return _cudnn_rnn_cost(x, weights, weight_stride0, args[3])


def _cudnn_rnn_cost(x: torch.Tensor, weights: list[torch.Tensor], weight_stride0: int, mode: int) -> OpCost:
    """Every layer and direction of the whole stack in one call; the weights come in groups of
    ``weight_stride0``: w_ih, w_hh (, b_ih, b_hh) (, w_hr)."""
    steps_times_batch = x.numel() // x.shape[-1]
    has_biases = weight_stride0 in (4, 5)
    flops = macs = 0
    for start in range(0, len(weights), weight_stride0):
        w_ih, w_hh = weights[start], weights[start + 1]
        cost = rnn_layer_cost(steps_times_batch, w_ih.shape[0], w_ih.shape[1], w_hh.shape[1], mode, has_biases)
        flops, macs = flops + cost.flops, macs + cost.macs
        if weight_stride0 in (3, 5):  # the projection of LSTM's hidden state (proj_size)
            w_hr = weights[start + weight_stride0 - 1]
            flops, macs = flops + 2 * steps_times_batch * w_hr.numel(), macs + steps_times_batch * w_hr.numel()
    return OpCost(flops, macs)


@_register("_cudnn_rnn_backward")
def cudnn_rnn_backward(
    x: torch.Tensor, weights: list[torch.Tensor], weight_stride0: int, *args: Any, out_val: Any = None, **__: Any
) -> OpCost:
    # (input, weight, weight_stride0, weight_buf, hx, cx, output, grad_output, grad_hy, grad_cy, mode, ...):
    # as mkldnn_rnn_layer_backward, twice the forward
    forward = _cudnn_rnn_cost(x, weights, weight_stride0, args[7])
    return OpCost(2 * forward.flops, 2 * forward.macs)


# The fused cells CUDA runs for nn.LSTMCell and nn.GRUCell (aten/src/ATen/native/cuda/RNN.cu), after
# the two gate matmuls (counted as mm): forward as a recurrent layer's cell above (the sum of
# the gate halves and biases, then the cell); backward as the kernels compute it, per hidden unit:
# LSTM 23 (tanh(c') and the output gate's product 2, c's gradient 5, the gates' products 4, the
# sigmoid and tanh derivatives 3 each), GRU 16 (the update gate's 5, hx's 1, the new gate's 5, its
# hidden half's 1, the reset gate's 4); with biases, their gradients summed over the batch.
FUSED_CELL_BACKWARD_FLOPS = {2: 23, 3: 16}  # LSTM, GRU


def _fused_cell(mode: int) -> Formula:
    def formula(input_gates: torch.Tensor, hidden_gates: torch.Tensor, state: torch.Tensor, *biases: Any, **__: Any) -> OpCost:
        has_biases = any(isinstance(b, torch.Tensor) for b in biases)
        return OpCost(input_gates.numel() * (1 + 2 * int(has_biases)) + state.numel() * RNN_CELL_FLOPS[mode])

    return formula


_set("_thnn_fused_lstm_cell", _fused_cell(2))
_set("_thnn_fused_gru_cell", _fused_cell(3))


@_register("_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_lstm_cell_backward")
def fused_lstm_cell_backward(
    grad_hy: Any, grad_cy: Any, cx: torch.Tensor, cy: torch.Tensor, workspace: torch.Tensor, has_bias: bool, **__: Any
) -> OpCost:
    return OpCost(cx.numel() * FUSED_CELL_BACKWARD_FLOPS[2] + (workspace.numel() if has_bias else 0))


@_register("_thnn_fused_gru_cell_backward")
def fused_gru_cell_backward(grad_hy: torch.Tensor, workspace: torch.Tensor, has_bias: bool, **__: Any) -> OpCost:
    return OpCost(grad_hy.numel() * FUSED_CELL_BACKWARD_FLOPS[3] + (2 * 3 * grad_hy.numel() if has_bias else 0))


# CTC (aten/src/ATen/native/LossCTC.cpp, cuda/LossCTC.cu): dynamic programming over a lattice of
# input steps x the target extended with blanks (2 L + 1 positions). Each forward variable is a
# 3-way log-sum-exp of the previous step's plus a log-probability: 13 (2 comparisons for the max,
# 3 subtractions, 3 exps, 2 adds, a log, adding back the max and the log-probability). The backward
# pass computes the backward variables alike (13) and folds alpha + beta into the gradient of the
# label each position holds with a 2-way log-sum-exp (9 with the sum); then each gradient element
# is exp(lp) - exp(lcab + nll - lp), times the loss's gradient: 6. ATen's kernels span the padded
# lattice (every sequence to the longest target, the shape of ``log_alpha``); cuDNN's, which also
# makes the gradient in its forward pass, each sequence's own (concatenated targets: sum(2 L + 1)).
CTC_CELL, CTC_GRADIENT_CELL, CTC_GRADIENT_ELEMENT = 13, 9, 6


@_register("_ctc_loss")
def ctc_loss(log_probs: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost | None:
    if out_val is None:
        return None
    return OpCost(CTC_CELL * out_val[1].numel())


@_register("_ctc_loss_backward")
def ctc_loss_backward(grad: torch.Tensor, log_probs: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    log_alpha = args[4]  # (targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha, ...)
    return OpCost((CTC_CELL + CTC_GRADIENT_CELL) * log_alpha.numel() + CTC_GRADIENT_ELEMENT * log_probs.numel())


@_register("_cudnn_ctc_loss")
def cudnn_ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    lattice = log_probs.shape[0] * (2 * targets.numel() + log_probs.shape[1])
    return OpCost((2 * CTC_CELL + CTC_GRADIENT_CELL) * lattice + CTC_GRADIENT_ELEMENT * log_probs.numel())


# ---------------------------------------------------------------- elementwise

# FLOPs per output element of elementwise kernels (in-place variants share them).
ELEMENTWISE: dict[str, int] = {
    **dict.fromkeys(
        """add sub rsub mul div neg abs sign sgn reciprocal sqrt rsqrt exp exp2 expm1 log log2
        log10 log1p sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh erf erfc
        erfinv sigmoid relu threshold leaky_relu clamp_min clamp_max maximum minimum fmax fmin
        pow floor ceil round trunc frac remainder fmod floor_divide eq ne lt le gt ge
        logical_not logical_and logical_or logical_xor bitwise_not bitwise_and bitwise_or
        bitwise_xor isnan isinf nan_to_num square copysign hypot xlogy special_xlog1py
        heaviside signbit sinc threshold_backward digamma lgamma polygamma mvlgamma i0 igamma igammac
        special_i0e special_i1 special_i1e special_ndtri special_log_ndtr special_erfcx special_entr
        special_zeta special_bessel_j0 special_bessel_j1 special_bessel_y0 special_bessel_y1
        special_modified_bessel_i0 special_modified_bessel_i1 special_modified_bessel_k0
        special_modified_bessel_k1 special_scaled_modified_bessel_k0 special_scaled_modified_bessel_k1
        special_spherical_bessel_j0 special_airy_ai""".split(),
        1,
    ),
    **dict.fromkeys(
        """clamp clip hardtanh relu6 silu glu _prelu_kernel prelu leaky_relu_backward
        hardtanh_backward hardsigmoid_backward hardshrink hardshrink_backward softshrink_backward
        rrelu_with_noise rrelu_with_noise_backward""".split(),
        2,
    ),
    **dict.fromkeys(
        "addcmul addcdiv lerp softplus logit softshrink sigmoid_backward tanh_backward elu_backward _prelu_kernel_backward".split(), 3
    ),
    **dict.fromkeys("elu celu hardsigmoid log_sigmoid_forward log_sigmoid_backward softplus_backward hardswish_backward".split(), 4),
    "polar": 4,  # (r cos t, r sin t)
    **dict.fromkeys("gelu selu hardswish mish glu_backward".split(), 5),
    "silu_backward": 6,
    "gelu_backward": 9,
    "mish_backward": 10,
    # dropout: compare with a random draw, then multiply by mask and scale
    "native_dropout": 2,
    "native_dropout_backward": 2,
}
GELU_TANH_FLOPS = 9
GELU_TANH_BACKWARD_FLOPS = 15


def _elementwise(per_element: int) -> Formula:
    def formula(*_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(per_element * _first_tensor(out_val).numel())

    return formula


def _gelu(per_element_erf: int, per_element_tanh: int) -> Formula:
    def formula(*args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
        approximate = kwargs.get("approximate", args[-1] if args and isinstance(args[-1], str) else "none")
        per_element = per_element_tanh if approximate == "tanh" else per_element_erf
        return OpCost(per_element * _first_tensor(out_val).numel())

    return formula


for _name, _per_element in ELEMENTWISE.items():
    for _suffix in ("", "_"):
        _set(_name + _suffix, _elementwise(_per_element))
for _name in ("gelu", "gelu_"):
    _set(_name, _gelu(ELEMENTWISE["gelu"], GELU_TANH_FLOPS))
_set("gelu_backward", _gelu(ELEMENTWISE["gelu_backward"], GELU_TANH_BACKWARD_FLOPS))


# ---------------------------------------------------------------- optimizers


def _tensor_list_numel(values: Any) -> int:
    return sum(t.numel() for t in values if isinstance(t, torch.Tensor))


def _foreach(per_element: int) -> Formula:
    """``_foreach_<op>`` kernels: the elementwise op over every tensor of the first list."""

    def formula(tensors: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(per_element * _tensor_list_numel(tensors))

    return formula


for _name, _per_element in ELEMENTWISE.items():
    for _suffix in ("", "_"):
        _set(f"_foreach_{_name}{_suffix}", _foreach(_per_element))

# Per parameter element, the same steps as the for-loop and foreach forms count:
# Adam: m lerp (3), v = v * b2 + (1 - b2) g^2 (1 + 3), sqrt (1), bias correction (1),
# + eps (1), p -= lr * m / denom (3): 13; weight decay, decoupled (AdamW: p *= 1 - lr wd)
# or L2 (Adam: g += wd p), 1; amsgrad max (1).
ADAM_FLOPS = 13


def _fused_adam() -> Formula:
    def formula(params: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
        per_element = ADAM_FLOPS + int(bool(kwargs.get("amsgrad")))
        per_element += int(bool(kwargs.get("weight_decay")))
        return OpCost(per_element * _tensor_list_numel(params))

    return formula


for _name in ("_fused_adam_", "_fused_adam", "_fused_adamw_", "_fused_adamw"):
    _set(_name, _fused_adam())


@_register("_fused_adagrad_", "_fused_adagrad")
def fused_adagrad(params: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
    # sum += g * g (2); std = sqrt(sum) + eps (2); p -= lr * g / std (3); L2 decay g += wd p (1)
    per_element = 7 + int(bool(kwargs.get("weight_decay")))
    return OpCost(per_element * _tensor_list_numel(params))


@_register("_fused_sgd_", "_fused_sgd")
def fused_sgd(params: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
    # p -= lr * g (1); momentum: buf = buf * m + g (2); nesterov: g += m * buf (1); L2 decay g += wd p (1)
    per_element = 1 + 2 * int(bool(kwargs.get("momentum"))) + int(bool(kwargs.get("nesterov"))) + int(bool(kwargs.get("weight_decay")))
    return OpCost(per_element * _tensor_list_numel(params))


# ---------------------------------------------------------------- sorting and selection
# One FLOP per comparison (or, for histc, per arithmetic step), as for max and argmax:
# sort compares n * ceil(log2 n) times per sorted row, topk n * ceil(log2 k) (a heap of k),
# a k-th value or median n (a selection), histc 3 per element (shift, scale, range test),
# bincount 1 per element (the count's add), nonzero 1 per element.


def _rows_and_length(x: torch.Tensor, dim: int) -> tuple[int, int]:
    if x.dim() == 0:
        return 1, 1
    n = x.shape[dim]
    return (x.numel() // n if n else 0), n


def _log2(n: int) -> int:
    return max(1, math.ceil(math.log2(n))) if n > 1 else 1


@_register("sort")
def sort(x: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    # sort(self, dim=-1, descending=False); sort.stable(self, *, stable, dim=-1, descending=False)
    dim = kwargs.get("dim", args[0] if args and isinstance(args[0], int) and not isinstance(args[0], bool) else -1)
    rows, n = _rows_and_length(x, dim)
    return rows * n * _log2(n) if n > 1 else 0


@_register("topk")
def topk(x: torch.Tensor, k: int, dim: int = -1, *_: Any, out_val: Any = None, **kwargs: Any) -> int:
    rows, n = _rows_and_length(x, kwargs.get("dim", dim))
    return rows * n * _log2(k)


@_register("kthvalue", "median", "nanmedian")
def selection(x: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    return x.numel()


@_register("histc")
def histc(x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> int:
    return 3 * x.numel()


@_register("bincount")
def bincount(x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> int:
    return x.numel()


@_register("nonzero", "nonzero_static", "argwhere")
def nonzero(x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> int:
    return x.numel()


# ---------------------------------------------------------------- reductions and softmax

REDUCTION: dict[str, int] = {
    **dict.fromkeys("sum mean nansum prod amax amin max min argmax argmin aminmax all any _is_all_true _is_any_true".split(), 1),
    **dict.fromkeys("cumsum cumprod logcumsumexp cummax cummin".split(), 1),
    **dict.fromkeys("norm linalg_vector_norm".split(), 2),
    **dict.fromkeys("var std var_mean std_mean logsumexp".split(), 3),
}


def _reduction(per_element: int) -> Formula:
    def formula(x: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(per_element * x.numel() if isinstance(x, torch.Tensor) else 0)

    return formula


for _name, _per_element in REDUCTION.items():
    _set(_name, _reduction(_per_element))

for _name in ("_softmax", "_log_softmax", "_safe_softmax"):
    _set(_name, _reduction(SOFTMAX_FLOPS))
for _name in ("_softmax_backward_data", "_log_softmax_backward_data"):
    _set(_name, _reduction(SOFTMAX_BACKWARD_FLOPS))


@_register("_masked_softmax")
def masked_softmax(x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost((SOFTMAX_FLOPS + 1) * x.numel())  # the mask's select, then the softmax


@_register("_transform_bias_rescale_qkv")
def transform_bias_rescale_qkv(qkv: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # the packed projection's bias added to q, k and v, and q scaled by 1/sqrt(head size)
    return OpCost(qkv.numel() + qkv.numel() // 3)


# ---------------------------------------------------------------- normalisation


def _norm_forward(x: torch.Tensor, statistics: bool, weight: Any, bias: Any) -> OpCost:
    per_element = 2 + 4 * int(statistics) + int(weight is not None) + int(bias is not None)
    return OpCost(per_element * x.numel())


def _norm_backward(x: torch.Tensor, statistics: bool, output_mask: Sequence[bool]) -> OpCost:
    # grad_input: with batch statistics two row sums and the combination (7), else a scale (2);
    # grad_weight: normalised input times grad, summed (2); grad_bias: a sum (1).
    per_element = (7 if statistics else 2) * int(output_mask[0]) + 2 * int(output_mask[1]) + int(output_mask[2])
    return OpCost(per_element * x.numel())


@_register("native_batch_norm", "_native_batch_norm_legit", "cudnn_batch_norm", "miopen_batch_norm")
def batch_norm(
    x: torch.Tensor, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: bool, *_: Any, out_val: Any = None, **__: Any
) -> OpCost:
    return _norm_forward(x, bool(training), weight, bias)


@_register("_native_batch_norm_legit_no_training", "_batch_norm_no_update")
def batch_norm_inference(x: torch.Tensor, weight: Any, bias: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return _norm_forward(x, False, weight, bias)


@_register("_batch_norm_with_update", "_native_batch_norm_legit_functional")
def batch_norm_training(x: torch.Tensor, weight: Any, bias: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return _norm_forward(x, True, weight, bias)


@_register("native_batch_norm_backward")
def batch_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask)
    return _norm_backward(x, bool(args[5]), args[7])


@_register("batch_norm_backward")
def batch_norm_backward_v2(grad_out: torch.Tensor, x: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask, reserve)
    return _norm_backward(x, bool(args[5]), args[7])


@_register("cudnn_batch_norm_backward", "miopen_batch_norm_backward")
def cudnn_batch_norm_backward(x: torch.Tensor, grad_out: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (input, grad_output, weight, running_mean, running_var, save_mean, save_var, eps[, reserve]): every
    # gradient is computed; with the batch's statistics when the forward saved them (training)
    save_mean = args[3]
    return _norm_backward(x, save_mean is not None and save_mean.numel() > 0, (True, True, True))


@_register("native_layer_norm")
def layer_norm(x: torch.Tensor, shape: Any, weight: Any = None, bias: Any = None, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return _norm_forward(x, True, weight, bias)


@_register("native_layer_norm_backward")
def layer_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
    return _norm_backward(x, True, args[5])


@_register("native_group_norm")
def group_norm(x: torch.Tensor, weight: Any, bias: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return _norm_forward(x, True, weight, bias)


@_register("native_group_norm_backward")
def group_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # (grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask)
    return _norm_backward(x, True, args[7])


@_register("_fused_rms_norm")
def rms_norm(x: torch.Tensor, shape: Any, weight: Any = None, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # square 1, mean 1, multiply by the reciprocal root 1, weight 1
    return OpCost((3 + int(weight is not None)) * x.numel())


@_register("_fused_rms_norm_backward")
def rms_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
    # grad_input: one row sum and the combination (5); grad_weight: multiply and sum (2)
    output_mask = args[-1]
    return OpCost((5 * int(output_mask[0]) + 2 * int(output_mask[1])) * x.numel())


# ---------------------------------------------------------------- pooling


def _window_numel(kernel_size: Any, dims: int) -> int:
    sizes = list(kernel_size) if isinstance(kernel_size, (list, tuple)) else [kernel_size]
    if len(sizes) == 1:
        sizes = sizes * dims
    return math.prod(sizes)


def _max_pool(dims: int) -> Formula:
    def formula(x: torch.Tensor, kernel_size: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(_first_tensor(out_val).numel() * _window_numel(kernel_size, dims))

    return formula


def _avg_pool(dims: int) -> Formula:
    def formula(x: torch.Tensor, kernel_size: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(_first_tensor(out_val).numel() * (_window_numel(kernel_size, dims) + 1))

    return formula


def _avg_pool_backward(dims: int) -> Formula:
    def formula(grad_out: torch.Tensor, x: torch.Tensor, kernel_size: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(grad_out.numel() * (_window_numel(kernel_size, dims) + 1))

    return formula


def _scatter_grad(grad_out: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    """Backward ops that add each output gradient into one input position."""
    return OpCost(grad_out.numel())


for _dims in (1, 2, 3):
    _set(f"max_pool{_dims}d", _max_pool(_dims))
    _set(f"max_pool{_dims}d_with_indices", _max_pool(_dims))
    _set(f"max_pool{_dims}d_with_indices_backward", _scatter_grad)
    _set(f"avg_pool{_dims}d", _avg_pool(_dims))
    _set(f"avg_pool{_dims}d_backward", _avg_pool_backward(_dims))
_set("mkldnn_max_pool2d", _max_pool(2))
# Tensor.unfold is a view; its backward adds each window's gradient into the input's (overlapping
# windows meet): one add per gradient element
_set("unfold_backward", _scatter_grad)
for _dims in (2, 3):  # (self, kernel_size, output_size, random_samples): one step per window element per output
    _set(f"fractional_max_pool{_dims}d", _max_pool(_dims))
    _set(f"fractional_max_pool{_dims}d_backward", _scatter_grad)


def adaptive_window_elements(in_size: int, out_size: int) -> int:
    """Sum, over the output positions, of the adaptive window sizes along one dimension."""
    return sum(math.ceil((i + 1) * in_size / out_size) - (i * in_size) // out_size for i in range(out_size))


def _adaptive_pool(spatial_dims: int) -> Formula:
    def formula(x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        out = _first_tensor(out_val)
        leading = math.prod(out.shape[: out.dim() - spatial_dims])
        window = math.prod(adaptive_window_elements(x.shape[-d], out.shape[-d]) for d in range(1, spatial_dims + 1))
        # one step per window element, plus the average's divide per output
        return OpCost(leading * window + out.numel())

    return formula


def _adaptive_pool_backward(grad_out: torch.Tensor, x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # every input element receives its windows' gradients (about one add each)
    return OpCost(x.numel())


for _dims in (2, 3):
    _set(f"_adaptive_avg_pool{_dims}d", _adaptive_pool(_dims))
    _set(f"adaptive_max_pool{_dims}d", _adaptive_pool(_dims))
    _set(f"_adaptive_avg_pool{_dims}d_backward", _adaptive_pool_backward)
    _set(f"adaptive_max_pool{_dims}d_backward", _scatter_grad)


# ---------------------------------------------------------------- embedding, upsampling, losses

_set("embedding_dense_backward", _scatter_grad)
for _name in ("reflection_pad1d", "reflection_pad2d", "reflection_pad3d", "replication_pad1d", "replication_pad2d", "replication_pad3d"):
    _set(_name + "_backward", _scatter_grad)


@_register("_embedding_bag", "_embedding_bag_forward_only")
def embedding_bag(
    weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any
) -> OpCost:
    per_sample_weights = kwargs.get("per_sample_weights", args[3] if len(args) > 3 else None)
    gathered = indices.numel() * weight.shape[1]
    return OpCost(gathered * (1 + int(per_sample_weights is not None)))


@_register("_embedding_bag_backward", "_embedding_bag_dense_backward")
def embedding_bag_backward(grad: torch.Tensor, indices: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # every looked-up row receives its bag's gradient: one add per gathered element
    return OpCost(indices.numel() * grad.shape[-1])


@_register("_embedding_bag_per_sample_weights_backward")
def embedding_bag_weights_backward(
    grad: torch.Tensor, weight: torch.Tensor, indices: torch.Tensor, *_: Any, out_val: Any = None, **__: Any
) -> OpCost:
    # a dot product of each gathered row with its bag's gradient
    return _matmul(indices.numel() * weight.shape[1])


def _interpolation(per_element: int) -> Formula:
    def formula(*_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(per_element * _first_tensor(out_val).numel())

    return formula


def _interpolation_backward(per_element: int) -> Formula:
    def formula(grad_out: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(per_element * grad_out.numel())

    return formula


# each output is a weighted sum of 2^n neighbours (2^n multiplies, 2^n - 1 adds);
# bicubic of 16 neighbours; nearest copies one value (0) and its backward adds (1).
_INTERPOLATION = {
    "upsample_linear1d": 3,
    "upsample_bilinear2d": 7,
    "_upsample_bilinear2d_aa": 7,
    "upsample_trilinear3d": 15,
    "upsample_bicubic2d": 31,
    "_upsample_bicubic2d_aa": 31,
}
for _name, _per_element in _INTERPOLATION.items():
    _set(_name, _interpolation(_per_element))
    _set(_name + "_backward", _interpolation_backward(_per_element))
for _name in (
    "upsample_nearest1d",
    "upsample_nearest2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d",
    "_upsample_nearest_exact3d",
):
    _set(_name + "_backward", _scatter_grad)

# grid_sample: the interpolation's cost per output element (as above: bilinear 7, trilinear 15,
# bicubic 31, nearest 0), plus 3 per coordinate of each output location to map it into the
# input's pixels ((x + 1) * size - 1) / 2); its backward the per-element cost for each gradient it
# makes (the input's scatters the weighted neighbours, the grid's reads them again), plus the mapping.
_GRID_SAMPLE = {(2, 0): 7, (2, 1): 0, (2, 2): 31, (3, 0): 15, (3, 1): 0}  # (dims, mode) -> per output element


def _grid_sampler(dims: int, backward: bool) -> Formula:
    def formula(*args: Any, out_val: Any = None, **kwargs: Any) -> OpCost | None:
        x, grid, mode = (args[1], args[2], args[3]) if backward else (args[0], args[1], args[2])
        per_element = _GRID_SAMPLE.get((dims, mode))
        if per_element is None:
            return None
        locations = grid.numel() // dims
        channels = x.shape[1]
        # the backward pass makes the gradients its output mask asks for: the input's, the grid's
        passes = sum(bool(m) for m in args[6]) if backward and len(args) > 6 else 1
        return OpCost(passes * per_element * locations * channels + 3 * grid.numel())

    return formula


for _dims in (2, 3):
    _set(f"grid_sampler_{_dims}d", _grid_sampler(_dims, backward=False))
    _set(f"grid_sampler_{_dims}d_backward", _grid_sampler(_dims, backward=True))


# cuDNN's sampler (what grid_sample runs on CUDA for bilinear, zero-padded, corner-aligned 2-d
# sampling): as grid_sampler_2d's bilinear mode; its backward always makes both gradients
@_register("cudnn_grid_sampler")
def cudnn_grid_sampler(x: torch.Tensor, grid: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(_GRID_SAMPLE[(2, 0)] * grid.numel() // 2 * x.shape[1] + 3 * grid.numel())


@_register("cudnn_grid_sampler_backward")
def cudnn_grid_sampler_backward(x: torch.Tensor, grid: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(2 * _GRID_SAMPLE[(2, 0)] * grid.numel() // 2 * x.shape[1] + 3 * grid.numel())


# FFTs: 5 N log2 N real FLOPs per complex transform of N points (radix-2 Cooley-Tukey, the
# convention of FFTW's benchmarks), N the product of the transformed dims; half of that for a
# transform of real input or to real output; a normalisation scales each output element once
# (2 FLOPs for a complex one).
def _fft(kind: str) -> Formula:
    def formula(x: torch.Tensor, dim: Sequence[int], normalization: int, *args: Any, out_val: Any = None, **__: Any) -> OpCost:
        # the transform's length: the complex input's for c2c, the real side's for r2c and c2r
        real_side = x if kind == "r2c" else _first_tensor(out_val)
        points = math.prod(real_side.shape[d] for d in dim) if dim else 1
        if points == 0:
            return OpCost(0)
        transforms = real_side.numel() // points
        per_transform = 5 * points * math.log2(points) * (1 if kind == "c2c" else 0.5) if points > 1 else 0
        out = _first_tensor(out_val)
        scale = out.numel() * (2 if out.is_complex() else 1) if normalization else 0
        return OpCost(round(transforms * per_transform) + scale)

    return formula


for _kind in ("r2c", "c2c", "c2r"):
    _set(f"_fft_{_kind}", _fft(_kind))


# cdist: per pair of rows and per feature, a difference, a power (or absolute value) and a sum;
# then a root per pair (none for p of 0, 1 and infinity). Its backward (one call per input):
# per pair and feature, the difference, its power, a scale by the pair's gradient over its
# distance, and a sum.
@_register("_cdist_forward")
def cdist(x1: torch.Tensor, x2: torch.Tensor, p: float, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    pairs = _first_tensor(out_val).numel()
    root = pairs if p not in (0.0, 1.0, math.inf) else 0
    return OpCost(3 * pairs * x1.shape[-1] + root)


@_register("_cdist_backward")
def cdist_backward(grad: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(4 * grad.numel() * x1.shape[-1])


# cdist's matrix-product form for p = 2 (torch.cdist's compute_mode, by default past 25 rows a side):
# x1 (P x M) and x2 (R x M) padded with their squared norms (a square and an add per element) and
# ones, x1 scaled by -2, one product of M + 2 terms per pair, then a clamp and a root per pair
# (aten/src/ATen/native/Distance.cpp, _euclidean_dist).
@_register("_euclidean_dist")
def euclidean_dist(x1: torch.Tensor, x2: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    pairs = _first_tensor(out_val).numel()
    macs = pairs * (x1.shape[-1] + 2)
    return OpCost(2 * macs + 3 * x1.numel() + 2 * x2.numel() + 2 * pairs, macs)


@_register("_pdist_forward")
def pdist(x: torch.Tensor, p: float = 2.0, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # as cdist: each of the n (n - 1) / 2 pairs of rows, 3 per feature and a root
    pairs = _first_tensor(out_val).numel()
    root = pairs if p not in (0.0, 1.0, math.inf) else 0
    return OpCost(3 * pairs * x.shape[-1] + root)


@_register("_pdist_backward")
def pdist_backward(grad: torch.Tensor, x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(4 * grad.numel() * x.shape[-1])


@_register("col2im")
def col2im(columns: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # fold: every column element added into its image position
    return OpCost(columns.numel())


@_register("affine_grid_generator")
def affine_grid_generator(theta: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # each output coordinate is a row of theta times the homogeneous base position (dims + 1 MACs)
    return _matmul(_first_tensor(out_val).numel() * theta.shape[-1])


@_register("scatter_reduce")
def scatter_reduce(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str, *_: Any, **__: Any) -> OpCost:
    # each source element combined into its output position; the mean divides each output once
    return OpCost(src.numel() + (x.numel() if reduce == "mean" else 0))


@_register("_unique2", "unique_dim", "unique_consecutive")
def unique(x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> int:
    # sorted first (comparisons as sort's), then each element compared with its neighbour
    n = x.numel()
    return n * _log2(n) + n if n > 1 else 0


# Dense linear algebra, as LAPACK's algorithms count (Golub & Van Loan, Matrix Computations, one
# FLOP per floating-point add, multiply or divide), per matrix of the batch: n x n unless said.
def _square(a: torch.Tensor) -> tuple[int, int]:
    return math.prod(a.shape[:-2]), a.shape[-1]


def _tall(a: torch.Tensor) -> tuple[int, int, int]:
    """The batch, and an m x n matrix's dimensions in its tall orientation (m >= n)."""
    m, n = a.shape[-2:]
    return math.prod(a.shape[:-2]), max(m, n), min(m, n)


@_register("linalg_cholesky_ex", "cholesky")
def cholesky(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, n = _square(a)
    return OpCost(batch * n**3 // 3)


@_register("linalg_lu_factor_ex", "linalg_lu")
def lu_factor(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, m, n = _tall(a)
    return OpCost(batch * (m * n * n - n**3 // 3))  # 2n^3/3 for a square matrix


# a solve with a factored matrix: each right-hand side column costs n^2 per triangle, so 2n (LU) or n
# (one triangle) per element of the solution
def _factored_solve(matrix_at: int, triangles: int) -> Formula:
    """``matrix_at``: the factored matrix's argument (before or after the right-hand side)."""

    def formula(*args: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(triangles * args[matrix_at].shape[-1] * _first_tensor(out_val).numel())

    return formula


_set("linalg_lu_solve", _factored_solve(0, 2))
_set("lu_solve", _factored_solve(1, 2))
_set("linalg_solve_triangular", _factored_solve(0, 1))
_set("triangular_solve", _factored_solve(1, 1))


@_register("_linalg_solve_ex")
def solve(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, n = _square(a)
    return OpCost(batch * (2 * n**3 // 3) + 2 * n * _first_tensor(out_val).numel())  # LU, then the two triangles


@_register("linalg_inv_ex", "inverse")
def inverse(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, n = _square(a)
    return OpCost(batch * 2 * n**3)  # LU (2n^3/3) and the inverse from it (4n^3/3)


@_register("_linalg_det", "_linalg_slogdet", "logdet")
def determinant(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, n = _square(a)
    return OpCost(batch * (2 * n**3 // 3 + n))  # LU, then the product of the diagonal


# (what was computed is read from the outputs: PyTorch drops arguments equal to their defaults, and
# computes vectors it may need for a gradient, which it assumes whenever a dispatch mode is active)
@_register("linalg_qr")
def qr(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, m, n = _tall(a)
    q = out_val[0]
    r = 2 * n * n * (m - n // 3)  # Householder, 2n^2(m - n/3)
    if q.numel() == 0:  # mode="r"
        return OpCost(batch * r)
    complete = q.shape[-1] > n
    return OpCost(batch * (r + (4 * (m * m * n - m * n * n + n**3 // 3) if complete else r)))


# The matrix exponential (aten/src/ATen/native/LinearAlgebra.cpp, mexp): each matrix's 1-norm (an
# absolute value and an add per element, a compare per column) picks a Taylor polynomial of degree
# 1, 2, 4, 8, 12 or 18, which costs the matrix products and linear combinations of Bader, Blanes
# and Casas's scheme; a norm above the last bound scales the matrix down by 2^s (a divide per
# element), takes degree 18 and squares the result s times. The norm is a value: counted where the
# run has it. Per degree: (bound in float, in double), matrix products, other FLOPs per element.
_MATRIX_EXP_DEGREES = (
    ((1.192092800768788e-07, 2.220446049250313e-16), 0, 1),  # sum of {I, A}
    ((5.978858893805233e-04, 2.580956802971767e-08), 1, 3),  # a halving, sum of 3
    ((5.116619363445086e-02, 3.397168839976962e-04), 2, 12),  # combinations of 3 and 4
    ((5.800524627688768e-01, 4.991228871115323e-02), 3, 22),  # combinations of 2, 2, 4, 5
    ((1.461661507209034e00, 2.996158913811580e-01), 4, 31),  # 4 combinations of 4, 3 adds
    ((3.010066362817634e00, 1.090863719290036e00), 5, 48),  # 5 combinations of 5, 3 adds
)


@_from_values
def _matrix_1_norms(a: torch.Tensor) -> list[float]:
    return a.reshape(-1, *a.shape[-2:]).abs().sum(-2).amax(-1).tolist()


@_register("linalg_matrix_exp")
def matrix_exp(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost | None:
    n = a.shape[-1]
    if n <= 1:
        return OpCost(a.numel())  # an exp per element
    norms = _matrix_1_norms(a)
    if norms is None:
        return None
    single = a.dtype in (torch.float32, torch.complex64)
    bounds = [bound[0 if single else 1] for bound, _, _ in _MATRIX_EXP_DEGREES]
    products, other = 0, len(norms) * (2 * n * n + n)
    for norm in norms:
        for i, (_, degree_products, degree_other) in enumerate(_MATRIX_EXP_DEGREES[:-1]):
            if (bounds[i - 1] if i else -1.0) < norm <= bounds[i]:
                products, other = products + degree_products, other + degree_other * n * n
        if norm >= bounds[-2]:  # scaled by 2^s, degree 18, squared s times
            squarings = max(0, math.ceil(math.log2(norm / bounds[-1]))) if norm > 0 else 0
            products += _MATRIX_EXP_DEGREES[-1][1] + squarings
            other += (_MATRIX_EXP_DEGREES[-1][2] + 1) * n * n
    macs = products * n**3
    return OpCost(2 * macs + other, macs)


@_register("_linalg_eigh")
def eigh(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, n = _square(a)
    vectors = out_val[1].numel() > 0
    return OpCost(batch * (9 * n**3 if vectors else 4 * n**3 // 3))  # tridiagonal QR


@_register("linalg_eig", "_linalg_eigvals")
def eig(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, n = _square(a)
    vectors = isinstance(out_val, (tuple, list)) and len(out_val) > 1 and out_val[1].numel() > 0
    return OpCost(batch * (25 if vectors else 10) * n**3)  # Hessenberg QR


@_register("_linalg_svd")
def svd(a: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    batch, m, n = _tall(a)  # Golub-Kahan-Reinsch on the tall orientation
    u, vh = out_val[0], out_val[2]
    if u.numel() == 0:  # values only
        flops = 4 * m * n * n - 4 * n**3 // 3
    elif max(u.shape[-1], vh.shape[-2]) > n:  # full matrices
        flops = 4 * m * m * n + 8 * m * n * n + 9 * n**3
    else:
        flops = 14 * m * n * n + 8 * n**3
    return OpCost(batch * flops)


# torchvision's detection ops (torchvision/csrc/ops), found by name: counting them needs no import of
# torchvision. RoIAlign averages a grid of bilinear samples per output (4 weighted neighbours, 7,
# plus the accumulation, 1; one divide per output); its backward spreads each gradient over the same
# neighbours (4 multiplies and 4 adds per sample). The grid is sampling_ratio x sampling_ratio, or,
# adaptive (sampling_ratio <= 0), ceil(box side / output side) per box: read from the boxes where the
# run has their values, uncounted where it has not (an analytic run). RoIPool takes a window of whole
# pixels per output, the box's side split in equal bins (floor to ceil): its max compares each pixel
# once (its backward adds each gradient to its argmax); the position-sensitive kind averages them
# (an add per pixel and a divide; its backward a divide and an add per pixel). Their windows follow
# the boxes too, so they are counted from the boxes' values alone.
# NMS: the boxes sorted by score, their areas (3 each), and the IoU of every pair (12: 4 max/min,
# 2 extents clamped at 0, the intersection, the union, the ratio, as CUDA's kernel computes the full
# suppression mask). A deformable convolution: a convolution's MACs over columns sampled
# bilinearly at the offset positions (7 per column element, 2 to offset its coordinates, 1 to apply
# the mask), plus the bias; its backward, as a convolution's, twice its forward.
NAMED: dict[str, Formula] = {}
ROI_ALIGN_SAMPLE, NMS_PAIR = 8, 12


@_from_values
def _box_sides(rois: torch.Tensor, spatial_scale: float, shift: float) -> list[tuple[float, float]]:
    """Each box's (height, width) on the feature map, as the kernels compute them in the boxes' dtype
    (``rois``: K x 5, batch index then x1, y1, x2, y2); None where the run does not have the values."""
    corners = rois[:, 1:].to(torch.float64 if rois.dtype == torch.float64 else torch.float32)
    corners = corners * spatial_scale - shift
    sides = torch.stack([corners[:, 3] - corners[:, 1], corners[:, 2] - corners[:, 0]], 1)
    return [(h, w) for h, w in sides.tolist()]


def _roi_align(scale_at: int, sampling_at: int, backward: bool, position_sensitive: bool) -> Formula:
    # roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned),
    # ps_roi_align the same without aligned; their backward ops take the gradient first and the sizes
    # of the input, and, position-sensitive, the channel mapping after the boxes
    def formula(*args: Any, out_val: Any = None, **__: Any) -> OpCost | None:
        sampling_ratio = args[sampling_at]
        outputs = args[0] if backward else _first_tensor(out_val)
        if sampling_ratio > 0:
            return OpCost(outputs.numel() * (sampling_ratio**2 * ROI_ALIGN_SAMPLE + 1))
        scale, pooled_height, pooled_width = args[scale_at : scale_at + 3]
        aligned = not position_sensitive and bool(args[sampling_at + 1])
        sides = _box_sides(args[1], scale, 0.5 if aligned or position_sensitive else 0.0)
        if sides is None:
            return None
        samples = 0
        for h, w in sides:
            if not (aligned or position_sensitive):  # malformed boxes are forced to 1 x 1
                h, w = max(h, 1.0), max(w, 1.0)
            samples += max(math.ceil(h / pooled_height), 0) * max(math.ceil(w / pooled_width), 0)
        per_box = outputs.numel() // max(len(sides), 1)  # the outputs of one box
        return OpCost(per_box * (samples * ROI_ALIGN_SAMPLE + len(sides)))

    return formula


NAMED["torchvision.roi_align"] = _roi_align(2, 5, backward=False, position_sensitive=False)
NAMED["torchvision.ps_roi_align"] = _roi_align(2, 5, backward=False, position_sensitive=True)
NAMED["torchvision._roi_align_backward"] = _roi_align(2, 9, backward=True, position_sensitive=False)
NAMED["torchvision._ps_roi_align_backward"] = _roi_align(3, 6, backward=True, position_sensitive=True)


@_from_values
def _roi_windows(rois: torch.Tensor, spatial_scale: float, pooled: tuple[int, int], size: tuple[int, int], ends: int) -> list[int]:
    """The pixels of every RoIPool window, box by box (``ends``: 1 where a box's side counts both its end
    pixels, RoIPool's, 0 for the position-sensitive kind's); None where the run does not have the boxes."""
    dtype = torch.float64 if rois.dtype == torch.float64 else torch.float32
    scaled = rois[:, 1:].to(dtype) * spatial_scale
    corners = (torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)).long().tolist()  # C's round, half away from 0
    areas: list[int] = []
    for x1, y1, x2, y2 in corners:
        extents = []
        for start, end, bins, limit in ((y1, y2, pooled[0], size[0]), (x1, x2, pooled[1], size[1])):
            steps = torch.arange(bins + 1, dtype=dtype) * (torch.tensor(max(end - start + ends, 1), dtype=dtype) / bins)
            low = (torch.floor(steps[:-1]).long() + start).clamp(0, limit)
            high = (torch.ceil(steps[1:]).long() + start).clamp(0, limit)
            extents.append((high - low).clamp(min=0))
        areas += (extents[0][:, None] * extents[1][None, :]).flatten().tolist()
    return areas


def _roi_pool(backward: bool, position_sensitive: bool) -> Formula:
    # roi_pool(input, rois, spatial_scale, pooled_height, pooled_width), ps_roi_pool alike; their
    # backward ops: (grad, rois, argmax or channel mapping, spatial_scale, pooled_height, pooled_width,
    # batch, channels, height, width)
    def formula(*args: Any, out_val: Any = None, **__: Any) -> OpCost | None:
        at = 3 if backward else 2
        pooled = (args[at + 1], args[at + 2])
        size = (args[at + 5], args[at + 6]) if backward else (args[0].shape[-2], args[0].shape[-1])
        areas = _roi_windows(args[1], args[at], pooled, size, ends=0 if position_sensitive else 1)
        if areas is None:
            return None
        outputs = args[0] if backward else _first_tensor(out_val)
        channels = outputs.numel() // max(len(areas), 1)  # the outputs of one window
        filled = sum(1 for area in areas if area > 0)
        if position_sensitive:  # an add per pixel and a divide per window, both ways
            return OpCost(channels * (sum(areas) + filled))
        # forward, a compare per pixel; backward, an add per window, to its argmax
        return OpCost(channels * (filled if backward else sum(areas)))

    return formula


NAMED["torchvision.roi_pool"] = _roi_pool(backward=False, position_sensitive=False)
NAMED["torchvision.ps_roi_pool"] = _roi_pool(backward=False, position_sensitive=True)
NAMED["torchvision._roi_pool_backward"] = _roi_pool(backward=True, position_sensitive=False)
NAMED["torchvision._ps_roi_pool_backward"] = _roi_pool(backward=True, position_sensitive=True)


def _nms(boxes: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    n = boxes.shape[0]
    return OpCost(n * _log2(n) + 3 * n + NMS_PAIR * (n * (n - 1) // 2) if n > 1 else 3 * n)


NAMED["torchvision.nms"] = _nms


def _deform_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor,
    bias: torch.Tensor,
    *args: Any,
    out_val: Any = None,
    **__: Any,
) -> OpCost:
    out = _first_tensor(out_val)
    macs = conv_macs(weight.shape, out.shape[0], out.shape[2:])
    columns = out.shape[0] * x.shape[1] * weight.shape[2] * weight.shape[3] * out.shape[2] * out.shape[3]
    use_mask = bool(args[-1])
    return OpCost(2 * macs + columns * (7 + 2 + int(use_mask)) + (out.numel() if bias.numel() else 0), macs)


def _deform_conv2d_backward(grad: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
    # (grad, then the forward's arguments): twice the forward, whose output has the gradient's shape
    forward = _deform_conv2d(*args, out_val=grad, **kwargs)
    return OpCost(2 * forward.flops, 2 * forward.macs)


NAMED["torchvision.deform_conv2d"] = _deform_conv2d
NAMED["torchvision._deform_conv2d_backward"] = _deform_conv2d_backward


# searchsorted, bucketize: a binary search of each value over the sorted boundaries
@_register("searchsorted")
def searchsorted(sorted_sequence: torch.Tensor, values: Any, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(_first_tensor(out_val).numel() * _log2(sorted_sequence.shape[-1] + 1))


@_register("bucketize")
def bucketize(values: Any, boundaries: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(_first_tensor(out_val).numel() * _log2(boundaries.shape[-1] + 1))


# weight normalisation, w = g * v / ||v|| (a norm per slice along ``dim``): per element of v a
# square and an add for the norm and a multiply, per norm a root and a divide; its backward, per
# element 2 for grad_g (multiply, add) and 3 for grad_v (v times a scale, subtract, multiply), per
# norm 3 divides.
@_register("_weight_norm_interface")
def weight_norm(v: torch.Tensor, g: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(3 * v.numel() + 2 * g.numel())


@_register("_weight_norm_interface_backward")
def weight_norm_backward(grad_w: torch.Tensor, v: torch.Tensor, g: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(5 * v.numel() + 3 * g.numel())


# losses: FLOPs per input element, reduction included
_LOSSES = {
    "mse_loss": 3,  # subtract, square, reduce
    "l1_loss": 3,
    "smooth_l1_loss": 4,
    "huber_loss": 4,
    "binary_cross_entropy": 8,  # -(t log x + (1-t) log(1-x)), reduce
    "binary_cross_entropy_with_logits": 8,
    "soft_margin_loss": 4,
}
# their backward ops take (grad_output, input, target, ...): per input element
_LOSS_BACKWARDS = {
    "mse_loss_backward": 3,  # (x - t) * 2 * g / n
    "smooth_l1_loss_backward": 3,
    "huber_loss_backward": 3,
    "binary_cross_entropy_backward": 5,  # g * (x - t) / (x (1 - x))
    "soft_margin_loss_backward": 4,
}


def _loss_backward(per_element: int) -> Formula:
    def formula(grad_out: torch.Tensor, x: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
        return OpCost(per_element * x.numel())

    return formula


# Margin losses over classes (aten/src/ATen/native/LossMulti*.cpp), per sample of C scores. The
# multi-class margin loss: each non-target class j a hinge z = margin - x[y] + x[j] (2), its test
# (1), a square for p = 2, the weight, the sum (1); a divide per sample and the reduction. Its
# backward: the same hinge and test, the gradient (2 for p = 2: 2 g z), the weight, an update of the
# target's gradient (1), then a multiply by the incoming gradient per score. The multi-label one:
# the hinge of every (listed target, non-target class) pair (z, test, sum: 4; backward: z, test and
# two updates: 5), pairs that the target lists (read where the run has their values) decide.
def _scores(x: torch.Tensor) -> tuple[int, int]:
    """A margin loss's samples and classes per sample."""
    classes = x.shape[-1] if x.dim() else 1
    return x.numel() // max(classes, 1), classes


def _multi_margin(backward: bool) -> Formula:
    packet = aten.multi_margin_loss_backward if backward else aten.multi_margin_loss

    def formula(*args: Any, out_val: Any = None, **kwargs: Any) -> OpCost:
        bound = bound_arguments(packet.default, args, kwargs)
        samples, classes = _scores(bound["self"])
        square, weighted = bound["p"] == 2, bound["weight"] is not None
        if backward:
            return OpCost(samples * (classes - 1) * (4 + 2 * square + weighted) + bound["self"].numel())
        return OpCost(samples * (classes - 1) * (4 + square + weighted) + samples + (samples if bound["reduction"] else 0))

    return formula


_set("multi_margin_loss", _multi_margin(backward=False))
_set("multi_margin_loss_backward", _multi_margin(backward=True))


@_from_values
def _label_pairs(target: torch.Tensor) -> int:
    """(listed target, non-target class) pairs of a multi-label margin loss: a sample's targets are its
    row's class indices up to the first negative one; None where the run does not have the values."""
    pairs = 0
    for row in target.reshape(-1, target.shape[-1] if target.dim() else 1).tolist():
        listed = row[: next((i for i, c in enumerate(row) if c < 0), len(row))]
        pairs += len(listed) * (len(row) - len(set(listed)))
    return pairs


@_register("multilabel_margin_loss_forward")
def multilabel_margin_loss(x: torch.Tensor, target: torch.Tensor, *args: Any, out_val: Any = None, **kwargs: Any) -> OpCost | None:
    pairs = _label_pairs(target)
    if pairs is None:
        return None
    samples, _ = _scores(x)
    reduced = bound_arguments(aten.multilabel_margin_loss_forward.default, (x, target, *args), kwargs)["reduction"]
    return OpCost(4 * pairs + samples + (samples if reduced else 0))


@_register("multilabel_margin_loss_backward")
def multilabel_margin_loss_backward(
    grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, *_: Any, out_val: Any = None, **__: Any
) -> OpCost | None:
    pairs = _label_pairs(target)
    return None if pairs is None else OpCost(5 * pairs + x.numel())


for _name, _per_element in _LOSSES.items():
    _set(_name, _reduction(_per_element))
for _name, _per_element in _LOSS_BACKWARDS.items():
    _set(_name, _loss_backward(_per_element))


@_register("nll_loss_forward", "nll_loss2d_forward")
def nll_loss(x: torch.Tensor, target: torch.Tensor, weight: Any = None, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    # one gathered value per target, summed (and weighted)
    return OpCost(target.numel() * (1 + int(weight is not None)))


@_register("nll_loss_backward", "nll_loss2d_backward")
def nll_loss_backward(grad_out: torch.Tensor, x: torch.Tensor, target: torch.Tensor, *_: Any, out_val: Any = None, **__: Any) -> OpCost:
    return OpCost(target.numel())


# ---------------------------------------------------------------- zero-FLOP ops


# Data movement, tensor creation and random numbers: counted, at 0 FLOPs.
@_register("index_add", "index_add_", "scatter_add", "scatter_add_")
def indexed_add(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *, out_val: Any = None, alpha: Any = 1) -> OpCost:
    # each element of source (index_add; scatter_add's src) is added into the output: 1 add, and
    # a multiply where index_add scales it (alpha != 1)
    return OpCost(source.numel() * (1 + int(alpha != 1)))


DATA_MOVEMENT_NAMES = """
view _unsafe_view reshape _reshape_alias expand expand_as permute transpose t squeeze unsqueeze
slice select as_strided alias detach split split_with_sizes unsafe_split unsafe_split_with_sizes
chunk unbind narrow unfold view_as_real view_as_complex _conj _neg_view lift_fresh
clone copy _copy_from _copy_from_and_resize _to_copy contiguous cat stack hstack vstack flip roll
index index_select gather scatter masked_select masked_scatter index_put _index_put_impl take
_unsafe_index _unsafe_index_put repeat repeat_interleave tile constant_pad_nd reflection_pad1d
reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d replication_pad3d
embedding upsample_nearest1d upsample_nearest2d upsample_nearest3d _upsample_nearest_exact1d
_upsample_nearest_exact2d _upsample_nearest_exact3d masked_fill where fill zero empty empty_like
empty_strided new_empty new_empty_strided zeros zeros_like new_zeros ones ones_like new_ones
full full_like new_full scalar_tensor arange linspace eye tril triu one_hot pixel_shuffle
pixel_unshuffle channel_shuffle native_channel_shuffle im2col _local_scalar_dense item
bernoulli rand rand_like randn randn_like randint randint_like randperm normal uniform
_fused_dropout resize_ set_ select_backward slice_backward diagonal diag_embed diagonal_backward
select_scatter slice_scatter diagonal_scatter as_strided_scatter diagonal_copy narrow_copy unbind_copy
as_strided_copy
expand_copy permute_copy view_copy transpose_copy t_copy unsqueeze_copy squeeze_copy
select_copy slice_copy split_copy alias_copy detach_copy _assert_async _assert_tensor_metadata
_functional_assert_async sym_constrain_range_for_size lift lift_fresh_copy _has_compatible_shallow_copy_type
_nested_tensor_from_mask _nested_tensor_from_mask_left_aligned to_padded_tensor _nested_from_padded _foreach_copy
hann_window hamming_window blackman_window bartlett_window kaiser_window exponential geometric cauchy
log_normal random multinomial max_unpool2d max_unpool3d _sparse_coo_tensor_with_dims_and_tensors
_sparse_coo_tensor_unsafe sparse_coo_tensor _coalesce coalesce _indices _values indices values
_pack_padded_sequence _pack_padded_sequence_backward _pad_packed_sequence
""".split()

DATA_MOVEMENT: frozenset[Any] = frozenset(
    packet for name in DATA_MOVEMENT_NAMES for suffix in ("", "_") if (packet := _op(name + suffix)) is not None
)

# Collectives and FSDP2's copies in and out of its all-gather buffers: data moved, 0 FLOPs
# (what a collective moves is the collective meter's: meters/collectives.py)
COMMUNICATION_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "fsdp"})

# Shape and metadata queries: not computation, not even listed.
METADATA = frozenset(
    {
        aten.sym_is_contiguous.default if hasattr(aten, "sym_is_contiguous") else aten.is_contiguous.default,
        aten.is_contiguous.default,
        aten.is_contiguous.memory_format,
        aten.is_strides_like_format.default,
        aten.is_non_overlapping_and_dense.default,
        aten.size.default,
        aten.sym_size.default,
        aten.stride.default,
        aten.sym_stride.default,
        aten.storage_offset.default,
        aten.sym_storage_offset.default,
        aten.numel.default,
        aten.sym_numel.default,
        aten.dim.default,
        aten.is_same_size.default,
        torch.ops.prim.layout.default,
        torch.ops.prim.device.default,
        # record_function markers (optimizers emit them): profiler bookkeeping
        *(
            overload
            for name in ("_record_function_enter", "_record_function_enter_new", "_record_function_exit")
            if (packet := getattr(torch.ops.profiler, name, None)) is not None
            for overload in (getattr(packet, o) for o in packet.overloads())
        ),
        aten._linalg_check_errors.default,  # LAPACK's info codes checked: not computation
        # which kernel CTC takes on CUDA: a question answered, not a computation
        *(
            overload
            for name in ("_use_cudnn_ctc_loss", "_use_miopen_ctc_loss")
            if (packet := getattr(aten, name, None)) is not None
            for overload in (getattr(packet, o) for o in packet.overloads())
        ),
    }
)
