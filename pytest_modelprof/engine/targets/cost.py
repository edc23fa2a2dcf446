"""Predicted time of each kernel on a target GPU, and of the step: a calibrated roofline.

Each op that launches a kernel costs the larger of its compute time (its FLOPs over the
GPU's peak for the math it runs, times an efficiency for its kind of kernel) and its
memory time (bytes read and written over the memory bandwidth, times an efficiency),
and at least a kernel's minimum duration. The math: matrix products, convolutions,
attention and recurrent kernels run on tensor cores in bfloat16/float16, and in float32
on TF32 tensor cores where PyTorch allows it (``torch.backends.cudnn.allow_tf32``, on by
default, for convolutions and cuDNN; ``torch.backends.cuda.matmul.allow_tf32``, off by
default, for matrix products); everything else runs on CUDA cores.

The step is simulated on two clocks, as eager PyTorch runs it: the host issues ops one
after another (a fixed overhead per op), the GPU runs each kernel once issued and once
the previous one is done, and a read of a value on the host (``.item()``) waits for the
GPU. Not modelled: overlap with other work, several streams, data loading, and the
first step's one-off costs (cuDNN plans, allocations from the driver).

:data:`~.gpus.UNCALIBRATED` holds round, physically plausible defaults; a GPU's
:class:`~.gpus.Calibration`, fitted to measured kernel times, replaces them
(``benchmarks/predicted_vs_h100.py`` fits one on ``../shared/gpu-truth/h100.json``).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from .gpus import Calibration, GPUSpec

Kind = Literal["matmul", "conv", "conv_grouped", "attention", "rnn", "norm", "norm_backward", "memory", "none"]
Bound = Literal["compute", "memory", "launch"]
KINDS: tuple[Kind, ...] = ("matmul", "conv", "conv_grouped", "attention", "rnn", "norm", "norm_backward", "memory")
COMPUTE_KINDS = frozenset({"matmul", "conv", "conv_grouped", "attention", "rnn"})  # on tensor cores

_MATMUL = "mm addmm bmm baddbmm addbmm _scaled_mm _grouped_mm addmv mv dot vdot addr _addmm_activation".split()
_CONV = "convolution convolution_backward cudnn_convolution cudnn_convolution_transpose _convolution".split()
_ATTENTION = [
    f"{base}{suffix}"
    for base in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_flash_attention",
        "_efficient_attention",
        "_cudnn_attention",
    )
    for suffix in ("", "_backward", "_forward")
]
_RNN = ["_cudnn_rnn", "_cudnn_rnn_backward"]
_NORM = """native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_no_training _native_batch_norm_legit_functional
_batch_norm_with_update _batch_norm_no_update cudnn_batch_norm miopen_batch_norm native_batch_norm_backward
batch_norm_backward cudnn_batch_norm_backward miopen_batch_norm_backward native_layer_norm native_layer_norm_backward
native_group_norm native_group_norm_backward _fused_rms_norm _fused_rms_norm_backward""".split()
# ops that launch no kernel: views, aliases, allocation without initialisation
_NO_KERNEL = """view _unsafe_view reshape _reshape_alias expand expand_as permute transpose t squeeze unsqueeze
slice select as_strided alias detach split split_with_sizes unsafe_split unsafe_split_with_sizes chunk unbind
narrow unfold view_as_real view_as_complex _conj _neg_view lift_fresh empty empty_like empty_strided new_empty
new_empty_strided _local_scalar_dense item set_ resize_ diagonal""".split()

KIND_OF: dict[str, Kind] = {
    **{f"aten.{n}{s}": "matmul" for n in _MATMUL for s in ("", "_")},
    **{f"aten.{n}": "conv" for n in _CONV},
    **{f"aten.{n}": "attention" for n in _ATTENTION},
    **{f"aten.{n}": "rnn" for n in _RNN},
    **{f"aten.{n}": "norm_backward" if n.endswith("_backward") else "norm" for n in _NORM},
    "aten._conv_depthwise2d": "conv_grouped",
    "aten.conv_depthwise3d": "conv_grouped",
    **{f"aten.{n}": "none" for n in _NO_KERNEL},
}
SYNCHRONIZING = frozenset({"aten._local_scalar_dense", "aten.item", "aten.nonzero", "aten.masked_select", "aten.unique"})


def kind_of(name: str, args: tuple[object, ...] = ()) -> Kind:
    """The kind of kernel an op (``"aten.mm"``) runs with these arguments; ``"memory"`` for every
    other op with a kernel. A convolution whose groups split the channels is ``"conv_grouped"``
    (depthwise kernels, far from the tensor cores' peak)."""
    kind = KIND_OF.get(name, "memory")
    if kind == "conv" and args:
        groups = args[9] if name == "aten.convolution_backward" and len(args) > 9 else args[8] if len(args) > 8 else 1
        if isinstance(groups, int) and groups > 1:
            return "conv_grouped"
    return kind


def math_peak(gpu: GPUSpec, kind: Kind, dtype: torch.dtype) -> float:
    """The peak FLOP/s of the math an op of ``kind`` runs in ``dtype`` on ``gpu``."""
    if dtype in (torch.bfloat16, torch.float16):
        name = str(dtype).removeprefix("torch.")
        if kind in COMPUTE_KINDS and name in gpu.peak_flops:
            return gpu.peak_flops[name]
        return gpu.peak_flops.get("float32", max(gpu.peak_flops.values()))
    if dtype == torch.float64:
        return gpu.peak_flops.get("float64", gpu.peak_flops.get("float32", 1.0))
    tf32 = (kind == "matmul" and torch.backends.cuda.matmul.allow_tf32) or (
        kind in ("conv", "conv_grouped", "rnn") and torch.backends.cudnn.allow_tf32
    )
    if tf32 and "tf32" in gpu.peak_flops:
        return gpu.peak_flops["tf32"]
    return gpu.peak_flops.get("float32", max(gpu.peak_flops.values()))


def kernel_seconds(
    gpu: GPUSpec, calibration: Calibration, kind: Kind, flops: int, nbytes: int, dtype: torch.dtype, kernels: int = 1
) -> tuple[float, Bound]:
    """The predicted time of one op's kernels, and what bounds it.

    A kind of kernel that runs on tensor cores reaches a fraction of their peak that grows
    with its work: ``efficiency * w / (w + half)`` for ``w`` FLOPs per kernel (``half``: the
    work at which it reaches half its efficiency); other kinds are bound by memory, at their
    kind's fraction of the bandwidth."""
    efficiency = calibration.efficiency
    if kind in COMPUTE_KINDS:
        work = flops / max(kernels, 1)
        half = calibration.half_flops.get(kind, 0.0)
        achieved = efficiency.get(kind, 1.0) * (work / (work + half) if work else 1.0)
        compute = flops / (math_peak(gpu, kind, dtype) * achieved) if flops else 0.0
        memory = nbytes / (gpu.bandwidth * efficiency["memory"])
    else:
        compute = flops / math_peak(gpu, kind, dtype) if flops else 0.0
        memory = nbytes / (gpu.bandwidth * efficiency.get(kind, efficiency["memory"]))
    floor = calibration.kernel_seconds * kernels
    seconds = max(compute, memory, floor)
    if seconds == floor and floor > max(compute, memory):
        return seconds, "launch"
    return seconds, "compute" if compute >= memory else "memory"


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


_NORMALISE_ONLY = frozenset(
    {"aten._native_batch_norm_legit_no_training", "aten._batch_norm_no_update"}
)  # inference batch norm: running statistics, one pass


def norm_passes(name: str, args: tuple[object, ...]) -> float:
    """How many times a normalisation kernel goes over its data, relative to reading its inputs and
    writing its outputs once: a forward pass that computes statistics reads the input twice
    (statistics, then normalise: 3 passes for 2), a backward pass reads its inputs twice more
    (two reductions, then the gradient: 5 passes for 3); inference batch norm normalises only."""
    if name.endswith("_backward"):
        return 5 / 3
    if name in _NORMALISE_ONLY:
        return 1.0
    training = args[5] if "batch_norm" in name and len(args) > 5 else True
    return 1.5 if training is not False else 1.0


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

    def issue(self, name: str, kind: Kind, flops: int, nbytes: int, dtype: torch.dtype, kernels: int = 1) -> tuple[float, Bound]:
        """One op: its kernels' predicted seconds and their bound (0 and "launch" for an op without one)."""
        calibration = self.calibration
        seconds: float
        bound: Bound
        if kind == "none":
            self.host += calibration.view_seconds
            seconds, bound = 0.0, "launch"
        else:
            seconds, bound = kernel_seconds(self.gpu, calibration, kind, flops, nbytes, dtype, kernels)
            self.host += calibration.host_seconds
            self.device = max(self.host, self.device) + seconds
            self.busy += seconds
        if name in SYNCHRONIZING:  # the host waits for the value
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
