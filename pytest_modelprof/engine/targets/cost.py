"""Predicted time of each kernel on a target GPU, and of the step: a calibrated roofline.

Each op that launches a kernel costs the larger of its compute time (its FLOPs over the
GPU's peak for the math it runs, times an efficiency for its kind of kernel) and its
memory time (bytes read and written over the memory bandwidth, times an efficiency),
and at least a kernel's minimum duration. The math: matrix products, convolutions,
attention and recurrent kernels run on tensor cores in bfloat16/float16, and in float32
on TF32 tensor cores where PyTorch allows it (``torch.backends.cudnn.allow_tf32``, on by
default, for convolutions and cuDNN; ``torch.backends.cuda.matmul.allow_tf32``, off by
default, for matrix products); quantized products on their operands' math, fp8 or int8 tensor
cores (:func:`math_peak`); everything else runs on CUDA cores.

Three shapes of work change how close a kernel comes to its peak. A matrix product on
tensor cores (:func:`gemms_of`: a convolution's implicit product, attention per head, a
recurrent layer's steps) reaches less of it the fewer its rows, columns and reduction
(:func:`shape_efficiency`); a library's product whose output would not fill the GPU's SMs
is split along a long reduction first (:func:`split_k`), and a convolution's backward
pass (cuDNN's own kernels for the two gradients) has an efficiency of its own. A
normalisation goes over its data more than once and, where it runs only a few independent
reductions (batch norm's channels), is bound by them rather than by the bandwidth
(:func:`norm_work`). A convolution with few input channels per group
(depthwise, or a first layer on RGB pixels) runs off the tensor cores (``conv_narrow``).

The step is simulated on two clocks, as eager PyTorch runs it: the host issues ops one
after another (a fixed overhead per op), the GPU runs each kernel once issued and once
the previous one is done, and a read of a value on the host (``.item()``) waits for the
GPU. Not modelled: overlap with other work, several streams, data loading, and the
first step's one-off costs (cuDNN plans, allocations from the driver).

:data:`~.gpus.UNCALIBRATED` holds round, physically plausible defaults; a GPU's
:class:`~.gpus.Calibration`, fitted to measured kernel times, replaces them
(``benchmarks/predicted_vs_h100.py`` fits one on ``pytest_modelprof/data/gpu-truth/h100.json``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal, NamedTuple

import torch

from ..ops import REGISTRY
from .gpus import Calibration, GPUSpec

Kind = Literal[
    "matmul", "conv", "conv_backward", "conv_narrow", "conv_narrow_backward", "attention", "rnn", "norm", "norm_backward", "memory", "none"
]
Bound = Literal["compute", "memory", "launch"]
KINDS: tuple[Kind, ...] = (
    "matmul",
    "conv",
    "conv_backward",
    "conv_narrow",
    "conv_narrow_backward",
    "attention",
    "rnn",
    "norm",
    "norm_backward",
    "memory",
)  # the kinds of kernels, each with its efficiency ("none": no kernel)
COMPUTE_KINDS = frozenset({"matmul", "conv", "conv_backward", "attention", "rnn"})  # on tensor cores

# the op registry's kernels (:attr:`~..ops.OpInfo.kernel`) by op name, those of the kind "memory" left out
KIND_OF: dict[str, Kind] = {info.name: info.kernel for info in REGISTRY.values() if info.kernel != "memory"}
SYNCHRONIZING = frozenset(info.name for info in REGISTRY.values() if info.synchronizing)


def kind_of(name: str, args: tuple[object, ...] = ()) -> Kind:
    """The kind of kernel an op (``"aten.mm"``) runs with these arguments; ``"memory"`` for every
    other op with a kernel. A convolution's backward pass runs other kernels than its forward
    (``"conv_backward"``: the input's gradient, and the weight's, reduced over every pixel); one
    with fewer than :data:`NARROW_CHANNELS` input channels per group (depthwise convolutions, a
    network's first on RGB pixels) is ``"conv_narrow"`` (``"conv_narrow_backward"``): off the
    tensor cores, and far below the memory's bandwidth; a product with a vector (``mv``, ``dot``)
    is bound by memory."""
    kind = KIND_OF.get(name, "memory")
    if kind == "conv":
        weight = _tensor(_arg(args, 2 if name == "aten.convolution_backward" else 1))
        if weight is not None and weight.dim() > 2 and conv_channels(name, args, weight)[0] < NARROW_CHANNELS:
            kind = "conv_narrow"
    elif kind == "matmul" and name.removeprefix("aten.").rstrip("_") in ("mv", "addmv", "dot", "vdot"):
        kind = "memory"
    if kind in ("conv", "conv_narrow") and name.endswith("_backward"):
        return "conv_backward" if kind == "conv" else "conv_narrow_backward"
    return kind


# ops whose math is not that of their floating tensors (:attr:`~..ops.OpInfo.math`): the integer products
MATH_OF: dict[str, torch.dtype] = {info.name: info.math for info in REGISTRY.values() if info.math is not None}
# the tensor cores' narrow math, by operand dtype: fp8 (e4m3 and e5m2, and AMD's fnuz forms) and int8
NARROW_MATH: dict[torch.dtype, str] = {
    **{
        getattr(torch, name): "float8"
        for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
        if hasattr(torch, name)
    },
    torch.int8: "int8",
}


def math_peak(gpu: GPUSpec, kind: Kind, dtype: torch.dtype) -> float:
    """The peak FLOP/s of the math an op of ``kind`` runs in ``dtype`` on ``gpu``. On tensor cores, fp8 and
    int8 operands run at the GPU's ``float8`` and ``int8`` peaks; a GPU without them (the A100 and A10G
    have no fp8, where PyTorch's ``_scaled_mm`` refuses to run) at its 16-bit peak, as if the operands were
    widened to float16."""
    narrow = NARROW_MATH.get(dtype) if kind in COMPUTE_KINDS else None
    if narrow is not None:
        if narrow in gpu.peak_flops:
            return gpu.peak_flops[narrow]
        dtype = torch.float16
    if dtype in (torch.bfloat16, torch.float16):
        name = str(dtype).removeprefix("torch.")
        if kind in COMPUTE_KINDS and name in gpu.peak_flops:
            return gpu.peak_flops[name]
        return gpu.peak_flops.get("float32", max(gpu.peak_flops.values()))
    if dtype == torch.float64:
        return gpu.peak_flops.get("float64", gpu.peak_flops.get("float32", 1.0))
    cudnn = kind in ("conv", "conv_backward", "rnn")
    tf32 = (kind == "matmul" and torch.backends.cuda.matmul.allow_tf32) or (cudnn and torch.backends.cudnn.allow_tf32)
    if tf32 and "tf32" in gpu.peak_flops:
        return gpu.peak_flops["tf32"]
    return gpu.peak_flops.get("float32", max(gpu.peak_flops.values()))


class Work(NamedTuple):
    """What the cost model needs of one op (:func:`..meters.predicted.op_features` reads it off the op)."""

    name: str  # "aten.mm"
    kind: Kind
    flops: int
    bytes: int  # read and written once each
    dtype: torch.dtype
    kernels: int = 1
    gemms: tuple[Gemm, ...] = ()  # the matrix products it runs on tensor cores (see :func:`gemms_of`)
    passes: float = 1.0  # times a normalisation goes over its data, relative to ``bytes`` once
    reductions: int = 0  # independent reductions a normalisation runs side by side; 0: not what limits it
    on_device: bool = True  # False: all its tensors are on the host (Adam's step counts): no kernel


class Gemm(NamedTuple):
    """One matrix product of an op, (m x k) @ (k x n) (independent products of a batch or of groups
    side by side count in m), and its share of the op's FLOPs."""

    m: int
    n: int
    k: int
    share: float = 1.0


SPLIT_KINDS = frozenset({"matmul", "conv", "conv_backward"})  # cuBLAS's and cuDNN's products, split-K where it pays
SPLIT_TILE = 128  # rows and columns of the output tile one SM computes
SPLIT_LENGTH = 256  # the shortest reduction a split of a product's reduction is given


def split_k(gemm: Gemm, sms: int) -> Gemm:
    """The product as the GPU runs it: one whose output has fewer :data:`SPLIT_TILE`-square tiles than
    the GPU has SMs, and a long reduction, is split along the reduction (split-K: each split on an
    SM of its own, their partial sums added after) into as many splits as fill the SMs, none shorter
    than :data:`SPLIT_LENGTH`; a convolution's weight gradient (a few channels, reduced over every
    pixel of the batch) is one such product."""
    fill = sms * SPLIT_TILE * SPLIT_TILE
    if gemm.m * gemm.n >= fill or gemm.k < 2 * SPLIT_LENGTH:
        return gemm
    splits = max(1, min(gemm.k // SPLIT_LENGTH, math.ceil(fill / max(1, gemm.m * gemm.n))))
    return Gemm(gemm.m * splits, gemm.n, gemm.k // splits, gemm.share)


def shape_efficiency(gemm: Gemm, half: Mapping[str, float], sms: int = 0) -> float:
    """The fraction of a kind's full efficiency that a matrix product of this shape reaches on a GPU of
    ``sms`` SMs (0: not split, see :func:`split_k`): in each dimension ``d / (d + half[dim])``, a
    product with few rows, columns or a short reduction filling fewer of the tensor cores' tiles and
    pipelining less (``half``: a calibration's ``gemm_half``)."""
    if sms:
        gemm = split_k(gemm, sms)
    factor = 1.0
    for size, dim in ((gemm.m, "m"), (gemm.n, "n"), (gemm.k, "k")):
        h = half.get(dim, 0.0)
        factor *= size / (size + h) if size > 0 else 1.0
    return factor


def kernel_seconds(gpu: GPUSpec, calibration: Calibration, work: Work) -> tuple[float, Bound]:
    """The predicted time of one op's kernels, and what bounds it (see the module's notes)."""
    efficiency = calibration.efficiency
    kind = work.kind
    bandwidth = gpu.bandwidth * efficiency["memory"]
    if kind in COMPUTE_KINDS:
        peak = math_peak(gpu, kind, MATH_OF.get(work.name, work.dtype)) * efficiency.get(kind, 1.0)
        if work.gemms:
            # library products are split along long reductions; attention and recurrent kernels schedule their own
            half, sms = calibration.gemm_half, gpu.sm_count if kind in SPLIT_KINDS else 0
            compute = sum(work.flops * g.share / (peak * shape_efficiency(g, half, sms)) for g in work.gemms)
        else:
            compute = work.flops / peak
        memory = work.bytes / bandwidth
    else:
        compute = work.flops / (math_peak(gpu, kind, work.dtype) * efficiency.get("cuda_cores", 1.0)) if work.flops else 0.0
        rate = gpu.bandwidth * efficiency.get(kind, efficiency["memory"])
        per_reduction = calibration.reduction_bandwidth.get(kind, 0.0)
        if work.reductions and per_reduction:
            rate = min(rate, work.reductions * per_reduction)
        memory = work.bytes * work.passes / rate
    floor = calibration.kernel_seconds * work.kernels
    seconds = max(compute, memory, floor)
    if seconds == floor and floor > max(compute, memory):
        return seconds, "launch"
    return seconds, "compute" if compute >= memory else "memory"


def _tensor(value: object) -> torch.Tensor | None:
    return value if isinstance(value, torch.Tensor) else None


def _arg(args: tuple[object, ...], index: int, default: object = None) -> object:
    return args[index] if len(args) > index else default


# where convolution ops keep their groups
_CONV_GROUPS = {"aten.convolution": 8, "aten._convolution": 8, "aten.cudnn_convolution": 5, "aten.convolution_backward": 9}
NARROW_CHANNELS = 8  # a convolution with fewer input channels per group runs off the tensor cores


def conv_channels(name: str, args: tuple[object, ...], weight: torch.Tensor) -> tuple[int, int, int]:
    """A convolution's input and output channels per group, and its groups (a transposed
    convolution's weight holds input channels first)."""
    groups = _arg(args, _CONV_GROUPS.get(name, 8), 1)
    groups = groups if isinstance(groups, int) and groups > 0 else 1
    transposed = name != "aten.cudnn_convolution" and _arg(args, 7 if name == "aten.convolution_backward" else 6) is True
    if transposed:
        return weight.shape[0] // groups, weight.shape[1], groups
    return weight.shape[1], weight.shape[0] // groups, groups


_QUANTIZED_PRODUCTS = frozenset({"_int_mm", "_scaled_mm", "_scaled_mm_v2", "_weight_int4pack_mm", "_weight_int4pack_mm_for_cpu"})


def gemms_of(name: str, args: tuple[object, ...], out: object) -> tuple[Gemm, ...]:
    """The matrix products behind an op on tensor cores, by shape (empty where its shape is not known
    to this function: the kind's efficiency alone applies). A convolution is an implicit product
    (rows: output pixels, columns: output channels, reduction: input channels x kernel), its
    backward one for the input's gradient and one for the weight's; attention a product per
    head (queries x keys x head size); a recurrent layer its input projection over all steps and
    one recurrent product per step (rows: the batch)."""
    base = name.removeprefix("aten.").rstrip("_")
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if base in ("mm", "addmm", "_addmm_activation", "bmm", "baddbmm") and len(tensors) >= 2:
        a, b = tensors[-2], tensors[-1]
        if a.dim() < 2 or b.dim() < 2:
            return ()
        batch = a.shape[0] if a.dim() == 3 else 1
        return (Gemm(batch * a.shape[-2], b.shape[-1], a.shape[-1]),)
    if base in ("convolution", "_convolution", "cudnn_convolution", "convolution_backward"):
        return _conv_gemms(name, args, out)
    if base in _QUANTIZED_PRODUCTS:
        # the first operand and the output give the shape: the weight may be packed, the tensors after it are scales
        operand, y = _tensor(_arg(args, 0)), _tensor(out)
        if operand is None or y is None or y.dim() != 2 or y.shape[0] == 0:
            return ()
        return (Gemm(y.shape[0], y.shape[1], operand.numel() // y.shape[0]),)
    if "attention" in base and len(tensors) >= 3:
        q, k = (tensors[1], tensors[2]) if base.endswith("backward") else (tensors[0], tensors[1])
        if q.dim() != 4 or k.dim() != 4 or not base.startswith("_scaled_dot_product"):
            return ()
        batch_heads = q.shape[0] * q.shape[1]
        return (Gemm(batch_heads * q.shape[2], k.shape[2], q.shape[3]),)
    if base in ("_cudnn_rnn", "_cudnn_rnn_backward"):
        return _rnn_gemms(name, args)
    return ()


def _conv_gemms(name: str, args: tuple[object, ...], out: object) -> tuple[Gemm, ...]:
    backward = name == "aten.convolution_backward"
    if backward:
        y, x, weight = (_tensor(_arg(args, i)) for i in (0, 1, 2))
    else:
        x, weight = _tensor(_arg(args, 0)), _tensor(_arg(args, 1))
        y = _tensor(out)
    if x is None or weight is None or y is None or x.dim() < 3 or y.dim() < 3:
        return ()
    in_per_group, out_per_group, groups = conv_channels(name, args, weight)
    kernel = math.prod(weight.shape[2:])
    pixels_out = y.shape[0] * math.prod(y.shape[2:])
    pixels_in = x.shape[0] * math.prod(x.shape[2:])
    if not backward:
        return (Gemm(pixels_out * groups, out_per_group, in_per_group * kernel),)
    mask = _arg(args, 10)
    mask = mask if isinstance(mask, (list, tuple)) and len(mask) > 1 else (True, True)
    parts = []
    if mask[0]:  # the input's gradient: a product over the output's gradient
        parts.append(Gemm(pixels_in * groups, in_per_group, out_per_group * kernel))
    if mask[1]:  # the weight's: reduced over every pixel of the batch
        parts.append(Gemm(out_per_group * groups, in_per_group * kernel, pixels_out))
    return tuple(Gemm(g.m, g.n, g.k, 1 / len(parts)) for g in parts)


def _rnn_gemms(name: str, args: tuple[object, ...]) -> tuple[Gemm, ...]:
    x, weights, stride = _tensor(_arg(args, 0)), _arg(args, 1), _arg(args, 2)
    if x is None or x.dim() != 3 or not isinstance(weights, (list, tuple)) or not isinstance(stride, int) or stride < 2:
        return ()
    batch_first = _arg(args, 14 if name.endswith("_backward") else 10) is True
    batch, steps = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    gemms = []
    for start in range(0, len(weights) - 1, stride):
        w_ih, w_hh = weights[start], weights[start + 1]
        if not isinstance(w_ih, torch.Tensor) or not isinstance(w_hh, torch.Tensor):
            return ()
        gemms.append(Gemm(batch * steps, w_ih.shape[0], w_ih.shape[1], float(w_ih.numel())))  # every step at once
        gemms.append(Gemm(batch, w_hh.shape[0], w_hh.shape[1], float(w_hh.numel())))  # one step after another
    total = sum(g.share for g in gemms)
    return tuple(Gemm(g.m, g.n, g.k, g.share / total) for g in gemms)


def rnn_kernels(name: str, args: tuple[object, ...]) -> int:
    """Kernels a cuDNN recurrent op runs: one per step, layer and direction (its recurrence is sequential)."""
    x = args[0]
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        return 1
    backward = name.endswith("_backward")
    layers = args[13 if backward else 9]
    batch_first = args[14 if backward else 10]
    bidirectional = args[17 if backward else 13]
    steps = int(x.shape[1] if batch_first and x.dim() == 3 else x.shape[0])
    return steps * (layers if isinstance(layers, int) else 1) * (2 if bidirectional else 1)


_BATCH_NORM_EVAL = frozenset(
    {"aten._native_batch_norm_legit_no_training", "aten._batch_norm_no_update"}
)  # inference batch norm: running statistics, one pass
PLANE_THREADS = 256  # inference batch norm's threads per plane (one sample's channel)


def norm_work(name: str, args: tuple[object, ...]) -> tuple[float, int]:
    """How a normalisation goes over its data: the passes relative to reading its inputs and
    writing its outputs once, and how many independent reductions it runs side by side (0: none
    that limits it).

    A forward pass that computes statistics reads its input twice (statistics, then normalise:
    3 passes for 2), a backward pass reduces twice more (5 passes for 3). Batch norm in training
    reduces each channel over the whole batch: as many reductions as channels; layer, group and
    RMS norm reduce rows or groups. Inference batch norm normalises only, elementwise, one plane
    (a sample's channel) per block of :data:`PLANE_THREADS` threads: a plane with fewer pixels
    leaves threads idle."""
    x = _tensor(_arg(args, 1 if name.endswith("_backward") else 0))
    if x is None or x.dim() < 2:
        return 1.0, 0
    backward = name.endswith("_backward")
    passes = 5 / 3 if backward else 1.5
    if "batch_norm" in name:
        training = _arg(args, 7 if backward else 5, True) if name != "aten.cudnn_batch_norm_backward" else True
        if name in _BATCH_NORM_EVAL or training is False:
            pixels = math.prod(x.shape[2:])
            return max(1.0, PLANE_THREADS / pixels) if pixels else 1.0, 0
        return passes, int(x.shape[1])
    if "group_norm" in name:
        groups = _arg(args, 8 if backward else 6, 1)
        return passes, int(x.shape[0]) * (groups if isinstance(groups, int) and groups > 0 else 1)
    normalized = _arg(args, 2 if backward else 1, ())  # layer norm, RMS norm: rows of the trailing dimensions
    inner = math.prod(normalized) if isinstance(normalized, (list, tuple)) else x.shape[-1]
    return passes, max(1, x.numel() // max(1, inner))


def foreach_kernels(tensors: int) -> int:
    """Kernels a foreach op launches over ``tensors`` tensors (multi_tensor_apply's chunks)."""
    return max(1, math.ceil(tensors / 48))


class StepClock:
    """The host and the GPU through one step: :meth:`issue` each op in order (see the module's notes)."""

    def __init__(self, gpu: GPUSpec, calibration: Calibration | None = None) -> None:
        self.gpu = gpu
        self.calibration = calibration or gpu.calibration
        self.host = 0.0  # when the host has issued the ops so far
        self.device = 0.0  # when the GPU is done with the kernels issued so far
        self.busy = 0.0  # the GPU's time running kernels

    def issue(self, work: Work) -> tuple[float, Bound]:
        """One op: its kernels' predicted seconds and their bound (0 and "launch" for an op without one)."""
        calibration = self.calibration
        seconds: float = 0.0
        bound: Bound = "launch"
        if work.kind == "none":
            self.host += calibration.view_seconds
        elif not work.on_device:
            self.host += calibration.host_seconds
        else:
            seconds, bound = kernel_seconds(self.gpu, calibration, work)
            self.host += calibration.host_seconds
            self.device = max(self.host, self.device) + seconds
            self.busy += seconds
        if work.name in SYNCHRONIZING and work.on_device:  # the host waits for a value on the GPU
            self.host = max(self.host, self.device)
        return seconds, bound

    @property
    def seconds(self) -> float:
        return max(self.host, self.device)


# Collectives of a sharded step (uncalibrated round figures: no multi-GPU measurement yet)
LINK_EFFICIENCY = 0.8  # the bus bandwidth NCCL's rings reach, over the link's
COLLECTIVE_LATENCY = 20e-6  # seconds a collective call takes beyond moving its bytes


def collective_seconds(gpu: GPUSpec, calls: int, bus_bytes: float, nodes: int) -> float | None:
    """Predicted seconds of ``calls`` collectives moving ``bus_bytes`` per rank on a ring (NCCL's bus
    bytes) over ``gpu``'s links: NVLink/PCIe (``interconnect``) within a node, ``network`` across
    nodes; None where the spec has no bandwidth for that link."""
    bandwidth = gpu.interconnect if nodes <= 1 else gpu.network
    if bandwidth <= 0:
        return None
    return calls * COLLECTIVE_LATENCY + bus_bytes / (bandwidth * LINK_EFFICIENCY)
