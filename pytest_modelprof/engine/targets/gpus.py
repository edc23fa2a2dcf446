"""What the engine needs to know of a GPU it targets (``profile(..., target="h100")``): :class:`GPUSpec`.

Figures are the vendors' datasheet figures for dense math (no structured sparsity):
``memory_bytes`` is the memory the driver reports (``nvidia-smi``'s total, in MiB),
``bandwidth`` the memory bandwidth in bytes/s, ``peak_flops`` the peak FLOP/s per
dtype of the math the GPU runs for it at its boost clock (tensor cores for ``bfloat16``/
``float16``/``float8``, for ``int8`` and for ``tf32``; CUDA cores for ``float32`` and
``float64``), ``sm_count`` its streaming multiprocessors, ``l2_bytes`` its L2 cache,
``boost_clock`` the SM clock (Hz) those peaks are quoted at and ``power`` the board's power
limit (W), ``compute_capability`` what ``torch.cuda.get_device_capability`` returns (it decides
kernels: the attention backend, the cuBLAS workspace), and ``interconnect`` the GPU-to-GPU
bandwidth per direction in bytes/s (NVLink, else PCIe) between the ``node_gpus`` GPUs of one
node; ``network`` is each GPU's bandwidth to other nodes per direction, for the time of a
sharded step's collectives (``profile(world_size=..., target=...)``).

What a GPU's compute capability fixes (threads and shared memory per SM, torch's cuBLAS workspace)
is one :class:`Architecture` row of :data:`ARCHITECTURES`, which the allocator, cuDNN's description of
the GPU, kernel scratch and the CUDA kernel choices read. The GPUs a target can name, each figure with
its source, are :data:`.catalog.GPUS`: adding a GPU is one entry there (and, for a new architecture, one
row in :data:`ARCHITECTURES`).

A GPU that is not in the table is a :class:`GPUSpec` of your own, passed as ``target=``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


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
        (6, 0): Architecture(shared_memory_per_block=49152, threads_per_sm=2048, blocks_per_sm=32, small_shared_memory=True),
        (6, 1): Architecture(shared_memory_per_block=49152, threads_per_sm=2048, blocks_per_sm=32, small_shared_memory=True),
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
    l2_bytes: int = 0  # 0: not known
    boost_clock: float = 0.0  # Hz; 0: not known
    power: float = 0.0  # W, the board's power limit; 0: not known

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0 or self.bandwidth <= 0 or self.sm_count <= 0:
            raise ValueError(f"GPUSpec {self.name!r}: memory_bytes, bandwidth and sm_count must be positive")
        if self.l2_bytes < 0 or self.boost_clock < 0 or self.power < 0:
            raise ValueError(f"GPUSpec {self.name!r}: l2_bytes, boost_clock and power must not be negative")
        if self.node_gpus < 1 or self.interconnect < 0 or self.network < 0:
            raise ValueError(f"GPUSpec {self.name!r}: node_gpus must be positive, interconnect and network not negative")
        if len(self.compute_capability) != 2:
            raise ValueError(f"GPUSpec {self.name!r}: compute_capability is (major, minor), got {self.compute_capability!r}")
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))
