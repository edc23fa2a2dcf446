"""cuDNN's convolution workspaces on a target GPU, asked of cuDNN itself without a GPU.

PyTorch runs a CUDA convolution through cuDNN's backend API (aten/src/ATen/native/cudnn/Conv_v8.cpp):
unless ``torch.backends.cudnn.benchmark`` is on, it asks cuDNN's heuristics (mode INSTANT, or B
with ``TORCH_CUDNN_USE_HEURISTIC_MODE_B``) for the engine configurations of the operation, drops
those that down-convert their inputs (and, for float32 without TF32, those on tensor cores; in
deterministic mode, the non-deterministic ones), and runs the first whose plan builds, with a
workspace of the plan's size taken from the caching allocator for the call and freed after it.
A convolution's backward pass runs two such operations, one for the input's gradient and one
for the weight's, one after the other.

From cuDNN 9.8, a device-properties descriptor built from a JSON description of a GPU stands in
for the device, so the heuristics rank, and the plans are sized, for a target GPU on a machine
without one. :func:`workspace_bytes` does that through the cuDNN that PyTorch here loads (its CUDA
wheels bring their own, and load it also where no GPU is present): the workspace of the plan
PyTorch would run. Where no such cuDNN can be loaded (a CPU-only build of PyTorch, cuDNN before
9.8), or in benchmark mode (the plan is chosen by timing it), the workspace is not known and
:func:`workspace_bytes` answers ``None``.

The GPU is described (:class:`Device`: a target's :class:`.gpus.GPUSpec`, or on a machine with
a GPU the device itself, for the modelled figures beside the measured ones) by its SM count,
compute capability and memory and the limits its architecture sets (:data:`.gpus.ARCHITECTURES`: shared memory, threads and
blocks per SM); the heuristics were found insensitive to the clocks, the L2 size and the driver
version. The workspaces are those of the cuDNN that runs here: a GPU machine with another cuDNN
may choose other engines.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch._prims_common import make_channels_last_strides_for, make_contiguous_strides_for, suggest_memory_format

from .gpus import ARCHITECTURES, GPUSpec, architecture

MIN_VERSION = 90800  # the device-properties descriptor

# cuDNN's enumerations (cudnn_graph_v9.h)
_FORWARD, _BACKWARD_FILTER, _BACKWARD_DATA = 10, 11, 12  # operation descriptor types
_CONVOLUTION, _ENGINE, _ENGINECFG, _ENGINEHEUR, _PLAN, _GRAPH, _TENSOR, _DEVICEPROP = 1, 2, 3, 4, 5, 15, 17, 38
_TYPES = {"int64": 3, "float": 4, "double": 5, "descriptor": 15, "int32": 23, "char": 24}
_TYPE_DATA_TYPE, _TYPE_CONVOLUTION_MODE, _TYPE_HEUR_MODE, _TYPE_NUMERICAL_NOTE = 1, 7, 8, 11
_CROSS_CORRELATION = 1
_INSTANT, _MODE_B, _FALLBACK = 0, 1, 2
_TENSOR_CORE, _DOWN_CONVERT, _NONDETERMINISTIC = 0, 1, 4
# attribute names: per operation, (alpha, beta, convolution, w, x-side, y-side)
_OPERATION_ATTRIBUTES = {
    _FORWARD: (700, 701, 702, 703, 704, 705),  # W, X, Y
    _BACKWARD_DATA: (706, 707, 708, 709, 710, 711),  # W, DX, DY
    _BACKWARD_FILTER: (712, 713, 714, 715, 716, 717),  # DW, X, DY
}
_CONV_COMPUTE, _CONV_MODE, _CONV_DILATIONS, _CONV_STRIDES, _CONV_POST, _CONV_PRE, _CONV_DIMS = range(100, 107)
_HEUR_MODE, _HEUR_GRAPH, _HEUR_RESULTS, _HEUR_DEVICEPROP = 200, 201, 202, 204
_CFG_ENGINE = 300
_PLAN_CONFIG, _PLAN_WORKSPACE, _PLAN_DEVICEPROP = 401, 402, 407
_GRAPH_OPS = 801
_TENSOR_ALIGNMENT, _TENSOR_DATA_TYPE, _TENSOR_DIMS, _TENSOR_STRIDES, _TENSOR_UID = 900, 901, 902, 903, 906
_ENGINE_INDEX, _ENGINE_NOTES = 1301, 1303
_DEVICEPROP_JSON = 2702
_DATA_TYPES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 9}

FORWARD, BACKWARD_DATA, BACKWARD_FILTER = "forward", "backward_data", "backward_filter"
_OPERATIONS = {FORWARD: _FORWARD, BACKWARD_DATA: _BACKWARD_DATA, BACKWARD_FILTER: _BACKWARD_FILTER}


@dataclass(frozen=True)
class Device:
    """What cuDNN is told of the GPU it plans for."""

    name: str
    memory_bytes: int
    sm_count: int
    capability: tuple[int, int]

    @classmethod
    def of(cls, gpu: GPUSpec) -> Device:
        major, minor = gpu.compute_capability
        return cls(gpu.name, gpu.memory_bytes, gpu.sm_count, (major, minor))

    @classmethod
    def present(cls, device: torch.device) -> Device:
        """A GPU of this machine."""
        properties = torch.cuda.get_device_properties(device)
        return cls(properties.name, properties.total_memory, properties.multi_processor_count, (properties.major, properties.minor))


@dataclass(frozen=True)
class Tensor:
    """What cuDNN's descriptor of one of the operation's tensors holds."""

    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    alignment: int = 32  # bytes; a tensor at the start of a caching-allocator block is aligned to 32 (and more)


@dataclass(frozen=True)
class Convolution:
    """One of cuDNN's convolution operations, with its tensors as PyTorch describes them to cuDNN:
    ``x`` the input (or its gradient), ``w`` the weight (or its gradient), ``y`` the output (or its gradient)."""

    operation: str  # FORWARD, BACKWARD_DATA or BACKWARD_FILTER
    x: Tensor
    w: Tensor
    y: Tensor
    padding: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]


def alignment(tensor: torch.Tensor) -> int:
    """``getAlignment`` of Conv_v8.cpp for a tensor whose storage starts a caching-allocator block
    (512-byte aligned): the largest power of two up to 32 dividing its byte offset."""
    offset = tensor.storage_offset() * tensor.element_size()
    value = 1
    while value < 32 and offset % (value * 2) == 0:
        value *= 2
    return value


def device_properties(gpu: Device) -> dict[str, Any]:
    """The JSON description of ``gpu`` that cuDNN's device-properties descriptor takes."""
    major, minor = gpu.capability
    # a capability the table does not list is described as the nearest architecture: Hopper from 9.0 on, else sm_86
    row = architecture(gpu.capability) or ARCHITECTURES[(9, 0) if major >= 9 else (8, 6)]
    shared, threads, blocks = row.shared_memory_per_block, row.threads_per_sm, row.blocks_per_sm
    return {
        "maxGridSize": [2**31 - 1, 65535, 65535],
        "maxBlockSize": [1024, 1024, 64],
        "regsPerBlock": 65536,
        "multiProcessorCount": gpu.sm_count,
        "warpSize": 32,
        "maxSharedMemoryPerBlock": 49152,
        "maxSharedMemoryPerBlockOptin": shared,
        "reservedSharedMemoryPerBlock": 1024 if major >= 8 else 0,
        "maxRegistersPerSM": 65536,
        "maxCtasPerSM": blocks,
        "maxThreadsPerBlock": 1024,
        "maxThreadsPerSM": threads,
        "pciDeviceId": 0,
        "isTccDriver": 0,
        "supportCoopLaunch": 1,
        "totalGlobalMem": gpu.memory_bytes,
        "smClockRateKHz": 1_500_000,
        "memClockRateKHz": 1_500_000,
        "l2CacheSize": 50 << 20,
        "cudaDeviceId": 0,
        "deviceVer": major * 100 + minor * 10,
        "driverVer": 13000,
        "deviceName": gpu.name,
    }


class CudnnError(RuntimeError):
    pass


class _Library:
    """The cuDNN backend API through ctypes."""

    def __init__(self, handle: ctypes.CDLL) -> None:
        self.lib = handle
        handle.cudnnGetVersion.restype = ctypes.c_size_t
        handle.cudnnGetErrorString.restype = ctypes.c_char_p
        handle.cudnnBackendCreateDescriptor.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
        handle.cudnnBackendDestroyDescriptor.argtypes = [ctypes.c_void_p]
        handle.cudnnBackendFinalize.argtypes = [ctypes.c_void_p]
        handle.cudnnBackendSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p]
        handle.cudnnBackendGetAttribute.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int64,
            ctypes.POINTER(ctypes.c_int64),
            ctypes.c_void_p,
        ]
        self.version = int(handle.cudnnGetVersion())

    def check(self, status: int, what: str) -> None:
        if status:
            raise CudnnError(f"cuDNN {what}: {self.lib.cudnnGetErrorString(status).decode()}")

    @contextmanager
    def descriptors(self) -> Iterator[Callable[[int], ctypes.c_void_p]]:
        """A scope whose descriptors are destroyed when it ends: yields ``create(type)``."""
        made: list[ctypes.c_void_p] = []

        def create(kind: int) -> ctypes.c_void_p:
            descriptor = ctypes.c_void_p()
            self.check(self.lib.cudnnBackendCreateDescriptor(kind, ctypes.byref(descriptor)), f"descriptor {kind}")
            made.append(descriptor)
            return descriptor

        try:
            yield create
        finally:
            for descriptor in reversed(made):
                self.lib.cudnnBackendDestroyDescriptor(descriptor)

    def set(self, descriptor: ctypes.c_void_p, name: int, kind: str | int, values: Sequence[Any]) -> None:
        code = _TYPES[kind] if isinstance(kind, str) else kind
        if kind == "descriptor":
            array: Any = (ctypes.c_void_p * len(values))(*[v.value for v in values])
        elif kind == "int64":
            array = (ctypes.c_int64 * len(values))(*values)
        elif kind == "float":
            array = (ctypes.c_float * len(values))(*values)
        elif kind == "double":
            array = (ctypes.c_double * len(values))(*values)
        elif kind == "char":
            array = ctypes.create_string_buffer(values[0])
            self.check(self.lib.cudnnBackendSetAttribute(descriptor, name, code, len(values[0]) + 1, array), f"attribute {name}")
            return
        else:  # an enumeration or int32
            array = (ctypes.c_int32 * len(values))(*values)
        self.check(self.lib.cudnnBackendSetAttribute(descriptor, name, code, len(values), array), f"attribute {name}")

    def finalize(self, descriptor: ctypes.c_void_p, what: str) -> None:
        self.check(self.lib.cudnnBackendFinalize(descriptor), f"finalize {what}")

    def count(self, descriptor: ctypes.c_void_p, name: int, kind: int) -> int:
        found = ctypes.c_int64()
        self.check(self.lib.cudnnBackendGetAttribute(descriptor, name, kind, 0, ctypes.byref(found), None), f"attribute {name}")
        return found.value

    def get_int64(self, descriptor: ctypes.c_void_p, name: int) -> int:
        value, found = ctypes.c_int64(), ctypes.c_int64()
        status = self.lib.cudnnBackendGetAttribute(descriptor, name, _TYPES["int64"], 1, ctypes.byref(found), ctypes.byref(value))
        self.check(status, f"attribute {name}")
        return value.value

    def get_descriptors(self, descriptor: ctypes.c_void_p, name: int, into: list[ctypes.c_void_p]) -> int:
        array = (ctypes.c_void_p * len(into))(*[d.value for d in into])
        found = ctypes.c_int64()
        status = self.lib.cudnnBackendGetAttribute(descriptor, name, _TYPES["descriptor"], len(into), ctypes.byref(found), array)
        self.check(status, f"attribute {name}")
        return found.value

    def get_enums(self, descriptor: ctypes.c_void_p, name: int, kind: int) -> list[int]:
        array, found = (ctypes.c_int32 * 32)(), ctypes.c_int64()
        self.check(self.lib.cudnnBackendGetAttribute(descriptor, name, kind, 32, ctypes.byref(found), array), f"attribute {name}")
        return list(array[: found.value])


@functools.cache
def library() -> _Library | None:
    """The cuDNN that PyTorch here loads, if it can describe a GPU that is not present (9.8 and later)."""
    if not torch.backends.cudnn.is_available():  # type: ignore[no-untyped-call]
        return None
    # by name first: the library PyTorch has loaded; else the one its CUDA wheels install
    names = ["libcudnn.so.9", "cudnn64_9.dll"]
    wheel = importlib.util.find_spec("nvidia.cudnn") if importlib.util.find_spec("nvidia") else None
    directories = list(wheel.submodule_search_locations or []) if wheel is not None else []
    for directory in directories:
        names += [os.path.join(directory, "lib", "libcudnn.so.9"), os.path.join(directory, "bin", "cudnn64_9.dll")]
    for name in names:
        try:
            loaded = _Library(ctypes.CDLL(name))
        except (OSError, AttributeError):
            continue
        return loaded if loaded.version >= MIN_VERSION else None
    return None


def workspace_bytes(convolution: Convolution, gpu: Device) -> int | None:
    """The workspace PyTorch takes for ``convolution`` on ``gpu`` (see the module's notes); ``None``
    where it cannot be known here."""
    if library() is None or torch.backends.cudnn.benchmark:
        return None
    deterministic = bool(torch.backends.cudnn.deterministic) or torch.are_deterministic_algorithms_enabled()
    mode = _MODE_B if os.environ.get("TORCH_CUDNN_USE_HEURISTIC_MODE_B") else _INSTANT
    tf32 = bool(torch.backends.cudnn.allow_tf32)
    try:
        return _workspace(convolution, _device_json(gpu), gpu.capability, mode, deterministic, tf32)
    except CudnnError:  # an operation cuDNN cannot describe or rank: its workspace is not known
        return None


@functools.cache
def _device_json(gpu: Device) -> str:
    return json.dumps(device_properties(gpu))


@functools.lru_cache(maxsize=4096)
def _workspace(
    convolution: Convolution, device: str, capability: tuple[int, int], mode: int, deterministic: bool, tf32: bool
) -> int | None:
    cudnn = library()
    assert cudnn is not None
    dtype = convolution.x.dtype
    if dtype not in _DATA_TYPES:
        return None
    with cudnn.descriptors() as create:
        properties = create(_DEVICEPROP)
        cudnn.set(properties, _DEVICEPROP_JSON, "char", [device.encode()])
        cudnn.finalize(properties, "device properties")
        graph = _graph(cudnn, create, convolution)
        for source in (mode, _FALLBACK):  # the heuristics' configurations, then the fallback list's
            heuristics = create(_ENGINEHEUR)
            cudnn.set(heuristics, _HEUR_GRAPH, "descriptor", [graph])
            cudnn.set(heuristics, _HEUR_MODE, _TYPE_HEUR_MODE, [source])
            cudnn.set(heuristics, _HEUR_DEVICEPROP, "descriptor", [properties])
            cudnn.finalize(heuristics, "heuristics")
            configs = [create(_ENGINECFG) for _ in range(cudnn.count(heuristics, _HEUR_RESULTS, _TYPES["descriptor"]))]
            found = cudnn.get_descriptors(heuristics, _HEUR_RESULTS, configs) if configs else 0
            for config in configs[:found]:
                engine = create(_ENGINE)
                cudnn.get_descriptors(config, _CFG_ENGINE, [engine])
                notes = set(cudnn.get_enums(engine, _ENGINE_NOTES, _TYPE_NUMERICAL_NOTE))
                if _DOWN_CONVERT in notes or (deterministic and _NONDETERMINISTIC in notes):
                    continue
                if dtype == torch.float32 and not tf32 and _TENSOR_CORE in notes:
                    continue
                if _erratum(convolution, cudnn.get_int64(engine, _ENGINE_INDEX), cudnn.version, capability):
                    continue
                plan = create(_PLAN)
                cudnn.set(plan, _PLAN_CONFIG, "descriptor", [config])
                cudnn.set(plan, _PLAN_DEVICEPROP, "descriptor", [properties])
                if cudnn.lib.cudnnBackendFinalize(plan):
                    continue  # a plan that does not build is passed over, as PyTorch passes it
                return cudnn.get_int64(plan, _PLAN_WORKSPACE)
    return None


# the engines PyTorch will not run (``plan_errata_exception`` in Conv_v8.cpp): (operation, engine,
# first and last cuDNN versions (None: any), spatial dimensions (None: any), GPU major version (None: any))
ERRATA = (
    (FORWARD, 5, 92301, 92400, None, None),  # pytorch issue 188288
    (FORWARD, 23, 90800, 91500, 3, None),  # pytorch issue 163539
    (BACKWARD_DATA, 23, 8000, None, 3, None),
    (FORWARD, 58, 92300, None, None, 12),  # a cuBLASLt kernel that fails on sm_120
    (BACKWARD_DATA, 63, 92300, None, None, 12),
    (BACKWARD_FILTER, 63, 92300, None, None, 12),
)


def _erratum(convolution: Convolution, engine: int, version: int, capability: tuple[int, int]) -> bool:
    spatial = len(convolution.x.sizes) - 2
    for operation, index, first, last, dims, major in ERRATA:
        if operation == convolution.operation and index == engine and version >= first and (last is None or version <= last):
            if (dims is None or dims == spatial) and (major is None or major == capability[0]):
                return True
    return False


def _graph(cudnn: _Library, create: Callable[[int], ctypes.c_void_p], convolution: Convolution) -> ctypes.c_void_p:
    """The operation graph of ``convolution``, as Conv_v8.cpp's ``build_opgraph`` makes it."""
    tensors = []
    for uid, tensor in zip((ord("x"), ord("w"), ord("y")), (convolution.x, convolution.w, convolution.y)):
        descriptor = create(_TENSOR)
        cudnn.set(descriptor, _TENSOR_DATA_TYPE, _TYPE_DATA_TYPE, [_DATA_TYPES[tensor.dtype]])
        cudnn.set(descriptor, _TENSOR_DIMS, "int64", list(tensor.sizes))
        cudnn.set(descriptor, _TENSOR_STRIDES, "int64", list(tensor.strides))
        cudnn.set(descriptor, _TENSOR_UID, "int64", [uid])
        cudnn.set(descriptor, _TENSOR_ALIGNMENT, "int64", [tensor.alignment])
        cudnn.finalize(descriptor, "tensor")
        tensors.append(descriptor)
    x, w, y = tensors
    # half precision computes in float (getConvDescriptor)
    compute = _DATA_TYPES[torch.float64 if convolution.x.dtype == torch.float64 else torch.float32]
    conv = create(_CONVOLUTION)
    spatial = len(convolution.padding)
    cudnn.set(conv, _CONV_COMPUTE, _TYPE_DATA_TYPE, [compute])
    cudnn.set(conv, _CONV_MODE, _TYPE_CONVOLUTION_MODE, [_CROSS_CORRELATION])
    cudnn.set(conv, _CONV_DIMS, "int64", [spatial])
    cudnn.set(conv, _CONV_DILATIONS, "int64", list(convolution.dilation))
    cudnn.set(conv, _CONV_STRIDES, "int64", list(convolution.stride))
    cudnn.set(conv, _CONV_PRE, "int64", list(convolution.padding))
    cudnn.set(conv, _CONV_POST, "int64", list(convolution.padding))
    cudnn.finalize(conv, "convolution")
    kind = _OPERATIONS[convolution.operation]
    alpha, beta, desc, w_name, x_name, y_name = _OPERATION_ATTRIBUTES[kind]
    operation = create(kind)
    scale = "double" if convolution.x.dtype == torch.float64 else "float"
    cudnn.set(operation, alpha, scale, [1.0])
    cudnn.set(operation, beta, scale, [0.0])
    cudnn.set(operation, desc, "descriptor", [conv])
    cudnn.set(operation, w_name, "descriptor", [w])
    cudnn.set(operation, x_name, "descriptor", [x])
    cudnn.set(operation, y_name, "descriptor", [y])
    cudnn.finalize(operation, "operation")
    graph = create(_GRAPH)
    cudnn.set(graph, _GRAPH_OPS, "descriptor", [operation])
    cudnn.finalize(graph, "operation graph")
    return graph


# ATen's side: which convolutions go to cuDNN, and how they are described to it ----------------


def conv_memory_format(input: torch.Tensor, weight: torch.Tensor) -> torch.memory_format:
    """``cudnn_conv_suggest_memory_format``: channels-last where the input's or the weight's
    ``suggest_memory_format`` is (not for float64)."""
    if torch.float64 in (input.dtype, weight.dtype) or input.dim() not in (4, 5):
        return torch.contiguous_format
    for tensor in (input, weight):
        suggested = suggest_memory_format(tensor)
        if suggested != torch.contiguous_format:
            return suggested
    return torch.contiguous_format


def uses_cudnn(input: torch.Tensor, weight: torch.Tensor, transposed: bool, groups: int) -> bool:
    """Whether ATen's ``select_conv_backend`` runs this CUDA convolution on cuDNN
    (aten/src/ATen/native/Convolution.cpp): a floating-point convolution of 1 to 3 spatial
    dimensions with a non-empty batch, except a depthwise one (as many groups as input channels)
    in the contiguous layout, which runs ATen's own depthwise kernels. (PyTorch's cuDNN depthwise
    path for some half-precision shapes is not followed.)"""
    if not torch.backends.cudnn.enabled or input.dtype not in _DATA_TYPES or weight.dtype != input.dtype:
        return False
    if input.dim() not in (3, 4, 5) or input.shape[0] == 0 or input.numel() == 0:
        return False
    depthwise = not transposed and input.dim() in (4, 5) and groups > 1 and input.shape[1] == groups and weight.shape[0] % groups == 0
    return not depthwise or conv_memory_format(input, weight) != torch.contiguous_format


def convolutions(name: str, bound: dict[str, Any], out: Any) -> list[Convolution]:
    """cuDNN's operations, in the order they run, for ATen's ``convolution`` or ``convolution_backward``
    with arguments ``bound`` and outputs ``out`` on a CUDA device (none where cuDNN does not run it):
    a transposed convolution's forward pass is cuDNN's backward-data operation, and its input
    gradient cuDNN's forward one; one spatial dimension is described as two, the first of size 1."""
    input, weight = bound.get("input"), bound.get("weight")
    transposed, groups = bool(bound.get("transposed")), int(bound.get("groups") or 1)
    if not isinstance(input, torch.Tensor) or not isinstance(weight, torch.Tensor) or not uses_cudnn(input, weight, transposed, groups):
        return []
    memory_format = conv_memory_format(input, weight)
    last = memory_format != torch.contiguous_format
    flat = input.dim() == 3  # view4d
    padding, stride, dilation = (tuple(int(v) for v in bound[k]) for k in ("padding", "stride", "dilation"))
    if flat:
        padding, stride, dilation = (0, *padding), (1, *stride), (1, *dilation)

    def described(sizes: Sequence[int], source: torch.Tensor | None = None) -> Tensor:
        sizes = tuple(int(v) for v in sizes)
        if flat:
            sizes = (sizes[0], sizes[1], 1, sizes[2])
        # made contiguous in the memory format: a tensor already so keeps its storage offset
        strides = tuple(make_channels_last_strides_for(sizes) if last else make_contiguous_strides_for(sizes))
        if source is None or flat or not source.is_contiguous(memory_format=memory_format):
            return Tensor(sizes, strides, input.dtype)  # a new block, aligned to 32 bytes
        return Tensor(sizes, strides, input.dtype, alignment(source))

    x, w = described(input.shape, input), described(weight.shape, weight)

    def operation(kind: str, x: Tensor, y: Tensor) -> Convolution:
        return Convolution(kind, x, w, y, padding, stride, dilation)

    if name == "aten.convolution":
        if not isinstance(out, torch.Tensor) or out.numel() == 0:
            return []
        y = described(out.shape)
        # a transposed convolution's output is the input gradient of a convolution of it
        return [operation(BACKWARD_DATA, y, x) if transposed else operation(FORWARD, x, y)]
    grad_output, mask = bound.get("grad_output"), bound.get("output_mask") or (True, True, False)
    if not isinstance(grad_output, torch.Tensor) or grad_output.numel() == 0:
        return []
    dy = described(grad_output.shape, grad_output)
    operations = []
    if mask[0]:  # the input's gradient, then the weight's
        operations.append(operation(FORWARD, dy, x) if transposed else operation(BACKWARD_DATA, x, dy))
    if mask[1]:
        operations.append(operation(BACKWARD_FILTER, dy, x) if transposed else operation(BACKWARD_FILTER, x, dy))
    return operations
