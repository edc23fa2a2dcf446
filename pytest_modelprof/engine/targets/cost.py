"""Predicted time of each kernel on a target GPU, and of the step: a roofline whose constants carry across GPUs.

Each op that launches a kernel costs its fixed time (start, ramp and tail: ``kernel_seconds`` per
kernel) plus the larger of its compute time (its FLOPs over the GPU's peak for the math it runs,
times an efficiency for its kind of kernel) and its memory time (bytes read and written over the
memory bandwidth, times an efficiency). The math: matrix products, convolutions, attention and
recurrent kernels run on tensor cores in bfloat16/float16 where the GPU has them, and in float32 on
TF32 tensor cores where PyTorch allowed it when the op ran (:func:`tf32_allowed`); quantized products
on their operands' math, fp8 or int8 tensor cores; everything else on CUDA cores (:func:`math_unit`).
A GPU whose power limit is below what its math draws at the boost clock (the 70-75 W cards) runs its
math at the clock it can hold (:func:`.gpus.clock_fraction`).

Three shapes of work change how close a kernel comes to its peak. A matrix product
(:func:`.products.gemms_of`: a convolution's implicit product, attention per head, a recurrent
layer's steps) runs in waves of output tiles over the SMs, the tile the library would pick, its
reduction split where its tiles would leave SMs idle (:func:`.products.product_seconds`); a
convolution's backward pass (cuDNN's own kernels for the two gradients) has an efficiency of its
own, and a recurrent layer runs as cuDNN's algorithm for it does (:mod:`.recurrent`): step by step, its recurrent
weights read again each step, or in one persistent kernel per layer.
A normalisation goes over its data more than once and, where it runs only a few independent
reductions (batch norm's channels), is bound by them rather than by the bandwidth
(:func:`norm_work`); PyTorch's own batch-norm kernels (``norm_native``: the CUDA path where the
weights are half precision, cuDNN's being taken for float32) are slower than cuDNN's, per byte, and
have constants of their own: their elements go through the SMs at a rate per cycle whatever their bytes
(:func:`element_seconds`). A convolution with few input channels per group (depthwise, or a first layer
on RGB pixels) runs off the tensor cores (``conv_narrow``). Pooling is bound by the integer
arithmetic that finds each element's window, not by its bytes (:func:`pool_seconds`), and so is an elementwise
kernel with an operand broadcast or laid out otherwise than its output (a per-channel scale, a transposing
copy), where it works element by element (:func:`strided_seconds`). A reduction runs as ATen lays out its blocks
(:mod:`.reduce_kernel`): a split one's blocks meet after their work, and one over dimensions that do not coalesce
works out its inputs' offsets element by element.

The step is simulated on two clocks, as eager PyTorch runs it: the host issues ops one after
another, each at a cost by who issues it (:data:`Issuer`: Python with autograd recording, Python
under ``no_grad``, autograd's engine), the GPU runs each kernel once issued and once the previous one
is done (so the step is the host's time where the GPU waits for it, the GPU's where it is busier),
and a read of a value on the host (``.item()``) waits for the GPU. The figure is eager PyTorch's: a
``torch.compile``d or CUDA-graph step has no per-op host cost. Not modelled: overlap with other work,
several streams, data loading, and the first step's one-off costs (cuDNN plans, allocations from the
driver).

Every GPU of the table shares one :class:`~.gpus.Calibration` (:data:`~.gpus.FITTED`), fitted by
``benchmarks/predicted_vs_h100.py`` to measured kernel and step times on six GPUs;
:data:`~.gpus.UNCALIBRATED` holds round, physically plausible defaults (where a fit starts).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple, get_args

import torch

from ..ops import REGISTRY, Kernel
from ..ops.iteration import non_overlapping_and_dense
from .gpus import Calibration, GPUSpec, clock_fraction, simt_batched_tiles, simt_fma_share
from .norm_kernel import weight_gradient_seconds
from .products import NARROW_CHANNELS, Gemm, argument, as_tensor, conv_channels, product_seconds
from .recurrent import Recurrent, algorithm_on, persistent_cycles, reread_seconds
from .recurrent import host_seconds as recurrent_host
from .recurrent import kernels as recurrent_kernels
from .reduce_kernel import Launch, launch_seconds

# the registry's kinds of kernel, and the two a convolution's backward pass runs (see :func:`kind_of`)
Kind = Literal[Kernel, "conv_backward", "conv_narrow_backward"]
Bound = Literal["compute", "memory", "launch"]
Issuer = Literal["recorded", "plain", "engine", "profiler"]
"""Who issues an op on the host: Python with autograd recording it (a training step's forward), Python
without (a forward under ``no_grad``, an optimizer's step), autograd's engine in C++ (the backward pass), or the
profiler itself (an op of the analytic run's own backward executor that the real step does not issue: it costs
nothing, host or GPU; see :func:`..meters.predicted.run_own`)."""
KINDS: tuple[Kind, ...] = tuple(kind for kind in get_args(Kind) if kind != "none")  # each with its efficiency
NORM_KINDS = frozenset({"norm", "norm_backward", "norm_native", "norm_native_backward"})  # see :func:`norm_work`
NATIVE_NORM_KINDS = frozenset({"norm_native", "norm_native_backward"})  # PyTorch's own batch-norm kernels
RATE_OF = {kind: f"{kind}_rate" for kind in NATIVE_NORM_KINDS}  # their elements per SM and cycle (see :func:`element_seconds`)
# a constant a calibration may lack (one fitted before it, or on probes that never run its kernels), and the one that
# stands in for it: a kind's constants, attention's reduction length (a product's)
STAND_IN: dict[str, str] = {"norm_native": "norm", "norm_native_backward": "norm_backward", "k_attention": "k"}
POOL_KINDS = frozenset({"pool", "pool_backward"})  # bound by each element's index arithmetic (see :func:`pool_elements`)
COMPUTE_KINDS = frozenset({"matmul", "conv", "conv_backward", "attention", "rnn"})  # on tensor cores where the dtype allows
LIBRARY_KINDS = frozenset({"matmul", "conv", "conv_backward"})  # cuBLAS's and cuDNN's products (see :mod:`.products`)
# the kinds of kernel on tensor cores whose reduction has a ``gemm_half`` of its own: attention's runs over the keys,
# one block of them after another, which a library's product does not
HALF_OF: dict[str, str] = {"attention": "k_attention"}


def gemm_half_key(kind: str, tensor_cores: bool) -> str:
    """The calibration's ``gemm_half`` entry for the reduction of a product of ``kind`` (see :mod:`.products`)."""
    return HALF_OF.get(kind, "k") if tensor_cores else "k_simt"


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
    is bound by memory. Batch norm in PyTorch's own kernels is ``"norm_native"`` (``"norm_native_backward"``)."""
    kind = KIND_OF.get(name, "memory")
    if kind == "conv":
        weight = as_tensor(argument(args, 2 if name == "aten.convolution_backward" else 1))
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


def tf32_allowed(kind: Kind) -> bool:
    """Whether PyTorch runs a float32 op of ``kind`` on TF32 tensor cores, as its flags are now: cuDNN's
    ``torch.backends.cudnn.allow_tf32`` (on by default) for convolutions and recurrent layers, and
    ``torch.backends.cuda.matmul.allow_tf32`` (off by default; ``torch.set_float32_matmul_precision("high")``
    turns it on) for matrix products."""
    if kind in ("conv", "conv_backward", "rnn"):
        return torch.backends.cudnn.allow_tf32
    return kind == "matmul" and torch.backends.cuda.matmul.allow_tf32


def math_unit(gpu: GPUSpec, kind: Kind, dtype: torch.dtype, tf32: bool | None = None) -> tuple[float, bool]:
    """The peak FLOP/s of the math an op of ``kind`` runs in ``dtype`` on ``gpu``, and whether it runs on
    tensor cores. On tensor cores, fp8 and int8 operands run at the GPU's ``float8`` and ``int8`` peaks; a
    GPU without them (the A100 and A10G have no fp8, where PyTorch's ``_scaled_mm`` refuses to run) at its
    16-bit peak, as if the operands were widened to float16. A 16-bit dtype the GPU has no tensor cores for
    (bfloat16 before Ampere), and float32 without TF32 (``tf32``: whether the op ran with it allowed; by
    default, :func:`tf32_allowed` now), run on the CUDA cores."""
    compute = kind in COMPUTE_KINDS
    narrow = NARROW_MATH.get(dtype) if compute else None
    if narrow is not None:
        if narrow in gpu.peak_flops:
            return gpu.peak_flops[narrow], True
        dtype = torch.float16
    simt = gpu.peak_flops.get("float32", max(gpu.peak_flops.values()))
    if dtype in (torch.bfloat16, torch.float16):
        name = str(dtype).removeprefix("torch.")
        if compute and name in gpu.peak_flops:
            return gpu.peak_flops[name], True
        return simt, False
    if dtype == torch.float64:
        return gpu.peak_flops.get("float64", simt), False
    if (tf32_allowed(kind) if tf32 is None else tf32) and "tf32" in gpu.peak_flops:
        return gpu.peak_flops["tf32"], True
    return simt, False


def math_peak(gpu: GPUSpec, kind: Kind, dtype: torch.dtype) -> float:
    """The peak FLOP/s of the math an op of ``kind`` runs in ``dtype`` on ``gpu`` (see :func:`math_unit`)."""
    return math_unit(gpu, kind, dtype)[0]


class Work(NamedTuple):
    """What the cost model needs of one op (:func:`..meters.predicted.op_features` reads it off the op)."""

    name: str  # "aten.mm"
    kind: Kind
    flops: int
    bytes: int  # read and written once each
    dtype: torch.dtype
    kernels: int = 1  # (a cuDNN recurrent call's, by the algorithm on the GPU: :func:`.recurrent.kernels`)
    gemms: tuple[Gemm, ...] = ()  # the matrix products it runs on tensor cores (see :func:`gemms_of`)
    passes: float = 1.0  # times a normalisation goes over its data, relative to ``bytes`` once
    reductions: int = 0  # independent reductions a normalisation runs side by side; 0: not what limits it
    on_device: bool = True  # False: all its tensors are on the host (Adam's step counts): no kernel
    issuer: Issuer = "recorded"  # who issues it, at what cost to the host (see :data:`Issuer`)
    tf32: bool = False  # float32 math allowed on TF32 tensor cores where it ran (:func:`tf32_allowed`)
    # a pooling kernel's elements (:func:`pool_elements`), a native batch norm's (:func:`norm_elements`), a strided
    # elementwise kernel's (:func:`strided_elements`)
    elements: int = 0
    relayout: int = 0  # bytes its library's layout transforms move on tensor cores, kernels of their own (:func:`.products.relayout_bytes`)
    launches: tuple[Launch, ...] = ()  # a reduction's kernels, as ATen lays out their blocks (:mod:`.reduce_kernel`)
    recurrent: Recurrent | None = None  # a cuDNN recurrent call's shape: its algorithm, kernels and host (:mod:`.recurrent`)
    columns: int = 0  # a norm's backward pass: the width its weight-gradient kernel works through (:mod:`.norm_kernel`)


def kernel_seconds(gpu: GPUSpec, calibration: Calibration, work: Work, duty: float = 1.0) -> tuple[float, Bound]:
    """The predicted time of one op's kernels, and what bounds it (see the module's notes); ``duty``: the
    fraction of the time the GPU runs kernels (1: back to back, as in a step; see :func:`.gpus.clock_fraction`)."""
    efficiency = calibration.efficiency
    kind = work.kind
    bandwidth = gpu.bandwidth * efficiency["memory"]
    relayout = staging = persistent = reread = 0.0
    call, kernels, gemms = work.recurrent, work.kernels, work.gemms
    if call is not None:  # a cuDNN recurrent call: step by step, or in persistent kernels (see :mod:`.recurrent`)
        chosen = algorithm_on(gpu, call)
        kernels, reread = recurrent_kernels(call, chosen), reread_seconds(call, chosen, bandwidth, gpu.l2_bytes)
        if chosen != "standard":  # the recurrent products run inside the persistent kernels, the inputs' apart
            persistent, gemms = persistent_cycles(call, chosen) / gpu.boost_clock, gemms[::2]
    if kind in COMPUTE_KINDS:
        math_dtype = MATH_OF.get(work.name, work.dtype)
        peak, tensor_cores = math_unit(gpu, kind, math_dtype, work.tf32)
        unit_efficiency = efficiency.get(kind if tensor_cores else f"{kind}_simt", efficiency.get(kind, 1.0))
        peak *= clock_fraction(gpu, duty, calibration.power_exponent) * unit_efficiency
        if not tensor_cores:  # the loop's other instructions may take FP32 lanes or issue slots from the FMAs
            peak *= simt_fma_share(gpu, calibration, math_dtype)
        if gemms:  # attention and recurrent kernels schedule their own work: no split of the reduction
            sms, split = gpu.sm_count, kind in LIBRARY_KINDS
            batched = () if tensor_cores or not split else simt_batched_tiles(gpu)  # (the library's batched "nn" kernels')
            half = gemm_half_key(kind, tensor_cores)
            half = half if half in calibration.gemm_half else STAND_IN.get(half, half)
            compute = (
                sum(
                    product_seconds(
                        g, work.flops * g.share, peak, sms, calibration, tensor_cores, split, batched if _batched_nn(g) else (), half
                    )
                    for g in gemms
                )
                + persistent
            )
        else:  # (a persistent call whose products are not known: its kernels' time, or its FLOPs' if longer)
            compute = max(work.flops / peak, persistent)
        memory = work.bytes / bandwidth + reread
        if tensor_cores and work.relayout:  # transposed into the kernels' layout and back, before and after them
            relayout = work.relayout / bandwidth + calibration.kernel_seconds * RELAYOUT_KERNELS
    elif kind in POOL_KINDS:
        compute = pool_seconds(gpu, calibration, work)
        memory = work.bytes / bandwidth
    else:
        compute = work.flops / (math_unit(gpu, kind, work.dtype, False)[0] * efficiency.get("cuda_cores", 1.0)) if work.flops else 0.0
        stand_in = STAND_IN.get(kind, kind)
        rate = gpu.bandwidth * efficiency.get(kind, efficiency.get(stand_in, efficiency["memory"]))
        reductions = calibration.reduction_bandwidth
        per_reduction = reductions.get(kind, reductions.get(stand_in, 0.0))
        if work.reductions and per_reduction:
            rate = min(rate, work.reductions * per_reduction)
        memory = work.bytes * work.passes / rate
        blocks = weight_gradient_seconds(gpu, calibration, work.columns, work.elements) if work.columns else 0.0
        if blocks:  # a norm's weight-gradient kernel on its blocks, in place of its two passes' bytes (in ``memory``)
            compute = max(compute, memory - 2 * work.elements * work.dtype.itemsize / rate + blocks)
        offsets, staging = launch_seconds(gpu, calibration, work.launches) if work.launches else (0.0, 0.0)
        # what the SMs do, where it outlasts the bytes: a layer norm's rows, a native batch norm's elements, a strided
        # kernel's, a reduction's offsets
        compute = max(
            compute,
            reduction_seconds(gpu, calibration, work),
            element_seconds(gpu, calibration, work),
            strided_seconds(gpu, calibration, work),
            offsets,
        )
    # each kernel's start and finish, beside its work; a split reduction's staging after it
    fixed = calibration.kernel_seconds * kernels + staging
    seconds = fixed + max(compute, memory) + relayout
    if fixed > max(compute, memory):
        return seconds, "launch"
    return seconds, "compute" if compute >= memory else "memory"


RELAYOUT_KERNELS = 3  # a convolution's layout transforms: its input's and weight's, then its output's

ROW_NORMS = frozenset({"aten.native_layer_norm"})  # whose reductions (rows) each take their own time: :func:`reduction_seconds`


def reduction_seconds(gpu: GPUSpec, calibration: Calibration, work: Work) -> float:
    """The time a normalisation's forward pass takes over its reductions one by one, however few bytes each has:
    PyTorch's layer norm gives each row a block of its own, which loads the row, reduces it across its warps and
    writes it back normalised, and on a row of 96 to 384 elements (a ConvNeXt's or a Swin's channels) that, not
    the bytes, is the kernel's time. Its rows at the ``norm`` kind's ``reduction_cycles`` (SM cycles each), on
    every SM at the boost clock (a power-capped card is taken to hold it for this work, as for memory-bound
    kernels). Measured on an H200, a layer norm's forward pass over rows of 96, 192, 384 and 768 channels took
    1.59, 1.75, 2.3 and 4.0 ns a row, the first three 2.4 to 6.6 times what its bytes take at the memory's peak;
    its backward pass (the input's gradient, then the weights' sums down the rows) is not bound that way, and
    other normalisations were not measured so (batch norm's reductions are its channels, too few for this to
    show): 0 for them, for a calibration without the figure, and for a GPU whose clock is not known."""
    if work.name not in ROW_NORMS or not work.reductions:
        return 0.0
    cycles = calibration.reduction_cycles.get("norm", 0.0)
    return work.reductions * cycles / (gpu.sm_count * gpu.boost_clock) if cycles and gpu.boost_clock else 0.0


def pool_seconds(gpu: GPUSpec, calibration: Calibration, work: Work) -> float:
    """The time a pooling kernel's integer arithmetic takes: its elements (:func:`pool_elements`) at the kind's
    rate per SM and clock cycle (its ``efficiency``), on every SM at the boost clock (a power-capped card is
    taken to hold it for this integer work). PyTorch's CUDA kernels for 2-d max and average pooling work out
    each element's window, or the outputs it feeds, from its flat index (divisions and remainders by each
    dimension, bounds, a NaN check): on an H100 and an H200 alike (the same SMs and clock, 1.4 times the
    bandwidth) a max pool over ResNet's stem takes the same time in float32 and bfloat16, on the H200 at 0.36
    and 0.23 of the memory's bandwidth, its backward pass at 0.21 and 0.13. 0 for a calibration without the
    kind's rate (one fitted before it: pooling priced by its bytes, as then) or a GPU whose clock is not known."""
    return _cycle_seconds(gpu, work.elements, calibration.efficiency.get(work.kind))


def _cycle_seconds(gpu: GPUSpec, elements: int, rate: float | None) -> float:
    """``elements`` at ``rate`` per SM and clock cycle, on every SM at the boost clock; 0 without a rate, a clock
    or elements."""
    cycles = gpu.sm_count * gpu.boost_clock
    return elements / (cycles * rate) if rate and cycles and elements else 0.0


def element_seconds(gpu: GPUSpec, calibration: Calibration, work: Work) -> float:
    """The time PyTorch's own batch-norm kernels (:data:`NATIVE_NORM_KINDS`) take over their elements
    (:func:`norm_elements`), at the kind's rate per SM and clock cycle (``efficiency[KIND_rate]``) on every SM at
    the boost clock: they compute in float32 whatever the input's dtype, and on a float16 or bfloat16 input that
    arithmetic, not the bytes, is their time. Measured on an H100 and an H200 (the same SMs and clock, 1.4 times
    the bandwidth), inference batch norm over a float16 input of 64x256x56x56 took 141 and 129 us, 1.4 and 1.5
    elements per SM and cycle (0.43 and 0.33 of each one's bandwidth); over 4x1024x64x64, 48 and 42 us. 0 for
    another kind, a calibration without the rate (one fitted before it: by bytes alone, as then) or a GPU whose
    clock is not known."""
    if work.kind not in NATIVE_NORM_KINDS:
        return 0.0
    return _cycle_seconds(gpu, work.elements, calibration.efficiency.get(RATE_OF[work.kind]))


def strided_seconds(gpu: GPUSpec, calibration: Calibration, work: Work) -> float:
    """The time an elementwise kernel on PyTorch's strided path takes on its SMs (:func:`strided_elements`: an
    operand broadcast, or laid out otherwise than the output), which bounds it where the memory does not: its
    elements at ``efficiency["strided_rate"]`` per SM and clock cycle, and its bytes at
    ``efficiency["strided_byte_cycles"]`` cycles each, on every SM at the boost clock. Where every operand is
    laid out as the output, PyTorch's kernels load and store whole vectors and run at the bandwidth; otherwise
    each thread works out each operand's offset from the element's index, dimension by dimension, and loads and
    stores one element at a time. Measured on an H100 and an H200 (the same SMs and clock, bandwidths 1.4 times
    apart: data/gpu-truth/h100-layout.json, h200-layout.json), a float16 product by a per-channel scale over 64 M
    elements took 176 and 165 us (1.5 elements per SM and cycle), in float32 228 and 201 us (1.1 and 1.3), a
    mean's gradient (read through a stride-0 expansion) 114 us on both: the SMs, not the memory, set the time.
    0 for a kernel on the vector path, a calibration without the rate (one fitted before it) or a GPU whose
    clock is not known."""
    rate = calibration.efficiency.get("strided_rate")
    cycles = gpu.sm_count * gpu.boost_clock
    if work.kind != "memory" or not rate or not cycles or not work.elements:  # (a native batch norm's are its own)
        return 0.0
    return (work.elements / rate + work.bytes * calibration.efficiency.get("strided_byte_cycles", 0.0)) / cycles


def pool_elements(args: tuple[object, ...]) -> int:
    """A pooling kernel's elements: its largest tensor argument's (the input of a forward pass, whose windows it
    reduces; the input whose gradient a backward pass computes, element by element)."""
    return max((a.numel() for a in args if isinstance(a, torch.Tensor)), default=0)


COPIES = frozenset({"aten.copy_", "aten._to_copy"})  # elementwise kernels that ATen does not tag pointwise


def strided_elements(name: str, func: object, tensors: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> int:
    """An elementwise op's elements where its kernel takes PyTorch's strided path (:func:`strided_seconds`): its
    largest output's, where one of its tensors is not laid out as that output (broadcast to it, a per-channel
    scale; transposed, a copy into another layout) or the output has gaps (a slice); 0 where every tensor is laid
    out as a dense output (the vector path), for a copy between devices, and for an op that is not elementwise
    (ATen's ``pointwise`` tag, and the copies). A 0-d tensor on the host is a scalar argument of the kernel, not
    an operand."""
    if not outputs or (name not in COPIES and torch.Tag.pointwise not in getattr(func, "tags", ())):
        return 0
    out = max(outputs, key=lambda t: t.numel())
    operands = [t for t in tensors if t.dim() or t.device.type != "cpu"]
    if any(t.device != out.device for t in operands):  # a copy between devices: no elementwise kernel
        return 0
    layout = _layout(out)
    if not non_overlapping_and_dense(out) or any(t.shape != out.shape or _layout(t) != layout for t in operands):
        return out.numel()
    return 0


def _layout(t: torch.Tensor) -> list[tuple[int, int]]:
    """``t``'s sizes and strides but for its size-1 dimensions, whose strides do not matter."""
    return [(size, stride) for size, stride in zip(t.shape, t.stride()) if size != 1]


def _batched_nn(gemm: Gemm) -> bool:
    """Whether ``gemm`` is a batched product of row-major operands, the layout whose library tiles are known
    (:func:`.gpus.simt_batched_tiles`; a batched ``q @ k.transpose(-1, -2)`` is another)."""
    return gemm.batch > 1 and gemm.layout == "nn"


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
    leaves threads idle (a 2-d or channels-last input runs PyTorch's channels-last kernel instead,
    without planes).

    Batch norm's kernels compute in float32 and run at a rate per element, not per byte: cuDNN's take
    a float16 input (under autocast) as long as a float32 one (measured on an H200: a forward in
    training over 64x256x56x56 in float16 at 244 G elements/s, in ResNet-50's autocast step, one of
    the held-out records; a one-layer probe over 64x256x28x28 in float32 at 245 G/s): a narrower input's
    passes are scaled up to float32's bytes. PyTorch's own kernels have a rate per element of their own
    (:func:`element_seconds`, over :func:`norm_elements`): their passes are their bytes'."""
    x = as_tensor(argument(args, 1 if name.endswith("_backward") else 0))
    if x is None or x.dim() < 2:
        return 1.0, 0
    backward = name.endswith("_backward")
    passes = 5 / 3 if backward else 1.5
    if "batch_norm" in name:
        narrow = x.is_floating_point() and x.element_size() < 4 and KIND_OF.get(name) not in NATIVE_NORM_KINDS
        widen = 4 / x.element_size() if narrow else 1.0
        training = argument(args, 7 if backward else 5, True) if name != "aten.cudnn_batch_norm_backward" else True
        if name in _BATCH_NORM_EVAL or training is False:
            pixels = math.prod(x.shape[2:])
            planes = x.dim() > 2 and x.stride(1) != 1  # else (a 2-d input, channels last) a kernel over channels, no planes
            return (max(1.0, PLANE_THREADS / pixels) if planes and pixels else 1.0) * widen, 0
        return passes * widen, int(x.shape[1])
    if "group_norm" in name:
        groups = argument(args, 8 if backward else 6, 1)
        return passes, int(x.shape[0]) * (groups if isinstance(groups, int) and groups > 0 else 1)
    normalized = argument(args, 2 if backward else 1, ())  # layer norm, RMS norm: rows of the trailing dimensions
    inner = math.prod(normalized) if isinstance(normalized, (list, tuple)) else x.shape[-1]
    return passes, max(1, x.numel() // max(1, inner))


def norm_elements(name: str, args: tuple[object, ...]) -> int:
    """The elements one of PyTorch's own batch-norm kernels works through (:func:`element_seconds`): its input's,
    once per pass (:func:`norm_work`: a training forward pass's statistics and then its normalisation, the idle
    threads of an inference pass over small planes)."""
    x = as_tensor(argument(args, 1 if name.endswith("_backward") else 0))
    if x is None or KIND_OF.get(name) not in NATIVE_NORM_KINDS:
        return 0
    return math.ceil(x.numel() * norm_work(name, args)[0])


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
        self.issuing = 0.0  # the host's time issuing ops, its waits for the GPU apart

    def issue(self, work: Work) -> tuple[float, Bound]:
        """One op: its kernels' predicted seconds and their bound (0 and "launch" for an op without one)."""
        calibration = self.calibration
        seconds: float = 0.0
        bound: Bound = "launch"
        if work.issuer == "profiler":
            return seconds, bound
        issue = calibration.view_seconds if work.kind == "none" else calibration.host(work.issuer)
        launch = self.host + issue  # when its first kernel is launched
        call = work.recurrent
        if call is not None:  # cuDNN's work on the host, then each step's launches, the GPU running them meanwhile
            gpu = self.gpu
            fixed, steps = recurrent_host(call, algorithm_on(gpu, call))
            launch += fixed
            issue += fixed + steps
        self.host += issue
        self.issuing += issue
        if work.kind != "none" and work.on_device:
            seconds, bound = kernel_seconds(self.gpu, calibration, work)
            self.device = max(max(launch, self.device) + seconds, self.host)
            self.busy += seconds
        if work.name in SYNCHRONIZING and work.on_device:  # the host waits for a value on the GPU
            self.host = max(self.host, self.device)
        return seconds, bound

    @property
    def seconds(self) -> float:
        return max(self.host, self.device)
