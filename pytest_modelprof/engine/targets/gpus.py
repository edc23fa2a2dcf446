"""What the engine needs to know of a GPU it targets (``profile(..., target="h100")``): :class:`GPUSpec`.

Figures are the vendors' datasheet figures for dense math (no structured sparsity):
``memory_bytes`` is the memory the driver reports (``nvidia-smi``'s total, in MiB),
``bandwidth`` the memory bandwidth in bytes/s, ``peak_flops`` the peak FLOP/s per
dtype of the math the GPU runs for it at its boost clock (tensor cores for ``bfloat16``/
``float16``/``float8``, for ``int8`` and for ``tf32``; CUDA cores for ``float32`` and
``float64``), ``sm_count`` its streaming multiprocessors, ``l2_bytes`` its L2 cache,
``boost_clock`` the SM clock (Hz) those peaks are quoted at and ``power`` the board's power
limit (W), ``nvls`` whether its node's NVSwitches reduce (NVLink SHARP, for NCCL's NVLS
all-reduce), ``compute_capability`` what ``torch.cuda.get_device_capability`` returns (it decides
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

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

# the host's time per op, by who issues it, over Python's with autograd recording (``benchmarks/host_cost.py``,
# on the CPU: 0.74-0.82 under no_grad, 0.52-0.53 from autograd's engine in C++). On CUDA tensors an engine's op
# alone costs more (1.35x a recorded one: data/gpu-truth/h200-host.json), but a step's forward pass also runs the
# modules' Python around its ops, which no op sees. Tried with the CUDA ratios (plain 0.83, engine 1.37) and the
# host's two constants refitted on the nine H100 steps: the 29 steps of h200-b.json came out at a median |error|
# of 7.2% (largest 26.1%), the 20 of h100-heldout.json at 9.9% (33.9%), against 7.0% (22.2%) and 8.4% (31.7%) with
# these refitted the same way; so the forward's ops carry that Python here
HOST_RATIO: Mapping[str, float] = MappingProxyType({"recorded": 1.0, "plain": 0.78, "engine": 0.53})


@dataclass(frozen=True)
class Calibration:
    """The predicted-time model's figures for one GPU (see :mod:`.cost`).

    ``efficiency``: per kind of kernel (``matmul``, ``conv``, ``conv_backward``, ``conv_narrow``,
    ``conv_narrow_backward``, ``attention``, ``rnn``, ``norm``, ``norm_backward``, ``norm_native``,
    ``norm_native_backward`` (where absent: ``norm``'s and ``norm_backward``'s), ``memory``: see
    :func:`.cost.kind_of`), the fraction of the peak it reaches at full size: of the math's peak
    for the kinds on tensor cores, of the memory bandwidth for the others; ``KIND_simt``
    (``matmul_simt``, ``conv_simt``, ...): of the CUDA cores' peak, for a product that runs there
    (float32 without TF32; a convolution's may exceed 1: Winograd's and FFT's kernels multiply less
    than the convolution's FLOPs count); ``cuda_cores``: of the CUDA cores' peak, for the math of
    other kernels; ``pool`` and ``pool_backward``: not a fraction of a peak but the elements a pooling
    kernel works through per SM and clock cycle (see :func:`.cost.pool_seconds`; where absent, pooling
    is priced by its bytes alone); ``norm_native_rate`` and ``norm_native_backward_rate``: the same for
    PyTorch's own batch-norm kernels (:func:`.cost.element_seconds`; where absent, by their bytes alone);
    ``strided_rate`` and ``strided_byte_cycles``: the elements per SM and cycle, and the SM cycles per byte, of an
    elementwise kernel on PyTorch's strided path (an operand broadcast or laid out otherwise than the output),
    whose SMs' work bounds it where the bytes do not (:func:`.cost.strided_seconds`; where absent, the bytes alone);
    ``norm_columns_rate``: the elements per block and cycle of a layer or RMS norm backward pass's weight-gradient
    kernel, whose blocks of 32 columns may be fewer than the SMs (:mod:`.norm_kernel`; where absent, its bytes alone).
    ``gemm_half``: the reduction length at which a product's tile reaches half that
    efficiency (``k`` on tensor cores, ``k_simt`` on CUDA cores, ``k_attention`` for attention's kernels, whose
    reduction runs over the keys: where absent, ``k``); ``tile_cost``: how much less of it a
    smaller output tile reaches (``tensor``, ``simt``; see :mod:`.products`).
    ``reduction_bandwidth``: per normalisation kind, the bytes/s one of its independent reductions
    moves, where too few of them run side by side to fill the GPU (batch norm's channels);
    ``reduction_cycles``: ``norm``, the SM cycles a layer norm's forward pass takes over each of its rows
    however few its bytes (see :func:`.cost.reduction_seconds`); ``staging``, the SM cycles of each step of a
    split reduction's last block through its other blocks' partial results, and ``efficiency["reduction_rate"]``,
    the elements per SM and cycle of a reduction that works out its inputs' offsets dimension by dimension (see
    :mod:`.reduce_kernel`). Then the fixed costs, in seconds."""

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
            "matmul_simt": 0.8,
            "conv_simt": 0.8,
            "conv_backward_simt": 0.6,
            "pool": 1.0,
            "pool_backward": 0.4,
            "reduction_rate": 2.0,
        },
        hash=False,
    )
    gemm_half: Mapping[str, float] = field(default_factory=lambda: {"k": 128.0, "k_simt": 32.0}, hash=False)
    reduction_bandwidth: Mapping[str, float] = field(default_factory=dict, hash=False)
    reduction_cycles: Mapping[str, float] = field(default_factory=lambda: {"staging": 700.0}, hash=False)
    tile_cost: Mapping[str, float] = field(default_factory=lambda: {"tensor": 16.0, "simt": 16.0}, hash=False)
    power_exponent: float = 1.0  # how a GPU's power grows with its clock (see :func:`clock_fraction`)
    simt_integer: float = 0.25  # integer instructions a product on CUDA cores runs per FMA (see :func:`simt_fma_share`)
    simt_issue: float = 0.0  # ... other instructions that take an FMA's issue slot, per FMA (see :func:`simt_fma_share`)
    kernel_seconds: float = 3e-6  # a kernel's fixed time beside its work: its start, ramp and tail
    host_seconds: float = 6e-6  # the host's time to issue one op with a kernel from Python, autograd recording it
    view_seconds: float = 1.5e-6  # ... one without a kernel (a view, an allocation)
    calibrated: bool = False  # False: round defaults, not fitted to measured kernel times
    source: str = "uncalibrated defaults"

    def host(self, issuer: str) -> float:
        """The host's seconds to issue an op with a kernel, by who issues it (:data:`.cost.Issuer`)."""
        return self.host_seconds * HOST_RATIO.get(issuer, 1.0)

    def __post_init__(self) -> None:
        if not self.power_exponent > 0:
            raise ValueError(f"Calibration: power_exponent must be positive, got {self.power_exponent!r}")
        for name in ("simt_integer", "simt_issue"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"Calibration: {name} must be zero or more, got {getattr(self, name)!r}")
        for name in ("efficiency", "gemm_half", "tile_cost", "reduction_bandwidth", "reduction_cycles"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))


UNCALIBRATED = Calibration()

# The fitted calibration: one set of constants for every GPU of the table (each GPU is its figures: peaks, SMs,
# bandwidth, power), fitted by benchmarks/predicted_vs_h100.py on the kernel and step times of the nine H100 steps
# in pytest_modelprof/data/gpu-truth (torch 2.11, cuDNN 9.19), the kernel times of the operators of an H200's
# one-layer probes there (h200-probes.json, h200-probes-b.json: convolutions, products, normalisations, pooling,
# activations and attention, those whose name and shapes a held-out step has left out) and the kernels NeuSight
# timed one at a time on a P4, P100, T4, V100 and A100 (pytest_modelprof/data/kernel-data); its leave-one-out and
# leave-one-GPU-out tables (benchmarks/kernel_data.py) and the held-out H200 steps (benchmarks/predicted_vs_h200.py)
# say how far it carries to other models and GPUs. conv_backward_simt is not fitted
# (no fp32 convolution's backward pass without TF32 was measured): a round figure. norm_native_rate and
# norm_native_backward_rate (PyTorch's own batch-norm kernels, which no H100 step runs: their elements per SM and
# cycle) are fitted on their own, every other constant kept, on the float16 and bfloat16 batch norms of the H200's
# one-layer probes (h200-probes.json) whose shapes no held-out step has; on those the rate, not the bytes, sets the
# time, so their bandwidth and their bandwidth per channel are cuDNN's (norm's, norm_backward's), which stand in.
# pool and pool_backward (elements per SM and cycle) come from the H100 steps' max pools with the probes';
# reduction_cycles (a layer norm's cycles a row) from their layer norms with the rest, norm_columns_rate (its backward
# pass's weight-gradient blocks) from their layer norms' backward passes with the rest; strided_rate and
# strided_byte_cycles (an elementwise kernel's work on its SMs on the strided path) with the rest, the elementwise
# kernels an H100 ran by their operands' layout (h100-layout.json) among the operators; reduction_rate and
# reduction_cycles["staging"] (a reduction's offsets, a split reduction's staging steps: .reduce_kernel) with the
# rest, the sums of the same probes among the operators.
FITTED = Calibration(
    efficiency={
        "matmul": 0.9601,
        "conv": 0.5662,
        "conv_backward": 0.3849,
        "conv_narrow": 0.2638,
        "conv_narrow_backward": 0.07383,
        "attention": 0.8229,
        "rnn": 0.3896,
        "norm": 0.8054,
        "norm_backward": 0.6738,
        "norm_native_rate": 1.434,
        "norm_native_backward_rate": 1.389,
        "memory": 0.8574,
        "matmul_simt": 0.8948,
        "conv_simt": 1.610,
        "conv_backward_simt": 0.3,
        "cuda_cores": 0.4729,
        "strided_rate": 2.702,
        "strided_byte_cycles": 0.06566,
        "reduction_rate": 1.980,
        "pool": 1.026,
        "pool_backward": 0.3543,
        "norm_columns_rate": 11.88,
    },
    gemm_half={"k": 286.7, "k_simt": 12.09, "k_attention": 778.9},
    tile_cost={"tensor": 6.250, "simt": 11.60},
    reduction_bandwidth={"norm": 20.59e9, "norm_backward": 13.63e9},
    reduction_cycles={"norm": 541.1, "staging": 736.9},
    power_exponent=1.090,
    simt_integer=0.3804,
    simt_issue=0.1555,
    kernel_seconds=2.348e-6,
    host_seconds=28.45e-6,
    view_seconds=10.38e-6,
    calibrated=True,
    source="fitted on 9 H100 steps (the project's gpu-truth records, torch 2.11), 316 operators of an H200's one-layer probes, "
    "144 elementwise kernels and 216 sums of an H100's layout probes and 4800 kernels timed on five GPUs (NeuSight's); "
    "PyTorch's own batch-norm kernels on the H200's probes",
)


# torch's cuBLAS workspace per handle and stream where ``CUBLAS_WORKSPACE_CONFIG`` is not set
# (aten/src/ATen/cuda/CublasHandlePool.cpp): 8 MiB + 128 KiB, 32 MiB on Hopper
DEFAULT_CUBLAS_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8


# The tiles of cuBLAS's batched float32 products of row-major operands ("nn") on CUDA cores (bmm with TF32
# off), as (rows, columns) of the product's row-major output, by the names its kernels ran under in NeuSight's
# kernel data (pytest_modelprof/data/kernel-data). cuBLAS works in column-major order, so a kernel named
# ``sgemm_AxB`` has tiles of A of the output's columns by B of its rows (their launch grids show it: in
# ``volta_sgemm_32x128_nn`` over a 986 x 979 output, 31 blocks along the 979 columns and 8 along the 986 rows).
# An A100 ran every one of 16,661 in ampere_sgemm_128x128_nn, however small its output; a V100 ran 64x64,
# 32x128 and 128x32 (never 128x64), a T4 those and 128x64, by shape. The Ampere family's are taken for the
# architectures after it, whose names the data does not hold. Pascal's are maxwell_sgemm_128x64_nn, but with
# that tile alone the product model overstates its small batched products (a tile's idle part costs a P100
# less than an A100): any tile there.
VOLTA_BATCHED = ((64, 64), (128, 32), (32, 128))
TURING_BATCHED = ((64, 128), (64, 64), (128, 32), (32, 128))
AMPERE_BATCHED = ((128, 128),)


@dataclass(frozen=True)
class Architecture:
    """What a compute capability fixes of a GPU, for the kernel choices and allocations modelled on it:
    ``shared_memory_per_block`` (bytes a block can opt in to), ``threads_per_sm`` and ``blocks_per_sm``
    (CUDA C Programming Guide, technical specifications per compute capability); ``small_shared_memory``:
    its blocks opt in to about 100 KiB, not 164-228 KiB, so the memory-efficient attention backward
    kernels that need more are not offered; ``cublas_workspace_bytes``: torch's default cuBLAS workspace
    on it; ``flops_per_watt``: the float32 FLOP/s per watt of board power its GPUs sustain under dense
    math (0: not known), which sets how far a GPU of a low power limit clocks down (:func:`clock_fraction`);
    ``integer_on_fp32_lanes``: its integer instructions run on FP32 lanes (Pascal's have no integer lanes
    of their own; half of GA10x's, Ada's and consumer Blackwell's FP32 lanes run integers too; Volta, Turing,
    GA100, Hopper and data-centre Blackwell have separate integer lanes: the architecture whitepapers), so a
    product on CUDA cores loses FMA lanes to its address arithmetic; ``fma_issue_bound``: it has integer lanes
    of its own, but each scheduler has a warp's worth of FP32 lanes (32: Hopper, data-centre Blackwell; the
    latter taken from its SM's 128 FP32 lanes, not measured) and issues one instruction a cycle, so each
    instruction of a product's inner loop that is not an FMA (a shared-memory load, an address) is issued in a
    cycle no FMA is; Volta's, Turing's and GA100's schedulers have 16, an FMA holds them two cycles and the
    others are issued in between (:func:`simt_fma_share`); ``simt_batched_tiles``: the output tiles its library's
    batched float32 products on CUDA cores come in (:func:`simt_batched_tiles`; empty: any; by default Ampere's)."""

    shared_memory_per_block: int
    threads_per_sm: int
    blocks_per_sm: int
    small_shared_memory: bool = False
    cublas_workspace_bytes: int = DEFAULT_CUBLAS_WORKSPACE
    flops_per_watt: float = 0.0
    integer_on_fp32_lanes: bool = False
    fma_issue_bound: bool = False
    simt_batched_tiles: tuple[tuple[int, int], ...] = AMPERE_BATCHED

    def __post_init__(self) -> None:
        if self.integer_on_fp32_lanes and self.fma_issue_bound:
            raise ValueError(
                "Architecture: integer_on_fp32_lanes and fma_issue_bound are two causes of one loss (simt_fma_share): one at most"
            )


# by compute capability; a new architecture is one row. ``flops_per_watt`` is the float32 peak per watt of
# board power of the architecture's datasheet card with the most of it that holds its boost clock at its power
# limit (a full-size board, not one capped at 70-75 W): the energy a float32 FMA lane-cycle takes on its process
T = 1e12
ARCHITECTURES: Mapping[tuple[int, int], Architecture] = MappingProxyType(
    {
        (6, 0): Architecture(  # Pascal GP100, 16 nm: Tesla P100 PCIe 9.3 TFLOP/s at 250 W
            shared_memory_per_block=49152,
            threads_per_sm=2048,
            blocks_per_sm=32,
            small_shared_memory=True,
            flops_per_watt=9.3 * T / 250,
            integer_on_fp32_lanes=True,
            simt_batched_tiles=(),
        ),
        (6, 1): Architecture(  # Pascal GP102/GP104, 16 nm: Tesla P40 12 TFLOP/s at 250 W
            shared_memory_per_block=49152,
            threads_per_sm=2048,
            blocks_per_sm=32,
            small_shared_memory=True,
            flops_per_watt=12 * T / 250,
            integer_on_fp32_lanes=True,
            simt_batched_tiles=(),
        ),
        (7, 0): Architecture(  # Volta, 12 nm: Tesla V100 PCIe 14 TFLOP/s at 250 W
            shared_memory_per_block=98304,
            threads_per_sm=2048,
            blocks_per_sm=32,
            flops_per_watt=14 * T / 250,
            simt_batched_tiles=VOLTA_BATCHED,
        ),
        (7, 5): Architecture(  # Turing, 12 nm: Quadro RTX 8000 16.3 TFLOP/s at 295 W
            shared_memory_per_block=65536,
            threads_per_sm=1024,
            blocks_per_sm=16,
            small_shared_memory=True,
            flops_per_watt=16.3 * T / 295,
            simt_batched_tiles=TURING_BATCHED,
        ),
        (8, 0): Architecture(  # Ampere GA100, 7 nm: A100 PCIe 40GB 19.5 TFLOP/s at 250 W
            shared_memory_per_block=166912, threads_per_sm=2048, blocks_per_sm=32, flops_per_watt=19.5 * T / 250
        ),
        (8, 6): Architecture(
            shared_memory_per_block=101376, threads_per_sm=1536, blocks_per_sm=16, small_shared_memory=True, integer_on_fp32_lanes=True
        ),
        (8, 7): Architecture(shared_memory_per_block=166912, threads_per_sm=1536, blocks_per_sm=16, integer_on_fp32_lanes=True),
        (8, 9): Architecture(  # Ada, 4 nm: L40S 91.6 TFLOP/s at 350 W
            shared_memory_per_block=101376,
            threads_per_sm=1536,
            blocks_per_sm=24,
            small_shared_memory=True,
            flops_per_watt=91.6 * T / 350,
            integer_on_fp32_lanes=True,
        ),
        (9, 0): Architecture(  # Hopper, 4 nm: H100 PCIe 51.2 TFLOP/s at 350 W
            shared_memory_per_block=232448,
            threads_per_sm=2048,
            blocks_per_sm=32,
            cublas_workspace_bytes=4096 * 8 * 1024,
            flops_per_watt=51.2 * T / 350,
            fma_issue_bound=True,
        ),
        (10, 0): Architecture(shared_memory_per_block=232448, threads_per_sm=2048, blocks_per_sm=32, fma_issue_bound=True),
        (12, 0): Architecture(
            shared_memory_per_block=101376, threads_per_sm=1536, blocks_per_sm=32, small_shared_memory=True, integer_on_fp32_lanes=True
        ),
        (12, 1): Architecture(
            shared_memory_per_block=101376, threads_per_sm=1536, blocks_per_sm=32, small_shared_memory=True, integer_on_fp32_lanes=True
        ),
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
    calibration: Calibration = field(default=FITTED, hash=False)  # of the predicted-time model
    node_gpus: int = 8  # GPUs of one node, reached at ``interconnect``
    network: float = 0.0  # bytes/s per direction, each GPU to other nodes
    l2_bytes: int = 0  # 0: not known
    boost_clock: float = 0.0  # Hz; 0: not known
    power: float = 0.0  # W, the board's power limit; 0: not known
    nvls: bool = False  # its node's NVSwitches reduce (NVLink SHARP): NCCL's NVLS all-reduce

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0 or self.bandwidth <= 0 or self.sm_count <= 0:
            raise ValueError(f"GPUSpec {self.name!r}: memory_bytes, bandwidth and sm_count must be positive")
        if not self.peak_flops or not all(flops > 0 for flops in self.peak_flops.values()):
            raise ValueError(f"GPUSpec {self.name!r}: peak_flops must give a positive FLOP/s for at least one dtype")
        if self.l2_bytes < 0 or self.boost_clock < 0 or self.power < 0:
            raise ValueError(f"GPUSpec {self.name!r}: l2_bytes, boost_clock and power must not be negative")
        if self.node_gpus < 1 or self.interconnect < 0 or self.network < 0:
            raise ValueError(f"GPUSpec {self.name!r}: node_gpus must be positive, interconnect and network not negative")
        if len(self.compute_capability) != 2:
            raise ValueError(f"GPUSpec {self.name!r}: compute_capability is (major, minor), got {self.compute_capability!r}")
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))


def simt_batched_tiles(gpu: GPUSpec) -> tuple[tuple[int, int], ...]:
    """The output tiles of the library's batched float32 products on ``gpu``'s CUDA cores (see
    :data:`AMPERE_BATCHED`, Ampere's for an architecture the table does not list); empty where the library may
    take any (:data:`.products.SIMT_TILES`)."""
    row = architecture(gpu.compute_capability)
    return row.simt_batched_tiles if row is not None else AMPERE_BATCHED


def simt_loss(gpu: GPUSpec, dtype: torch.dtype = torch.float32) -> str | None:
    """The calibration's figure for what a product in ``dtype`` on ``gpu``'s CUDA cores loses to the instructions of
    its inner loop that are not FMAs (:class:`Architecture`): ``simt_integer`` where integers run on FP32 lanes,
    ``simt_issue`` where they take the FMAs' issue slots; None where neither, and for float64 (its units are
    others)."""
    row = architecture(gpu.compute_capability)
    if row is None or dtype == torch.float64:
        return None
    return "simt_integer" if row.integer_on_fp32_lanes else "simt_issue" if row.fma_issue_bound else None


def simt_fma_share(gpu: GPUSpec, calibration: Calibration, dtype: torch.dtype = torch.float32) -> float:
    """The fraction of its peak a product in ``dtype`` on ``gpu``'s CUDA cores can run FMAs at: where its inner
    loop's other instructions take lanes or issue slots from the FMAs (:func:`simt_loss`), ``1 / (1 + x)`` with
    ``x`` the calibration's figure for them per FMA (on GA10x and Ada, while the integers fit in the half of the
    lanes that run them); 1 elsewhere."""
    loss = simt_loss(gpu, dtype)
    return 1.0 if loss is None else 1.0 / (1.0 + float(getattr(calibration, loss)))


def clock_fraction(gpu: GPUSpec, duty: float = 1.0, exponent: float = 1.0) -> float:
    """The fraction of its boost clock ``gpu`` sustains under dense math: 1 unless its power limit is below
    what its float32 peak takes at the architecture's FLOP/s per watt (:class:`Architecture`), as on the
    70-75 W cards (T4, P4, L4), which clock down to hold it. Its peaks are quoted at the boost clock.
    ``duty``: the fraction of the time the GPU runs such math (1: kernels back to back, as in a step); the
    limit holds the average power, so a GPU idle in between clocks down less. ``exponent``: how the power
    its math draws grows with the clock (``clock ** exponent``: dynamic power is the clock times the voltage
    squared, and the voltage falls with the clock; a calibration's ``power_exponent``)."""
    row = architecture(gpu.compute_capability)
    peak = gpu.peak_flops.get("float32", 0.0)
    if row is None or not row.flops_per_watt or not gpu.power or not peak:
        return 1.0
    share: float = gpu.power * row.flops_per_watt / (peak * max(duty, 1e-9))
    return min(1.0, math.pow(share, 1 / exponent))
