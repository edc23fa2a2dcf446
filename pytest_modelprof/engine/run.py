"""One profile run: build the workload, attach the meters, run it, assemble the profile.

Real runs execute on CPU or CUDA tensors; analytic runs (``device="meta"``, or a model
or inputs that are already fake tensors) on fake tensors that claim the model's real
device (:mod:`.analytic.fake`). Every meter sees the same dispatched ops, with phase and module
(:mod:`.observe.dispatch`); timing runs the same step afterwards, on real tensors and apart from
the meters (:mod:`.timing`).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ..results import PredictedReport, Profile
from .assemble import assemble, roll_up_containers
from .distributed import Parallel, Parallelize, fake_world, shape_propagation_apart, sharded_copy, transparent_types
from .errors import ProfileError
from .formulas import FormulaTable
from .meters import Meter
from .meters.collectives import CollectiveMeter
from .meters.flops import FlopMeter
from .meters.memory import CUDA_BLOCK, MemoryMeter
from .meters.predicted import PredictedMeter
from .observe.blocks import BlockMemo, CalledAgain
from .observe.dispatch import Dispatcher
from .observe.memo import LeafMemo
from .observe.modules import ModuleTracker
from .targets.catalog import gpu_spec
from .targets.collectives import collective_seconds
from .targets.gpus import GPUSpec
from .timing.latency import Timing, batch_size_of, measure_latency
from .timing.layers import layer_times
from .workload import Run, Sharded, Workload, parse_device


def profile(
    model: nn.Module,
    inputs: Any = (),
    *,
    train: bool = False,
    loss_fn: Any = None,
    device: str | torch.device | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    flops: bool = True,
    memory: bool = True,
    no_grad: bool = True,
    set_to_none: bool = True,
    autocast: torch.dtype | None = None,
    latency: bool | Timing = False,
    formulas: Mapping[Any, Any] | None = None,
    meters: Sequence[Meter] = (),
    target: str | GPUSpec | None = None,
    world_size: int | None = None,
    parallelize: Parallelize | None = None,
    rank: int = 0,
    mesh: tuple[int, ...] | dict[str, int] | None = None,
) -> Profile:
    """Profile one forward pass (``train=False``) or one training step of ``model``.

    ``inputs`` is a tensor, a tuple (or list) of positional inputs, a dict of keyword
    inputs, or a pair ``(args_tuple, kwargs_dict)``. Inference runs the model in eval
    mode under ``torch.no_grad()``; ``train=True`` runs it in train mode and profiles
    the forward pass, the loss (``loss_fn(output)``, by default the sum of every
    floating-point tensor in the output) and the backward pass.

    With ``optimizer`` (``train=True`` only) the step goes on: ``optimizer.step()`` and
    ``zero_grad()``, run by a copy of the optimizer (same class, hyperparameters and
    state) over the run's tensors, so the caller's optimizer and its state are left as
    they were. The figures are those of a steady-state step: an optimizer that has no
    state yet (it creates it lazily) first takes one unmetered step on zero gradients,
    so its state is resident from the start, as in every step after the first.

    ``device=None`` runs on the device of the model's parameters; ``"cpu"`` or
    ``"cuda"`` runs there (the caller's model is not moved); ``"meta"`` is analytic
    mode: fake tensors, no allocation, no computation, the same figures.

    ``flops=True`` counts FLOPs and MACs; ``memory=True`` follows memory in the same pass
    (``Profile.memory``, ``peak_memory_bytes``, ``peak_activation_bytes``). Either can be
    turned off: ``memory=False`` counts FLOPs only (the cheapest pass), ``flops=False``
    follows memory only (``Profile.flops_counted`` is then False). ``formulas={op: formula}``
    adds FLOP formulas for this run only (see :func:`register_flop_formula`). ``meters=[...]``
    adds meters of your own (:class:`~pytest_modelprof.engine.meters.Meter`): they see the
    same ops, with phase and module, as the engine's.
    ``no_grad=False`` runs inference with grad enabled (what autograd saves is kept, as
    when a forward pass is not wrapped in ``torch.no_grad()``). ``set_to_none=False``
    makes the step's ``zero_grad`` zero gradients in place instead of freeing them: they
    are then resident from the start of the step, as in every step after the first.
    ``autocast=torch.bfloat16`` (or ``torch.float16``) runs the forward pass and the loss
    under ``torch.autocast`` on the run's device, as mixed-precision training does.

    ``latency=True`` (or a :class:`Timing`) then times the same workload on real tensors,
    apart from the meters: ``Profile.latency`` holds the repeats and their statistics,
    ``latency_seconds`` the median and ``machine`` what it ran on. ``Timing(layers=True)``
    adds per-module times (on ``Profile.modules``) and per-operator times
    (``Profile.op_times``) from :mod:`torch.profiler`, whose raw events stay on
    ``Profile.profiler_events``.

    ``world_size=N`` with ``parallelize=fn`` profiles rank ``rank`` of a sharded step: the
    engine sets up a fake process group of N ranks and a device mesh (``mesh``: its shape,
    ``(N,)`` by default, or ``{"dp": 8, "tp": 8}`` for named dimensions), calls
    ``fn(copy, mesh)`` on a copy of the model (``fully_shard``, ``parallelize_module``, or a
    wrapper it returns such as DDP), runs one unmetered step (FSDP2's setup, the optimizer's
    state), then the metered one, and tears the process group down. Figures are the rank's:
    FLOPs of its shards, memory it holds (``unsharded_parameters`` for FSDP2's all-gathered
    copies), and ``Profile.collectives``. ``device="meta"`` shards on the meta device, with no memory.
    With ``target=``, memory is counted in the caching allocator's blocks and the predicted time
    includes the collectives over the GPU's links (see :class:`~pytest_modelprof.results.PredictedReport`).

    While the metered step runs, the garbage collector makes no automatic full collection (its
    young ones go on); its thresholds are given back when the step ends.
    """
    device = parse_device(device) if device is not None else None
    if autocast is not None and autocast not in _AUTOCAST:
        raise ValueError(f"autocast= takes the lower precision to run in, torch.bfloat16 or torch.float16, got {autocast!r}")
    parallel = Parallel.build(world_size, parallelize, rank, mesh)
    if parallel is not None:
        if latency:
            raise ProfileError("world_size= profiles one rank under a fake process group, which moves no data: there is nothing to time")
        options = {"train": train, "loss_fn": loss_fn, "optimizer": optimizer, "no_grad": no_grad, "set_to_none": set_to_none}
        gpu = gpu_spec(target) if target is not None else None
        return _sharded(model, inputs, parallel, device, options, FormulaTable(formulas), flops, memory, meters, autocast, gpu)
    workload = Workload.build(
        model,
        inputs,
        train=train,
        loss_fn=loss_fn,
        device=device,
        optimizer=optimizer,
        no_grad=no_grad,
        set_to_none=set_to_none,
        autocast=autocast,
        target=target,
    )
    timing = Timing() if latency is True else latency or None
    if timing is not None and not isinstance(timing, Timing):
        raise TypeError(f"latency must be True, False or a Timing, got {type(latency).__name__}")
    if timing is not None and workload.analytic:
        raise ProfileError("latency needs real tensors: an analytic run (device='meta', fake tensors) computes nothing to time")
    for meter in meters:
        if not isinstance(meter, Meter):
            raise TypeError(f"meters= takes instances of pytest_modelprof.engine.meters.Meter, got {type(meter).__name__}")
    table = FormulaTable(formulas)
    attached = [
        *([FlopMeter(table)] if flops else []),
        *([MemoryMeter(gpu=workload.gpu)] if memory else []),
        *([PredictedMeter(workload.gpu, table)] if workload.gpu is not None and workload.analytic else []),
        *meters,
    ]

    result = _metered(workload, attached)
    if timing is not None:
        _timed(workload, timing, result)
    return result


def profile_ranks(
    model: nn.Module,
    inputs: Any = (),
    *,
    world_size: int,
    parallelize: Parallelize,
    ranks: Sequence[int] | None = None,
    **options: Any,
) -> list[Profile]:
    """A profile of each of ``ranks`` (all ``world_size`` by default) of a sharded step, for steps whose
    ranks differ: uneven shards (the last ranks of a dimension that does not divide), or a
    ``parallelize`` that gives each rank its own part (``torch.distributed.get_rank()`` in it).
    ``options`` are :func:`profile`'s; each rank runs under a fake process group of its own."""
    chosen = list(range(world_size)) if ranks is None else list(ranks)
    if "rank" in options:
        raise TypeError("profile_ranks() takes ranks=, the ranks to profile, not rank=")
    return [profile(model, inputs, world_size=world_size, parallelize=parallelize, rank=rank, **options) for rank in chosen]


_AUTOCAST = (torch.bfloat16, torch.float16)  # the precisions torch.autocast runs in on the CPU and on CUDA


def _sharded(
    model: nn.Module,
    inputs: Any,
    parallel: Parallel,
    device: str | torch.device | None,
    options: dict[str, Any],
    table: FormulaTable,
    flops: bool,
    memory: bool,
    meters: Sequence[Meter],
    autocast: torch.dtype | None,
    gpu: GPUSpec | None,
) -> Profile:
    """One rank's step of ``model`` sharded by ``parallel`` (see :func:`profile`); with ``gpu``, its
    memory in the caching allocator's blocks and its predicted time there, collectives included."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"profile() expects a torch.nn.Module as the model, got {type(model).__name__}")
    kind = torch.device(device).type if device is not None else None
    on_meta = any(t.device.type == "meta" for t in (*model.parameters(), *model.buffers()))
    if kind not in (None, "cpu", "meta") or (on_meta and kind == "cpu"):
        raise ProfileError(
            f"a sharded step runs on a CPU mesh, for real (device='cpu') or analytically (device='meta'), not {str(device)!r}"
        )
    analytic = kind == "meta" or on_meta
    source_params = dict(model.named_parameters())
    with fake_world(parallel) as world_mesh, shape_propagation_apart():
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if analytic else None
        copy = sharded_copy(model, parallel, world_mesh, analytic)
        if fake_mode is not None:
            with fake_mode:
                copy.to_empty(device="cpu")  # the shards' storage, fake: nothing is allocated
        workload = Workload.build(copy, inputs, autocast=autocast, sharded=Sharded(parallel, fake_mode, source_params, gpu), **options)
        attached = [
            *([FlopMeter(table)] if flops else []),
            *([MemoryMeter(round_to=CUDA_BLOCK if gpu is not None else None, gpu=gpu)] if memory else []),
            *([PredictedMeter(gpu, table)] if gpu is not None else []),
            CollectiveMeter(gpu.node_gpus if gpu is not None else 8),
            *meters,
        ]
        result = _metered(workload, attached)
    result.world_size, result.rank = parallel.world_size, parallel.rank
    result.model = type(model).__name__  # not the sharded copy's class (FSDPSequential, DistributedDataParallel)
    if gpu is not None and result.predicted is not None:
        _add_communication(result.predicted, result, gpu)
    return result


def _add_communication(predicted: PredictedReport, result: Profile, gpu: GPUSpec) -> None:
    """A sharded step's collectives in its predicted time: after the kernels (``seconds``, an upper
    bound) and wholly hidden behind them (``overlapped_seconds``, a lower bound)."""
    times = [collective_seconds(gpu, c.kind, c.calls, c.bus_bytes, c.group_size, c.nodes) for c in result.collectives]
    if any(t is None for t in times):
        return  # a link the spec gives no bandwidth for: the collectives' time is unknown
    comm = sum(t for t in times if t is not None)
    compute = predicted.seconds
    predicted.comm_seconds = comm
    predicted.seconds = compute + comm
    predicted.overlapped_seconds = max(compute, comm)


def _metered(workload: Workload, meters: list[Meter]) -> Profile:
    """One step of ``workload`` under ``meters``; the profile they make of it."""
    with _no_full_collections():
        return _metered_step(workload, meters)


def _metered_step(workload: Workload, meters: list[Meter]) -> Profile:
    """The step of :func:`_metered`, run again with fresh meters where a block memo finds a block called again."""
    apart: frozenset[int] = frozenset()
    while True:
        tracker = ModuleTracker(workload.named_modules)
        dispatcher = Dispatcher(tracker, meters, transparent_types() if workload.parallel is not None else (), workload.fake_mode)
        try:
            with workload.prepared() as run:
                if workload.train:
                    tracker.watch_parameters(run.tensors.params)
                try:
                    for meter in meters:
                        meter.start(run.tensors, workload.target)
                    with dispatcher.attached(run.saved), _memos(workload, run, dispatcher, tracker, apart):
                        run.step(region=dispatcher.enter_region, tracker=tracker)
                finally:
                    for meter in meters:
                        meter.stop()
        except CalledAgain as again:  # (only with the engine's FLOP and CPU memory meters: fresh ones count the step again)
            apart |= again.blocks
            meters = [FlopMeter(meter.formulas) if isinstance(meter, FlopMeter) else MemoryMeter() for meter in meters]
            continue
        return assemble(workload, tracker, meters)


@contextlib.contextmanager
def _no_full_collections() -> Iterator[None]:
    """The collector's automatic full collections held off while runs go on (its third threshold out of reach),
    and its thresholds given back when the last run under way ends (runs on several threads, or one within
    another, hold them off together). A full collection goes over every object of the process (a third of a
    million once torch is imported: 0.2-0.25 s) and finds next to nothing the young collections leave (841
    objects in the two of an analytic 80-layer FSDP2 step, against 660,000 in its young ones); young collections
    go on as before, and once the thresholds are back the collector makes a full collection where its own rules
    then call for one. (Python 3.14's incremental collector has no third threshold: nothing changes there.)"""
    global _runs, _thresholds
    with _runs_lock:
        if _runs == 0:
            _thresholds = gc.get_threshold()
            gc.set_threshold(_thresholds[0], _thresholds[1], _UNREACHED)
        _runs += 1
    try:
        yield
    finally:
        with _runs_lock:
            _runs -= 1
            if _runs == 0:
                gc.set_threshold(*_thresholds)


_UNREACHED = 1 << 30  # gc's threshold for a full collection while runs go on: one no run reaches
_runs_lock = threading.Lock()
_runs = 0  # runs under way (see _no_full_collections)
_thresholds: tuple[int, ...] = ()  # the collector's thresholds before the first of them


def _memos(workload: Workload, run: Run, dispatcher: Dispatcher, tracker: ModuleTracker, apart: frozenset[int]) -> Any:
    """Where every meter can replay what a call contributed, repeated calls of stock leaf modules replay their
    first call's contributions. On fake tensors with the engine's FLOP and memory meters alone, repeated
    blocks are not run again (``apart``: the blocks that always run): every call with the FLOP meter alone,
    the calls made without grad when memory is followed (see observe/memory_replay.py)."""
    if dispatcher.replayable:
        tracker.observer = LeafMemo(dispatcher, hooks=1)
    kinds = {type(meter) for meter in dispatcher.meters}
    if (
        run.deciders is None
        or workload.fake_mode is None
        or run.saved is not None
        or workload.parallel is not None
        or workload.gpu is not None
        or not kinds <= {FlopMeter, MemoryMeter}
    ):
        return contextlib.nullcontext()
    memo = BlockMemo(
        dispatcher, tracker, run.deciders, workload.fake_mode, workload.model, hooks=1, apart=apart, inference_only=MemoryMeter in kinds
    )
    return memo.installed()


def _timed(workload: Workload, timing: Timing, result: Profile) -> None:
    """Time ``workload`` on real tensors, apart from the meters, into ``result``."""
    with workload.prepared() as run:
        restore = run.inputs_kept()  # each timed step starts from the inputs as given (a cache that grows, again)

        def step() -> Any:
            restore()
            return run.step()

        report = measure_latency(
            step, workload.target, timing, train=workload.train, batch_size=batch_size_of((workload.args, workload.kwargs))
        )
        result.latency = report
        result.latency_seconds = report.median
        result.machine = report.machine
        if timing.layers:
            times = layer_times(step, workload.named_modules, workload.target, timing.layer_repeats, timing.trace)
            times.apply(result.modules)
            roll_up_containers(result.modules, result.flops)
            result.op_times = times.ops
            result.profiler_events = times.events
