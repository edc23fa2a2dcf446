"""The GPUs a profile can target (``profile(..., target="h100")``): what the engine needs to know of each.

Figures are the vendors' datasheet figures for dense math (no structured sparsity):
``memory_bytes`` is the memory the driver reports (``nvidia-smi``'s total, in MiB),
``bandwidth`` the memory bandwidth in bytes/s, ``peak_flops`` the peak FLOP/s per
dtype of the math the GPU runs for it (tensor cores for ``bfloat16``/``float16``/
``float8``, for ``int8`` and for ``tf32``; CUDA cores for ``float32`` and ``float64``),
``compute_capability`` what ``torch.cuda.get_device_capability`` returns (it decides
kernels: the attention backend, the cuBLAS workspace), and ``interconnect`` the
GPU-to-GPU bandwidth per direction in bytes/s (NVLink, else PCIe) between the
``node_gpus`` GPUs of one node; ``network`` is each GPU's bandwidth to other nodes per
direction (the reference systems': one 400 Gb/s InfiniBand NIC per GPU on DGX/HGX H100 and
H200, 200 Gb/s on DGX A100, 100 Gb/s per node of eight PCIe cards), for the time of a sharded
step's collectives (``profile(world_size=..., target=...)``).

What a GPU's compute capability fixes (threads and shared memory per SM, torch's cuBLAS workspace)
is one :class:`Architecture` row of :data:`ARCHITECTURES`, which the allocator, cuDNN's description of
the GPU, kernel scratch and the CUDA kernel choices read. Adding a GPU is one entry in :data:`GPUS`
(and, for a new architecture, one row in :data:`ARCHITECTURES`).

A GPU that is not in the table is a :class:`GPUSpec` of your own, passed as ``target=``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..._files import replace_atomically

MiB = 1 << 20
T = 1e12
G = 1e9


@dataclass(frozen=True)
class Calibration:
    """The predicted-time model's figures for one GPU (see :mod:`.cost`).

    ``efficiency``: per kind of kernel (``matmul``, ``conv``, ``conv_backward``, ``conv_narrow``,
    ``conv_narrow_backward``, ``attention``, ``rnn``, ``norm``, ``norm_backward``, ``memory``: see
    :func:`.cost.kind_of`), the fraction of the peak it reaches at full size: of the math's peak
    for the kinds on tensor cores, of the memory bandwidth for the others; ``cuda_cores``: of the
    CUDA cores' peak, for the math of kernels off the tensor cores. ``gemm_half``: per
    dimension of a matrix product (``m``, ``n``, ``k``), the size at which a product reaches half
    that efficiency in it. ``reduction_bandwidth``: per normalisation kind, the bytes/s one of
    its independent reductions moves, where too few of them run side by side to fill the GPU
    (batch norm's channels). Then the fixed costs, in seconds."""

    efficiency: Mapping[str, float] = field(
        default_factory=lambda: {
            "matmul": 0.8,
            "conv": 0.6,
            "conv_backward": 0.4,
            "conv_narrow": 0.3,
            "conv_narrow_backward": 0.1,
            "attention": 0.5,
            "rnn": 0.6,
            "norm": 0.7,
            "norm_backward": 0.7,
            "memory": 0.8,
        },
        hash=False,
    )
    gemm_half: Mapping[str, float] = field(default_factory=lambda: {"m": 128.0, "n": 128.0, "k": 128.0}, hash=False)
    reduction_bandwidth: Mapping[str, float] = field(default_factory=dict, hash=False)
    kernel_seconds: float = 3e-6  # the shortest a kernel takes, launch latency included
    host_seconds: float = 6e-6  # the host's time to issue one op with a kernel
    view_seconds: float = 1.5e-6  # ... and one without (a view, an allocation)
    calibrated: bool = False  # False: round defaults, not fitted to measured kernel times
    source: str = "uncalibrated defaults"

    def __post_init__(self) -> None:
        for name in ("efficiency", "gemm_half", "reduction_bandwidth"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))


UNCALIBRATED = Calibration()


# torch's cuBLAS workspace per handle and stream where ``CUBLAS_WORKSPACE_CONFIG`` is not set
# (aten/src/ATen/cuda/CublasHandlePool.cpp): 8 MiB + 128 KiB, 32 MiB on Hopper
DEFAULT_CUBLAS_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8


@dataclass(frozen=True)
class Architecture:
    """What a compute capability fixes of a GPU, for the kernel choices and allocations modelled on it:
    ``shared_memory_per_block`` (bytes a block can opt in to), ``threads_per_sm`` and ``blocks_per_sm``
    (CUDA C Programming Guide, technical specifications per compute capability); ``small_shared_memory``:
    its blocks opt in to about 100 KiB, not 164-228 KiB, so the memory-efficient attention backward
    kernels that need more are not offered; ``cublas_workspace_bytes``: torch's default cuBLAS workspace
    on it."""

    shared_memory_per_block: int
    threads_per_sm: int
    blocks_per_sm: int
    small_shared_memory: bool = False
    cublas_workspace_bytes: int = DEFAULT_CUBLAS_WORKSPACE


# by compute capability; a new architecture is one row
ARCHITECTURES: Mapping[tuple[int, int], Architecture] = MappingProxyType(
    {
        (7, 0): Architecture(shared_memory_per_block=98304, threads_per_sm=2048, blocks_per_sm=32),
        (7, 5): Architecture(shared_memory_per_block=65536, threads_per_sm=1024, blocks_per_sm=16, small_shared_memory=True),
        (8, 0): Architecture(shared_memory_per_block=166912, threads_per_sm=2048, blocks_per_sm=32),
        (8, 6): Architecture(shared_memory_per_block=101376, threads_per_sm=1536, blocks_per_sm=16, small_shared_memory=True),
        (8, 7): Architecture(shared_memory_per_block=166912, threads_per_sm=1536, blocks_per_sm=16),
        (8, 9): Architecture(shared_memory_per_block=101376, threads_per_sm=1536, blocks_per_sm=24, small_shared_memory=True),
        (9, 0): Architecture(shared_memory_per_block=232448, threads_per_sm=2048, blocks_per_sm=32, cublas_workspace_bytes=4096 * 8 * 1024),
        (10, 0): Architecture(shared_memory_per_block=232448, threads_per_sm=2048, blocks_per_sm=32),
        (12, 0): Architecture(shared_memory_per_block=101376, threads_per_sm=1536, blocks_per_sm=32, small_shared_memory=True),
        (12, 1): Architecture(shared_memory_per_block=101376, threads_per_sm=1536, blocks_per_sm=32, small_shared_memory=True),
    }
)


def architecture(capability: tuple[int, int]) -> Architecture | None:
    """The row of :data:`ARCHITECTURES` for ``capability``; ``None`` for one the table does not list."""
    return ARCHITECTURES.get((capability[0], capability[1]))


def threads_per_sm(capability: tuple[int, int]) -> int:
    """The threads an SM of ``capability`` holds, as the engine's launch models and device queries take
    them: the table's figure; 2048 for a capability it does not list."""
    row = architecture(capability)
    return 2048 if row is None else row.threads_per_sm


def small_shared_memory(capability: tuple[int, int]) -> bool:
    """Whether a block on ``capability`` opts in to about 100 KiB of shared memory only (:class:`Architecture`)."""
    row = architecture(capability)
    return row is not None and row.small_shared_memory


def cublas_workspace_default(capability: tuple[int, int]) -> int:
    """torch's default cuBLAS workspace per handle and stream on ``capability`` (bytes)."""
    row = architecture(capability)
    return row.cublas_workspace_bytes if row is not None else DEFAULT_CUBLAS_WORKSPACE


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model (see the module's notes for what each figure means)."""

    name: str
    memory_bytes: int
    bandwidth: float  # bytes/s
    peak_flops: Mapping[str, float] = field(hash=False)  # dtype name ("bfloat16", "tf32", ...) -> FLOP/s
    sm_count: int
    compute_capability: tuple[int, int]
    interconnect: float = 0.0  # bytes/s per direction, GPU to GPU within a node
    calibration: Calibration = field(default=UNCALIBRATED, hash=False)  # of the predicted-time model
    node_gpus: int = 8  # GPUs of one node, reached at ``interconnect``
    network: float = 0.0  # bytes/s per direction, each GPU to other nodes

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0 or self.bandwidth <= 0 or self.sm_count <= 0:
            raise ValueError(f"GPUSpec {self.name!r}: memory_bytes, bandwidth and sm_count must be positive")
        if self.node_gpus < 1 or self.interconnect < 0 or self.network < 0:
            raise ValueError(f"GPUSpec {self.name!r}: node_gpus must be positive, interconnect and network not negative")
        if len(self.compute_capability) != 2:
            raise ValueError(f"GPUSpec {self.name!r}: compute_capability is (major, minor), got {self.compute_capability!r}")
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))


# fitted by benchmarks/predicted_vs_h100.py on the kernel and step times of the nine H100
# steps in pytest_modelprof/data/gpu-truth (torch 2.11, cuDNN 9.19); its leave-one-out table says how
# far it carries to other models
H100_CALIBRATION = Calibration(
    efficiency={
        "matmul": 0.9183,
        "conv": 0.4942,
        "conv_backward": 0.2775,
        "conv_narrow": 0.2464,
        "conv_narrow_backward": 0.08353,
        "attention": 1.0,
        "rnn": 0.4999,
        "norm": 0.7368,
        "norm_backward": 0.6497,
        "memory": 0.7696,
        "cuda_cores": 0.3898,
    },
    gemm_half={"m": 239.4, "n": 29.14, "k": 339.2},
    reduction_bandwidth={"norm": 21.11e9, "norm_backward": 13.44e9},
    kernel_seconds=7.278e-6,
    host_seconds=16.48e-6,
    view_seconds=11.52e-6,
    calibrated=True,
    source="fitted on 9 H100 steps (the project's gpu-truth records, torch 2.11)",
)

# peak FLOP/s per dtype (TFLOP/s; int8 in TOPS), dense, the datasheets' figures. The datasheets give fp8 and int8
# with structured sparsity: these are half that. "float8" is e4m3 and e5m2 alike, accumulated in float32 (as
# cuBLASLt's fp8 products are); a GPU without fp8 tensor cores (A100, A10G) has no "float8" entry (see
# :func:`.cost.math_peak` for what its fp8 products are priced at)
# H100 SXM5 (NVIDIA H100 datasheet: fp8 3958, int8 3958 sparse; the H200 datasheet gives the same)
_HOPPER = {"float64": 67, "float32": 67, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4, "float8": 1978.9, "int8": 1978.9}
# A100 SXM4 (NVIDIA A100 datasheet: int8 624 dense, 1248 sparse)
_AMPERE = {"float64": 19.5, "float32": 19.5, "tf32": 156, "bfloat16": 312, "float16": 312, "int8": 624}


def _teraflops(figures: Mapping[str, float]) -> dict[str, float]:
    return {dtype: flops * T for dtype, flops in figures.items()}


# bytes/s per direction of one 100 Gb/s NIC shared by a node's eight GPUs: the network of a node of PCIe cards
_SHARED_NIC = 100 / 8 / 8 * G

GPUS: Mapping[str, GPUSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            GPUSpec(  # H100 SXM5 80GB, NVLink 4, NDR
                name="h100",
                memory_bytes=81559 * MiB,
                bandwidth=3.35e12,
                peak_flops=_teraflops(_HOPPER),
                sm_count=132,
                compute_capability=(9, 0),
                interconnect=450 * G,
                calibration=H100_CALIBRATION,
                network=400 / 8 * G,
            ),
            GPUSpec(  # H100 PCIe (NVIDIA H100 datasheet: fp8 3026, int8 3026 sparse)
                name="h100-pcie",
                memory_bytes=81559 * MiB,
                bandwidth=2.0e12,
                peak_flops=_teraflops(
                    {"float64": 51.2, "float32": 51.2, "tf32": 378, "bfloat16": 756, "float16": 756, "float8": 1513, "int8": 1513}
                ),
                sm_count=114,
                compute_capability=(9, 0),
                interconnect=64 * G,
                network=_SHARED_NIC,
            ),
            GPUSpec(  # H200 SXM 141GB
                name="h200",
                memory_bytes=143771 * MiB,
                bandwidth=4.8e12,
                peak_flops=_teraflops(_HOPPER),
                sm_count=132,
                compute_capability=(9, 0),
                interconnect=450 * G,
                network=400 / 8 * G,
            ),
            GPUSpec(  # A100 SXM4 80GB, NVLink 3, HDR
                name="a100-80gb",
                memory_bytes=81920 * MiB,
                bandwidth=2.039e12,
                peak_flops=_teraflops(_AMPERE),
                sm_count=108,
                compute_capability=(8, 0),
                interconnect=300 * G,
                network=200 / 8 * G,
            ),
            GPUSpec(
                name="a100-40gb",
                memory_bytes=40960 * MiB,
                bandwidth=1.555e12,
                peak_flops=_teraflops(_AMPERE),
                sm_count=108,
                compute_capability=(8, 0),
                interconnect=300 * G,
                network=200 / 8 * G,
            ),
            GPUSpec(  # L4 (NVIDIA L4 datasheet: fp8 485, int8 485 sparse)
                name="l4",
                memory_bytes=23034 * MiB,
                bandwidth=300e9,
                peak_flops=_teraflops(
                    {"float64": 0.47, "float32": 30.3, "tf32": 60, "bfloat16": 121, "float16": 121, "float8": 242.5, "int8": 242.5}
                ),
                sm_count=58,
                compute_capability=(8, 9),
                interconnect=32 * G,
                network=_SHARED_NIC,
            ),
            GPUSpec(  # A10G: no fp8; int8 at twice its fp16 rate, as the A10 datasheet's GA102 (125 TFLOP/s fp16, 250 TOPS int8)
                name="a10g",
                memory_bytes=23028 * MiB,
                bandwidth=600e9,
                peak_flops=_teraflops({"float64": 0.98, "float32": 31.2, "tf32": 35, "bfloat16": 70, "float16": 70, "int8": 140}),
                sm_count=80,
                compute_capability=(8, 6),
                interconnect=32 * G,
                network=_SHARED_NIC,
            ),
            GPUSpec(  # RTX 4090 (NVIDIA Ada whitepaper: fp8 with fp32 accumulate 330.3, int8 660.6 dense)
                name="rtx4090",
                memory_bytes=24564 * MiB,
                bandwidth=1008e9,
                peak_flops=_teraflops(
                    {"float64": 1.29, "float32": 82.6, "tf32": 82.6, "bfloat16": 165.2, "float16": 165.2, "float8": 330.3, "int8": 660.6}
                ),
                sm_count=128,
                compute_capability=(8, 9),
                interconnect=32 * G,
                network=_SHARED_NIC,
            ),
        )
    }
)
ALIASES = MappingProxyType({"h100-sxm": "h100", "a100": "a100-80gb", "4090": "rtx4090"})


def gpu_spec(target: str | os.PathLike[str] | GPUSpec) -> GPUSpec:
    """The spec ``target`` names (case and ``_``/``-`` ignored), or ``target`` itself if it is one; a
    path to a calibration file (``*.json``, see :func:`save_calibration`): its GPU, with that calibration."""
    if isinstance(target, GPUSpec):
        return target
    if isinstance(target, os.PathLike) or (isinstance(target, str) and target.strip().lower().endswith(".json")):
        return load_calibration(target)
    if not isinstance(target, str):
        raise TypeError(f"target must be a GPU name, a calibration file or a GPUSpec, got {type(target).__name__}")
    key = target.strip().lower().replace("_", "-").replace(" ", "-")
    key = ALIASES.get(key, key)
    if key not in GPUS:
        raise ValueError(f"unknown target GPU {target!r}: known are {', '.join(GPUS)} (or pass a GPUSpec)")
    return GPUS[key]


# ------------------------------------------------------------------ calibration files

CALIBRATION_FORMAT = 1
_FIGURES = ("kernel_seconds", "host_seconds", "view_seconds")
_TABLES = ("efficiency", "gemm_half", "reduction_bandwidth")


def save_calibration(path: str | os.PathLike[str], gpu: GPUSpec, calibration: Calibration, measured: str = "") -> None:
    """Write ``calibration`` of ``gpu`` (one of :data:`GPUS`) as a JSON file that ``target=path`` loads;
    ``measured``: on what it was measured (the device's name), recorded beside it. The file is
    replaced whole or not at all."""
    if GPUS.get(gpu.name) is None:
        raise ValueError(f"a calibration file names its GPU from the table ({', '.join(GPUS)}), got {gpu.name!r}")
    document: dict[str, Any] = {"format": CALIBRATION_FORMAT, "gpu": gpu.name, "measured_on": measured, "source": calibration.source}
    document.update({name: dict(getattr(calibration, name)) for name in _TABLES})
    document.update({name: getattr(calibration, name) for name in _FIGURES})
    replace_atomically(Path(path), json.dumps(document, indent=2) + "\n")


def load_calibration(path: str | os.PathLike[str]) -> GPUSpec:
    """The GPU a calibration file (:func:`save_calibration`) names, with its calibration."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"{path}: cannot read the calibration file: {error.strerror or error}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: not JSON: {error.msg}") from None

    def fail(entry: str, expected: str) -> ValueError:
        return ValueError(f"{path}:{_line_of(text, entry)}: {entry!r}: expected {expected}")

    if not isinstance(document, dict):
        raise ValueError(f"{path}:1: expected a JSON object of calibration figures")
    if document.get("format") != CALIBRATION_FORMAT:
        raise fail("format", f"{CALIBRATION_FORMAT} (a calibration file written by modelprof calibrate)")
    known = {"format", "gpu", "measured_on", "source", *_TABLES, *_FIGURES}
    for entry in document:
        if entry not in known:
            raise fail(entry, f"one of {', '.join(sorted(known))}")
    name = document.get("gpu")
    if not isinstance(name, str) or name not in GPUS:
        raise fail("gpu", f"a GPU of the table ({', '.join(GPUS)})")
    figures: dict[str, Any] = {}
    for entry in _TABLES:
        table = document.get(entry, {})
        if not isinstance(table, dict) or not all(_positive(v) for v in table.values()):
            raise fail(entry, "an object of positive numbers")
        figures[entry] = {str(k): float(v) for k, v in table.items()}
    for entry in _FIGURES:
        if entry not in document or not _positive(document[entry]):
            raise fail(entry, "a positive number of seconds")
        figures[entry] = float(document[entry])
    source = f"{path.name}: {document.get('source') or 'calibration file'}"
    calibration = Calibration(**figures, calibrated=True, source=source)
    return dataclasses.replace(GPUS[name], calibration=calibration)


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _line_of(text: str, field: str) -> int:
    """The line of ``"field":`` in a JSON text (1 if it is not there)."""
    at = text.find(f'"{field}"')
    return text.count("\n", 0, at) + 1 if at >= 0 else 1
