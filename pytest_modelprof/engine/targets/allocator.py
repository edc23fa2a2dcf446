"""Labelled estimates of the CUDA memory that allocated bytes do not show.

The memory meter's figure for a CUDA target is *allocated* bytes (each allocation
rounded to the caching allocator's 512-byte blocks), what
``torch.cuda.max_memory_allocated`` reports. A process needs more than that; these
estimates say how much more, each on its own line, never added to the peak:

- **reserved**: the caching allocator keeps segments it has asked the driver for, so a
  steady step's reserved bytes are those of its whole history: the memory meter hands
  :func:`reserved_bytes` the resident tensors, a first step (the optimizer's state made
  at its first step, each thread's cuBLAS workspace at its first product) and the
  steady step. :func:`reserved_bytes` replays allocations and frees through a model of
  its documented policy (c10/cuda/CUDACachingAllocator.cpp): requests rounded up to
  512 bytes; requests up to 1 MiB served from 2 MiB segments of a small pool, larger
  ones from a large pool whose new segments are 20 MiB below 10 MiB and rounded up to
  2 MiB above; best fit among the cached free blocks of the pool, a block split when
  the rest is at least 512 bytes (small pool) or more than 1 MiB (large pool), freed
  blocks merged with free neighbours, segments never returned. Streams, expandable
  segments and ``PYTORCH_CUDA_ALLOC_CONF`` settings are not modelled.
- **cuBLAS workspaces** (:func:`workspace_bytes`): one workspace per handle (per thread)
  and stream, taken from the caching allocator the first time a matrix product runs there
  and kept: they count in allocated bytes, and the memory meter holds them under
  ``workspace`` for a whole steady step.
- **kernel scratch**: what a kernel allocates inside one call (a reduction's staging
  buffer) counts in allocated bytes for that moment: see :mod:`.scratch`.
- **cuDNN's convolution workspaces**: what cuDNN's chosen plan needs, taken for the call and
  freed after it, count in allocated bytes at the convolution's moment (:mod:`.cudnn`, asked of
  the cuDNN that PyTorch loads here); ``cudnn_workspace_bytes`` is the largest of the step, or
  ``None`` where they could not be asked here (a PyTorch without cuDNN 9.8+, benchmark mode):
  then they are missing from the peak.
- **CUDA context** (driver, kernels, cuBLAS/cuDNN handles): outside the allocator;
  not estimated (it depends on the driver, the GPU and which kernels load).
"""

from __future__ import annotations

import bisect
import os
import re

from ..ops import REGISTRY
from .gpus import cublas_workspace_default

BLOCK = 512
SMALL_REQUEST = 1 << 20  # requests up to 1 MiB: small pool
SMALL_SEGMENT = 2 << 20
LARGE_SEGMENT = 20 << 20  # for large requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20

# the matrix products that take a cuBLAS handle (and so its workspace), and those with a cuBLASLt epilogue
CUBLAS_OPS = frozenset(info.name for info in REGISTRY.values() if info.cublas)
LT_OPS = frozenset(info.name for info in REGISTRY.values() if info.cublas_lt)


def rounded(size: int) -> int:
    return max(BLOCK, -(-size // BLOCK) * BLOCK)


def segment_size(size: int) -> int:
    """The segment the allocator asks the driver for, to serve a (rounded) request of ``size``."""
    if size <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class CachingAllocatorModel:
    """Replays allocations and frees; ``reserved`` is the bytes of the segments held."""

    def __init__(self) -> None:
        self.reserved = 0
        self.small_segment: list[bool] = []  # per segment: of the small pool?
        self.free_blocks: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # sorted (size, segment, offset)
        self.free_start: dict[tuple[int, int], int] = {}  # (segment, offset) -> size of the free block there
        self.free_end: dict[tuple[int, int], int] = {}  # (segment, end) -> offset of the free block ending there
        self.live: dict[int, tuple[int, int, int]] = {}  # key -> (segment, offset, size)

    def allocate(self, key: int, size: int) -> None:
        size = rounded(size)
        small = size <= SMALL_REQUEST
        candidates = self.free_blocks[small]
        index = bisect.bisect_left(candidates, (size, -1, -1))  # best fit: the smallest free block that holds it
        if index < len(candidates):
            block, segment, offset = candidates[index]
            self._take(segment, offset)
        else:
            block, segment, offset = segment_size(size), len(self.small_segment), 0
            self.small_segment.append(small)
            self.reserved += block
        rest = block - size
        if rest >= BLOCK if small else rest > SMALL_REQUEST:
            self._give(segment, offset + size, rest)
            block = size
        self.live[key] = (segment, offset, block)

    def free(self, key: int) -> None:
        place = self.live.pop(key, None)
        if place is None:
            return
        segment, offset, size = place
        if (segment, offset + size) in self.free_start:
            size += self._take(segment, offset + size)
        before = self.free_end.get((segment, offset))
        if before is not None:
            size += self._take(segment, before)
            offset = before
        self._give(segment, offset, size)

    def _give(self, segment: int, offset: int, size: int) -> None:
        bisect.insort(self.free_blocks[self.small_segment[segment]], (size, segment, offset))
        self.free_start[(segment, offset)] = size
        self.free_end[(segment, offset + size)] = offset

    def _take(self, segment: int, offset: int) -> int:
        size = self.free_start.pop((segment, offset))
        del self.free_end[(segment, offset + size)]
        blocks = self.free_blocks[self.small_segment[segment]]
        blocks.pop(bisect.bisect_left(blocks, (size, segment, offset)))
        return size


def reserved_bytes(events: list[tuple[int, int]]) -> int:
    """Peak reserved bytes after replaying ``events``: ``(key, size)`` allocates, ``(key, -1)`` frees."""
    model = CachingAllocatorModel()
    for key, size in events:
        if size < 0:
            model.free(key)
        else:
            model.allocate(key, size)
    return model.reserved


def cublas_workspace_bytes(capability: tuple[int, int]) -> int:
    """The cuBLAS workspace of one handle and stream on a GPU of ``capability``:
    ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KiB:COUNT`` entries, sizes summed), else torch's
    default for the architecture (:class:`.gpus.Architecture`: 32 MiB on Hopper, sm_90; 8 MiB + 128 KiB elsewhere)."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        sizes = [int(size) for size, _ in re.findall(r":(\d+):(\d+)", config)]
        if sizes:
            return sum(sizes) * 1024
    return cublas_workspace_default(capability)


def lt_workspace_bytes() -> int:
    """cuBLASLt's workspace: ``CUBLASLT_WORKSPACE_SIZE`` KiB, else torch's default, 1 MiB."""
    size = os.environ.get("CUBLASLT_WORKSPACE_SIZE", "")
    return int(size) * 1024 if size.isdigit() else 1 << 20


def workspace_bytes(capability: tuple[int, int], ops: set[str]) -> int:
    """The workspaces one thread holds once it has run the matrix products ``ops`` (cuBLAS
    handles are per thread: the step's own, and the autograd engine's CUDA thread for the
    backward pass): one cuBLAS workspace, and cuBLASLt's 1 MiB where a product with a bias
    epilogue (``addmm``) ran. Measured on an H100 (torch 2.11): a step's allocated bytes
    before it starts exceed its tensors by 33 MiB for inference with ``nn.Linear`` and by
    65 MiB for training."""
    if not ops & CUBLAS_OPS:
        return 0
    return cublas_workspace_bytes(capability) + (lt_workspace_bytes() if ops & LT_OPS else 0)
