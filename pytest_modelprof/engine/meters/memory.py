"""The memory meter: storage lifetimes, by category, over the run.

Every tensor an op produces is followed by its storage (views share one), from the op that allocated it
until the storage is freed (a weak reference to the storage, which PyTorch keeps one Python object for,
calls the meter back). Each storage belongs to one category; the meter keeps the bytes of every category
after each op, so the peak it reports is a true peak over time, with its breakdown then, not a sum of maxima.

Categories: parameters, buffers and inputs (resident from the start); gradients (what
``AccumulateGrad`` stores in ``.grad``); activations (saved for the backward pass, seen
by a saved-tensors hook); optimizer state; temporaries (everything else the run
allocates). A storage moves from temporaries to activations or gradients when it
becomes one; parameters, buffers, inputs and optimizer state never change category. The
inputs are every tensor the arguments reach, those objects hold included (a KV cache, a
``BlockMask``: :class:`..analytic.inputs.Inputs`); ``kv_cache_bytes`` is the KV cache's share.

A sharded step (:mod:`..distributed`) counts what its rank holds: a DTensor's local shard.
Its parameters are this rank's shards; ``unsharded_parameters`` are the storages FSDP2
allocates for the all-gathered parameters and frees at the reshard (by resizing them, which
no ATen op shows: :func:`..distributed.storage_resizes` tells the meter); the sharded
gradients are what FSDP2's reduce-scatter writes, and what ``.grad`` holds at the
optimizer step.

On fake tensors the same storages exist, without memory behind them, so analytic runs
give the figures of real ones. For CUDA targets each allocation is rounded up to the
caching allocator's 512-byte blocks, and the figure is allocated bytes: CPU tensors of the
step (the optimizer's step counters, host scalars) are not device memory and are left out;
the cuBLAS workspaces are held under ``workspace`` for the whole step and the allocator's
reserved segments estimated apart (:mod:`..targets.allocator`); what a kernel allocates
while it runs (:mod:`..targets.scratch`) is held under ``workspace`` for that op's moment.

In an analytic pass without grad, a repeated block is recorded once and replayed, moment by moment
(:mod:`..observe.memory_replay`, :mod:`..observe.blocks`).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten

from ...results import MEMORY_CATEGORIES, MemoryReport, ModuleStats, OpStats, Phase, Profile
from ..analytic.fake import RunTensors
from ..analytic.inputs import input_tensors
from ..distributed import local, storage_resizes
from ..observe import memory_replay
from ..observe.modules import ACCUMULATE_GRAD_SEQUENCE_NR, StackKey
from ..targets import cudnn
from ..targets.allocator import CUBLAS_OPS, reserved_bytes, workspace_bytes
from ..targets.gpus import GPUSpec
from ..targets.scratch import convolution_workspaces, kernel_scratch
from . import Meter, Op, Place

CATEGORIES = MEMORY_CATEGORIES
# the meter keeps its totals in a list, indexed by category
PARAMETERS, UNSHARDED, BUFFERS, INPUTS, GRADIENTS, ACTIVATIONS, TEMPORARIES, OPTIMIZER_STATE, WORKSPACE = range(len(CATEGORIES))
_STICKY = frozenset({PARAMETERS, UNSHARDED, BUFFERS, INPUTS, OPTIMIZER_STATE})
CUDA_BLOCK = 512
# collectives whose output is the sharded gradients (FSDP2's reduce-scatter, in the backward pass)
SHARDED_GRADIENT_OPS = frozenset({"c10d._reduce_scatter_base_", "c10d.reduce_scatter_tensor_coalesced_"})


class MemoryMeter(Meter):
    """Bytes per category after each op; the peak and where it fell.

    ``round_to`` is the allocation granularity: by default 512 bytes for a CUDA target
    (the caching allocator's blocks) and 1 otherwise, decided when the run starts.
    ``gpu`` is the target GPU of a CUDA run (its compute capability sets the cuBLAS
    workspace; on a real GPU, the device's own capability is read instead).
    """

    def __init__(self, round_to: int | None = None, gpu: GPUSpec | None = None) -> None:
        self._asked = round_to
        self._gpu = gpu
        # CUDA targets: the matrix products run by the step's thread and by the autograd engine's
        self.matmuls: tuple[set[str], set[str]] = (set(), set())
        self._set_rounding(round_to or 1)
        self.live: dict[int, list[int]] = {}  # storage address -> [bytes, category]
        self.totals = [0] * len(CATEGORIES)
        self.category_max = [0] * len(CATEGORIES)  # each category's most bytes: from the timeline, as the meter contributes
        self.peak = 0
        self.peak_breakdown = [0] * len(CATEGORIES)
        self.peak_where: tuple[Phase, StackKey] = ("forward", ())
        self.timeline: list[tuple[Phase, tuple[int, ...]]] = []
        self.module_activations: dict[str, int] = {}
        self.module_peaks: dict[tuple[str, bool], int] = {}  # (path, in backward) -> most bytes in use
        self._peaked: tuple[Any, bool, int] = ((), False, 0)  # the last sample that raised module peaks: (stack, backward, bytes)
        self.allocated = 0  # bytes of new storages so far: the difference across an op is what it allocated
        self.parameters: list[tuple[str, int, int]] = []  # (name, weight bytes, gradient bytes)
        self.kv_cache_bytes = 0  # of the inputs' bytes, those of a KV cache (see analytic.inputs.Inputs)
        self.op_bytes: dict[tuple[Phase, StackKey, str], list[int]] = {}  # (phase, stack, op) -> [calls, bytes allocated]
        self._run: RunTensors | None = None
        self._target: torch.device | None = None
        self._real_cuda = False
        self._host_apart = False
        self._kernels: tuple[int, tuple[int, int]] | None = None  # a CUDA step's SM count and compute capability
        self._scratches = 0
        self._cudnn_workspace: int | None = 0  # the largest of cuDNN's convolution workspaces; None: not known
        self._cudnn_device: cudnn.Device | None = None  # the GPU cuDNN plans the convolutions for
        self._marks: dict[str, int] = {}  # event indices: where the step begins, the state, first products, the optimizer
        self.measured: dict[str, int] = {}  # a real CUDA run: the caching allocator's figures for the step
        self._watches: list[weakref.ref[Any]] = []  # each followed storage's, whose callback frees it (see _watch)
        self._resizes: Any = None  # FSDP2's storage resizes, told to the meter during the run
        self._capture: memory_replay.Capture | None = None  # a block's call under no_grad, recorded
        self._open = True

    def _set_rounding(self, round_to: int) -> None:
        self.round_to = round_to
        # for CUDA targets, every allocation (address, bytes) and free (address, -1) in order,
        # replayed by the caching-allocator model of the reserved-memory estimate
        self.events: list[tuple[Any, int]] | None = [] if round_to > 1 else None

    # the run's events ----------------------------------------------------------

    def start(self, run: RunTensors, target: torch.device) -> None:
        self._set_rounding(self._asked or (CUDA_BLOCK if target.type == "cuda" else 1))
        # (not kept: an input the step drops, a cache's keys replaced by their concatenation, is freed)
        inputs, kv_cache = input_tensors(run.args, run.kwargs)
        tensors = [*tree_flatten((run.params, run.buffers))[0], *inputs]
        self._real_cuda = target.type == "cuda" and torch.cuda.is_available() and not any(isinstance(t, FakeTensor) for t in tensors)
        if self._real_cuda:  # the allocator's own figures for the step, beside the modelled ones
            torch.cuda.synchronize(target)
            torch.cuda.reset_peak_memory_stats(target)
            self.measured = {"start_allocated_bytes": torch.cuda.memory_allocated(target)}
        self._run = run
        self._target = target
        self._cudnn_workspace, self._cudnn_device = 0, None
        self._host_apart = target.type == "cuda"  # a CUDA step's CPU tensors are not device memory
        if self._gpu is not None:  # a CUDA target (a sharded step's CPU mesh stands for its GPUs)
            self._kernels = (self._gpu.sm_count, self._gpu.compute_capability)
            self._cudnn_device = cudnn.Device.of(self._gpu)
        elif self._real_cuda:
            properties = torch.cuda.get_device_properties(target)
            self._kernels = (properties.multi_processor_count, (properties.major, properties.minor))
            self._cudnn_device = cudnn.Device.present(target)
        self.track_all(run.params, PARAMETERS)
        self.track_all(run.buffers, BUFFERS)
        self.track_all(inputs, INPUTS)  # those objects hold (a KV cache, a BlockMask) included
        cache = {part.untyped_storage()._cdata for t in kv_cache for part in _parts(t)}
        self.kv_cache_bytes = sum(self.live[address][0] for address in cache if address in self.live)
        self.track_all([t.grad for t in run.params.values() if t.grad is not None], GRADIENTS)
        self._resizes = storage_resizes(self._resized_up, self._resized_down)  # FSDP2's, which no op shows
        self._resizes.__enter__()
        state_from = len(self.events or ())
        if run.optimizer is not None:
            self.track_all(list(run.optimizer.state.values()), OPTIMIZER_STATE)
        # for the reserved estimate: where the step's own events begin, and which made the state
        self._marks = {"state": state_from, "step": len(self.events or ())}

    def op(self, op: Op) -> None:
        before = self.allocated
        if self.events is not None and op.name in CUBLAS_OPS:
            thread = int(op.phase in ("backward", "recompute"))
            self._marks.setdefault(f"matmul{thread}", len(self.events))
            self.matmuls[thread].add(op.name)
        if op.node is not None and op.node._sequence_nr() == ACCUMULATE_GRAD_SEQUENCE_NR:
            self.track_all(op.out, GRADIENTS)  # what AccumulateGrad stores in .grad
        elif op.name in SHARDED_GRADIENT_OPS and op.phase == "backward":
            self.track_all(op.args[0], GRADIENTS)  # FSDP2's reduce-scatter output: the sharded gradients are its views
        elif _returns_views(op.func):  # a view of memory the step did not allocate is not an allocation
            for value in tree_flatten(op.out)[0]:
                if isinstance(value, torch.Tensor) and all(part.untyped_storage()._cdata in self.live for part in _parts(value)):
                    self.track(value, TEMPORARIES)
        else:
            self.track_all(op.out, TEMPORARIES)
        if self._kernels is not None:
            self._scratch(op)
        self.sample(op.phase, op.key)
        key = (op.phase, op.key, op.name)
        row = self.op_bytes.get(key)
        if row is None:
            self.op_bytes[key] = [1, self.allocated - before]
        else:
            row[0] += 1
            row[1] += self.allocated - before
        if self._capture is not None:
            self._capture.row(key, self.allocated - before)

    def _scratch(self, op: Op) -> None:
        """Kernel scratch (:mod:`..targets.scratch`): allocated after the op's outputs, freed before
        it returns; the moment it is held is sampled on its own."""
        source = op.args[0] if op.args else None
        if not isinstance(source, torch.Tensor) or local(source) is not source or (self._host_apart and source.device.type == "cpu"):
            return  # (a DTensor's op: its kernels run on its local shards)
        assert self._kernels is not None
        if self._cudnn_device is not None:  # cuDNN's workspaces, one at a time
            sizes = convolution_workspaces(op.name, op.func, op.args, op.kwargs, op.out, self._cudnn_device)
            if sizes is None:
                self._cudnn_workspace = None
            for size in (self._rounded(size) for size in sizes or ()):
                self._hold(op, [size])
                if self._cudnn_workspace is not None:
                    self._cudnn_workspace = max(self._cudnn_workspace, size)
        self._hold(op, [self._rounded(size) for size in kernel_scratch(op.name, op.func, op.args, op.kwargs, op.out, *self._kernels)])

    def _hold(self, op: Op, sizes: list[int]) -> None:
        """Scratch of ``sizes`` allocated together at ``op``'s moment, sampled, and freed."""
        if not sizes:
            return
        keys = []
        for size in sizes:
            self._scratches += 1
            keys.append(("scratch", self._scratches))
            if self.events is not None:
                self.events.append((keys[-1], size))
        self.totals[WORKSPACE] += sum(sizes)
        self.sample(op.phase, op.key)
        self.totals[WORKSPACE] -= sum(sizes)
        if self.events is not None:
            self.events.extend((key, -1) for key in reversed(keys))

    def saved(self, tensor: torch.Tensor, key: StackKey) -> None:
        """A saved-tensors hook saw ``tensor``: it lives on until the backward pass uses it."""
        parts = _parts(tensor)
        entry = self.live.get(parts[-1].untyped_storage()._cdata) if parts else None
        first_time = entry is None or entry[1] == TEMPORARIES
        address = self._track(parts, ACTIVATIONS)
        if first_time and address in self.live and self.live[address][1] == ACTIVATIONS:
            for path in key:
                self.module_activations[path] = self.module_activations.get(path, 0) + self.live[address][0]

    def region(self, name: str) -> None:
        if name == "optimizer" and self.events is not None:
            self._marks["optimizer"] = len(self.events)
        # weight and gradient bytes of each parameter, once the backward pass has made the gradients
        # (before the optimizer step, whose zero_grad may free them); an inference step has none
        if name in ("optimizer", "end") and self._run is not None:
            # gradients set outside an op (FSDP2 sets its sharded .grad in Python) are gradients by now
            self.track_all([t.grad for t in self._run.params.values() if t.grad is not None], GRADIENTS)
        if name in ("optimizer", "end") and not self.parameters and self._run is not None:
            self.parameters = [(param, _nbytes(t), _nbytes(t.grad) if t.grad is not None else 0) for param, t in self._run.params.items()]

    def stop(self) -> None:
        """Stop following storages: no finalizer outlives the run."""
        if self._real_cuda and self._target is not None:
            torch.cuda.synchronize(self._target)
            self.measured["max_allocated_bytes"] = torch.cuda.max_memory_allocated(self._target)
            self.measured["max_reserved_bytes"] = torch.cuda.max_memory_reserved(self._target)
        self._open = False
        if self._resizes is not None:
            self._resizes.__exit__(None, None, None)
            self._resizes = None
        self._watches.clear()  # (a weak reference that dies first calls nothing)

    # tensors ---------------------------------------------------------------

    def track(self, tensor: torch.Tensor, category: int) -> int:
        """Follow ``tensor``'s storage (once), in ``category`` unless it already has a fixed one
        (not a CPU tensor of a CUDA step: the optimizer's step counters, host scalars); a sparse
        tensor's, those of its indices and values (the address returned: its values')."""
        return self._track(_parts(tensor), category)

    def _track(self, parts: list[torch.Tensor], category: int) -> int:
        address = 0
        for part in parts:
            address = self._follow(part.untyped_storage(), part, category)
        return address

    def _follow(self, storage: Any, part: torch.Tensor, category: int) -> int:
        """Follow ``storage`` (``part``'s) until it is freed."""
        address: int = storage._cdata
        if self._host_apart and part.device.type == "cpu":
            return address
        entry = self.live.get(address)
        if entry is None:
            size = storage.nbytes()
            if self.events is not None:
                self.events.append((address, size))
            size = self._rounded(size)
            self.live[address] = [size, category]
            self.totals[category] += size
            self.allocated += size
            self._watch(storage, address)
        elif entry[1] != category and entry[1] not in _STICKY and not (category == ACTIVATIONS and entry[1] == GRADIENTS):
            self.totals[entry[1]] -= entry[0]
            self.totals[category] += entry[0]
            entry[1] = category
        return address

    def _rounded(self, size: int) -> int:
        """``size`` in whole allocation blocks (``round_to``)."""
        return -(-size // self.round_to) * self.round_to

    def track_all(self, values: Any, category: int) -> None:
        if isinstance(values, torch.Tensor):  # (most ops' output)
            self.track(values, category)
            return
        for value in tree_flatten(values)[0]:
            if isinstance(value, torch.Tensor):
                self.track(value, category)

    def _resized_up(self, tensor: torch.Tensor) -> None:
        """FSDP2 gave an unsharded parameter's storage (or an all-gather buffer) its bytes."""
        storage = tensor.untyped_storage()
        entry = self.live.get(storage._cdata)
        if entry is None:
            self.track(tensor, UNSHARDED)
            return
        size = self._rounded(storage.nbytes())
        self.totals[entry[1]] -= entry[0]
        entry[0], entry[1] = size, UNSHARDED
        self.totals[UNSHARDED] += size
        self.allocated += size
        if self.events is not None:
            self.events.append((storage._cdata, -1))
            self.events.append((storage._cdata, storage.nbytes()))

    def _resized_down(self, tensor: torch.Tensor) -> None:
        """FSDP2 is about to free an unsharded parameter's storage (resize it to 0 bytes)."""
        address = tensor.untyped_storage()._cdata
        entry = self.live.get(address)
        if entry is not None:
            self.totals[entry[1]] -= entry[0]
            entry[0] = 0
            if self.events is not None:
                self.events.append((address, -1))

    def _watch(self, storage: Any, address: int) -> None:
        """Free ``address`` in the meter when ``storage`` is freed (while the meter follows storages)."""
        self._watches.append(weakref.ref(storage, functools.partial(self._free, address)))

    def _free(self, address: int, _: Any = None) -> None:
        entry = self.live.pop(address, None)
        if entry is not None and self._open:
            self.totals[entry[1]] -= entry[0]
            if self.events is not None:
                self.events.append((address, -1))

    # a block's call under no_grad, recorded and replayed (observe/memory_replay.py) --------------------

    def start_capture(self) -> None:
        self._capture = memory_replay.Capture(self)

    def end_capture(self) -> memory_replay.Recording | None:
        capture, self._capture = self._capture, None
        return capture.done(self) if capture is not None else None

    def replay(self, recording: Any, place: Place) -> None:
        memory_replay.replay(self, recording, place)

    def closes(self, recording: Any, outputs: list[torch.Tensor]) -> bool:
        return recording is not None and bool(recording.closes(outputs))

    def made(self, recording: Any, outputs: list[torch.Tensor]) -> None:
        memory_replay.follow(self, recording, outputs)

    # time --------------------------------------------------------------------

    def sample(self, phase: Phase, key: StackKey) -> None:
        """Record the bytes per category after an op, and the peak."""
        totals = tuple(self.totals)
        self.timeline.append((phase, totals))
        if self._capture is not None:
            self._capture.sample(phase, key, totals)
        total = sum(totals)
        if total > self.peak:
            self.peak = total
            self.peak_breakdown = list(totals)
            self.peak_where = (phase, key)
        backward = phase in ("backward", "recompute")
        if key is not self._peaked[0] or backward is not self._peaked[1] or total > self._peaked[2]:  # (else each path saw more)
            for path in key:
                if total > self.module_peaks.get((path, backward), 0):
                    self.module_peaks[(path, backward)] = total
            self._peaked = (key, backward, total)

    # the profile ----------------------------------------------------------------

    def contribute(self, profile: Profile, modules: dict[str, ModuleStats]) -> None:
        workspaces = self._workspaces() if self.events is not None else []
        self.category_max = [max(column) for column in zip(self.category_max, *(row for _, row in self.timeline))]
        self._add_workspace(sum(workspaces))
        phase, key = self.peak_where
        profile.memory = MemoryReport(
            peak_bytes=self.peak,
            peak_phase=phase,
            peak_module=key[-1] if key else "",
            peak_breakdown=dict(zip(CATEGORIES, self.peak_breakdown)),
            category_max=dict(zip(CATEGORIES, self.category_max)),
            categories=list(CATEGORIES),
            timeline=[(phase, list(row)) for phase, row in self.timeline],
            block_bytes=self.round_to,
            parameters=self.parameters,
            kv_cache_bytes=self.kv_cache_bytes,
            estimates=self._cuda_estimates(workspaces) if self.events is not None else {},
            measured=dict(self.measured),
        )
        profile.peak_memory_bytes = self.peak
        if profile.train:  # what the backward pass needs kept: the tensors saved for it
            profile.peak_activation_bytes = self.category_max[ACTIVATIONS]
        else:  # nothing is kept for a backward pass: the intermediate tensors alive at once
            profile.peak_activation_bytes = max((row[ACTIVATIONS] + row[TEMPORARIES] for _, row in self.timeline), default=0)
        for path, stats in modules.items():
            stats.activation_bytes = self.module_activations.get(path, 0)
            stats.forward_peak_bytes = self.module_peaks.get((path, False), 0)
            stats.backward_peak_bytes = self.module_peaks.get((path, True), 0)
        self._add_op_bytes(profile)

    def _add_op_bytes(self, profile: Profile) -> None:
        """The bytes each operator allocated, on the operator table: on the rows the FLOP meter
        made where it ran (an op it could not count stays out of the table), else on rows of its own."""
        rows = {(row.op, row.phase): row for row in profile.ops}
        for (phase, key, name), (calls, allocated) in self.op_bytes.items():
            row = rows.get((name, phase))
            if row is None:
                if profile.flops_counted:
                    continue
                row = rows[(name, phase)] = OpStats(name, phase)
                profile.ops.append(row)
            if not profile.flops_counted:
                row.calls += calls
                if key:
                    row.modules.append(key[-1])
            row.allocated_bytes += allocated

    def _workspaces(self) -> list[int]:
        """The cuBLAS workspaces of each thread of the step (see :func:`..targets.allocator.workspace_bytes`)."""
        if self._target is not None and self._target.type == "cuda" and torch.cuda.is_available() and self._gpu is None:
            capability = torch.cuda.get_device_capability(self._target)
        else:
            capability = self._gpu.compute_capability if self._gpu is not None else (0, 0)
        return [workspace_bytes(capability, ops) for ops in self.matmuls]

    def _add_workspace(self, workspace: int) -> None:
        """Workspace allocated before the step (in an earlier one) and held: a constant under the whole timeline."""
        if not workspace:
            return
        self.totals[WORKSPACE] += workspace
        self.category_max[WORKSPACE] += workspace
        self.peak += workspace
        self.peak_breakdown[WORKSPACE] += workspace
        self.timeline = [(phase, (*row[:WORKSPACE], row[WORKSPACE] + workspace, *row[WORKSPACE + 1 :])) for phase, row in self.timeline]
        for where in self.module_peaks:
            self.module_peaks[where] += workspace

    def _cuda_estimates(self, workspaces: list[int]) -> dict[str, int | None]:
        """What a CUDA process holds beyond the allocated bytes, estimated (see :mod:`..targets.allocator`)."""
        history = self._allocator_history(workspaces)
        largest = self._cudnn_workspace if self._cudnn_device is not None else None
        return {"reserved_bytes": reserved_bytes(history), "cudnn_workspace_bytes": largest, "cuda_context_bytes": None}

    def _allocator_history(self, workspaces: list[int]) -> list[tuple[Any, int]]:
        """The caching allocator's requests up to the end of a steady step, as a training script
        makes them: the resident tensors; a first step, in which the optimizer creates its state
        when it first steps and each thread's cuBLAS workspace comes at its first matrix product;
        then the steady step this run followed (state and workspaces resident)."""
        events = self.events or []
        marks = self._marks
        resident, state, step = events[: marks["state"]], events[marks["state"] : marks["step"]], events[marks["step"] :]
        inserts: dict[int, list[tuple[Any, int]]] = {}
        if "optimizer" in marks:
            inserts.setdefault(marks["optimizer"], []).extend(state)
        else:
            resident = resident + state
        for thread, size in enumerate(workspaces):
            if size:
                inserts.setdefault(marks[f"matmul{thread}"], []).append((("workspace", thread), size))
        first: list[tuple[Any, int]] = []
        for index, (key, size) in enumerate(step, start=marks["step"]):
            first.extend(inserts.pop(index, ()))
            first.append((("first", key), size))
        for leftover in inserts.values():
            first.extend(leftover)
        return [*resident, *first, *step]


@functools.cache
def _returns_views(func: Any) -> bool:
    """Whether every output of ``func`` aliases an input (a view, ``detach``, an op that writes in place): its
    storage exists before the op, whether or not the step allocated it (a tensor the model holds outside its
    parameters and buffers, as VideoMAE holds its position table)."""
    returns = getattr(getattr(func, "_schema", None), "returns", None) or []
    return bool(returns) and all(r.alias_info is not None for r in returns)


def _nbytes(tensor: torch.Tensor) -> int:
    """A tensor's own bytes (this rank's shard of a DTensor): views of one storage (FSDP2's
    sharded gradients of a module share its reduce-scatter output) each count their part."""
    return sum(part.numel() * part.element_size() for part in _parts(tensor))


def _parts(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The dense tensors that hold ``tensor``'s memory: itself (a DTensor's local shard); a sparse
    tensor's indices and values (COO), or its compressed and plain indices and values; none for a
    layout without storages (MKL-DNN)."""
    layout = tensor.layout
    if layout == torch.strided:
        return [local(tensor)]
    with _disable_current_modes():  # the meter's own reads: no op of the step
        if layout == torch.sparse_coo:
            return [tensor._indices(), tensor._values()]
        if layout in (torch.sparse_csr, torch.sparse_bsr):
            return [tensor.crow_indices(), tensor.col_indices(), tensor.values()]
        if layout in (torch.sparse_csc, torch.sparse_bsc):
            return [tensor.ccol_indices(), tensor.row_indices(), tensor.values()]
    return []
