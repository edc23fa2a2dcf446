"""What CUDA code asks of the device, answered as the target GPU answers it: its capability, properties
and name, and whether autocast can run on it.

Autocast: ``torch.autocast("cuda")`` entered inside the model (and by activation
checkpointing, which recomputes a block under the autocast state of its forward) disables
itself where no CUDA device is present; on a target it is enabled as on that GPU
(bfloat16 from compute capability 8.0).
"""

from __future__ import annotations

import contextlib
import types
from typing import Any

import torch

from ...targets.gpus import GPUSpec, threads_per_sm


@contextlib.contextmanager
def cuda_autocast_available(gpu: GPUSpec) -> Any:
    """``torch.autocast("cuda")`` as on ``gpu``: its constructor disables it (with a warning) where no
    CUDA device is present, and refuses bfloat16 where the device has no support for it."""
    common = torch.cuda.amp.common
    stock = common.amp_definitely_not_available, torch.cuda.is_bf16_supported
    common.amp_definitely_not_available = lambda: False
    torch.cuda.is_bf16_supported = lambda including_emulation=True: gpu.compute_capability >= (8, 0)
    try:
        yield
    finally:
        common.amp_definitely_not_available, torch.cuda.is_bf16_supported = stock


@contextlib.contextmanager
def device_queries(gpu: GPUSpec) -> Any:
    """``torch.cuda.get_device_capability``, ``get_device_properties`` and ``get_device_name`` answered as
    ``gpu`` answers them (a model that picks its kernels by the GPU asks them: transformers' experts ask
    the capability before a grouped product); what the spec does not hold is not made up."""
    properties = types.SimpleNamespace(
        name=gpu.name,
        major=gpu.compute_capability[0],
        minor=gpu.compute_capability[1],
        total_memory=gpu.memory_bytes,
        multi_processor_count=gpu.sm_count,
        max_threads_per_multi_processor=threads_per_sm(gpu.compute_capability),
        warp_size=32,
        is_integrated=False,
        is_multi_gpu_board=False,
    )
    cuda = torch.cuda
    stock = cuda.get_device_capability, cuda.get_device_properties, cuda.get_device_name
    cuda.get_device_capability = lambda device=None: gpu.compute_capability
    cuda.get_device_properties = lambda device=None: properties  # type: ignore[assignment,return-value]
    cuda.get_device_name = lambda device=None: gpu.name
    try:
        yield
    finally:
        cuda.get_device_capability, cuda.get_device_properties, cuda.get_device_name = stock
