"""What a profile run returns: plain dataclasses of raw numbers (FLOPs, bytes, counts).

Units and formatting belong to the reports; everything here is an integer or a
plain string, and round-trips through :meth:`Profile.to_dict` / :meth:`Profile.from_dict`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from . import stats as _stats

Phase = Literal["forward", "loss", "backward", "recompute", "optimizer"]
"""Where in a step an op ran (see :mod:`pytest_modelprof.engine.observe.dispatch`)."""
PHASES: tuple[Phase, ...] = get_args(Phase)

MemoryCategory = Literal[
    "parameters", "unsharded_parameters", "buffers", "inputs", "gradients", "activations", "temporaries", "optimizer_state", "workspace"
]
"""What a storage holds (see :mod:`pytest_modelprof.engine.meters.memory`)."""
MEMORY_CATEGORIES: tuple[MemoryCategory, ...] = get_args(MemoryCategory)
# A timed run whose threads waited for a CPU longer than this share of the time they were
# runnable was disturbed (other busy processes, or more threads than CPUs): its times
# measure the contention as much as the model. Measured on a 2-core machine: 0.4-0.5%
# idle, 50% with two CPU-bound processes beside the run.
CPU_WAIT_LIMIT = 0.10


def cpu_was_shared(cpu_wait: float | None) -> bool:
    """Whether a run whose threads waited ``cpu_wait`` of their runnable time for a CPU was disturbed."""
    return cpu_wait is not None and cpu_wait > CPU_WAIT_LIMIT


@dataclass
class ModuleOp:
    """An operator that ran directly in a module (not in its children), in one phase."""

    op: str
    phase: Phase
    calls: int = 0
    flops: int = 0
    macs: int = 0


@dataclass
class MemoryReport:
    """Memory of the run over time, in bytes (allocated bytes; see the memory meter).

    ``timeline`` holds, after each op, its phase and the bytes of each category (in the
    order of ``categories``), and for a CUDA op that takes kernel scratch a row of its own
    while the scratch is held (under ``workspace``); ``peak_breakdown`` is the row at the
    peak, and ``category_max`` each category's own maximum over the run.
    """

    peak_bytes: int
    peak_phase: Phase
    peak_module: str
    peak_breakdown: dict[str, int]
    category_max: dict[str, int]
    categories: list[MemoryCategory]
    timeline: list[tuple[Phase, list[int]]]
    block_bytes: int = 1
    parameters: list[tuple[str, int, int]] = field(default_factory=list)  # (name, weight bytes, gradient bytes)
    # of the inputs' bytes, those of a KV cache: input tensors of two or more dimensions held, at any depth, by an object
    # whose class or a base class is named ...Cache (Hugging Face's) or by the keyword past_key_values, cache or kv_cache
    kv_cache_bytes: int = 0
    # CUDA targets: labelled estimates of what allocated bytes do not show, never added to the
    # peak (reserved_bytes, cuda_context_bytes; None: not estimated), and cudnn_workspace_bytes:
    # the largest of cuDNN's convolution workspaces, which the peak holds (None: not known here,
    # and missing from the peak); see pytest_modelprof.engine.targets.allocator
    estimates: dict[str, int | None] = field(default_factory=dict)
    # a real CUDA run: what the caching allocator measured over the step (start_allocated_bytes,
    # max_allocated_bytes, max_reserved_bytes; peak statistics reset at its start), beside the model
    measured: dict[str, int] = field(default_factory=dict)

    @property
    def footprint_bytes(self) -> int:
        """What the step holds of a device's memory: the reserved estimate (a CUDA target), else the peak."""
        return self.estimates.get("reserved_bytes") or self.peak_bytes


@dataclass
class LatencyReport:
    """Timed repeats of the workload on real tensors, in seconds per call.

    ``samples`` holds one figure per repeat (a repeat runs ``calls_per_sample`` calls
    back to back and is divided by it). ``calibration`` holds, interleaved with them,
    the time of a fixed reference workload on the same device: machine speed drifts
    (frequency scaling, noisy neighbours) move both, so ``ratios`` (sample over its
    calibration) compare across runs and processes where raw seconds do not.
    ``machine`` names what was measured on (CPU model and threads, or GPU name).
    ``cpu_wait`` is the share of the time this process's threads were runnable that
    they spent waiting for a CPU while the repeats ran (Linux scheduler statistics;
    None where the system does not tell).
    """

    device: str
    machine: str
    samples: list[float]
    calls_per_sample: int = 1
    warmup: int = 0
    calibration: list[float] = field(default_factory=list)
    batch_size: int | None = None
    warnings: list[str] = field(default_factory=list)
    cpu_wait: float | None = None

    @property
    def disturbance(self) -> str | None:
        """Why these times do not measure the model alone (None when nothing says so)."""
        if self.cpu_wait is not None and cpu_was_shared(self.cpu_wait):
            return (
                f"the CPU was shared: the run's threads waited for a CPU {self.cpu_wait:.0%} of the time they were ready to run "
                f"(over {CPU_WAIT_LIMIT:.0%}: other busy processes, or more threads than CPUs)"
            )
        return None

    @property
    def runs(self) -> int:
        return len(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        return _stats.median(self.samples)

    @property
    def mean(self) -> float:
        return _stats.mean(self.samples)

    @property
    def iqr(self) -> float:
        return _stats.iqr(self.samples)

    @property
    def std(self) -> float:
        return _stats.std(self.samples)

    @property
    def throughput(self) -> float | None:
        """Samples (the batch's leading dimension) per second, at the median latency."""
        return self.batch_size / self.median if self.batch_size else None

    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        """A distribution-free confidence interval for the median latency (seconds)."""
        return _stats.median_interval(self.samples, confidence)

    @property
    def calibration_seconds(self) -> float | None:
        """The calibration's time as the model's latency sees it: the median latency over the
        median ratio (close to the calibration's own median, and consistent with ``ratios``:
        ``median(ratios) * calibration_seconds == median``)."""
        ratios = self.ratios
        return self.median / _stats.median(ratios) if ratios else None

    def ratio_interval(self, confidence: float = 0.95) -> tuple[float, float] | None:
        """A distribution-free confidence interval for the median ratio (None without calibration)."""
        ratios = self.ratios
        return _stats.median_interval(ratios, confidence) if ratios else None

    @property
    def ratios(self) -> list[float]:
        """Each sample over the calibration timed next to it (empty without calibration)."""
        return [s / c for s, c in zip(self.samples, self.calibration)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class PredictedOp:
    """One operator's predicted kernel time on the target GPU, summed over its calls in one phase."""

    op: str
    phase: Phase
    calls: int
    seconds: float
    flops: int  # the work its kernels do (causal attention's skipped scores left out)
    bytes: int  # read and written
    bound: str  # what bounds most of its time: "compute", "memory" or "launch"

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: FLOPs per byte moved."""
        return self.flops / self.bytes if self.bytes else 0.0


@dataclass
class PredictedReport:
    """The step's predicted time on a target GPU (``profile(target=...)``): deterministic, from
    the analytic run, a roofline per kernel and a model of the host issuing them; see
    pytest_modelprof.engine.targets.cost for what it models and what it does not."""

    target: str
    seconds: float  # the step, host and GPU together
    gpu_seconds: float  # the GPU's time running kernels
    host_seconds: float  # the host's time issuing ops (its waits for the GPU, a value read back, apart)
    calibrated: bool  # False: the cost model's round defaults, not fitted to measured kernel times
    calibration: str  # where the efficiencies come from
    ops: list[PredictedOp] = field(default_factory=list)
    # a sharded step (profile(world_size=..., target=...)): ``seconds`` has its collectives after its kernels,
    # none overlapped (an upper bound); ``overlapped_seconds`` has them wholly hidden behind the kernels (a lower bound)
    comm_seconds: float | None = None  # the collectives' time on the links, one after another
    overlapped_seconds: float | None = None
    # the target's roofs, for the roofline view: peak FLOP/s per dtype of its math, memory bandwidth in bytes/s
    peak_flops: dict[str, float] = field(default_factory=dict)
    bandwidth: float = 0.0


@dataclass
class Collective:
    """Collectives of one kind that one rank ran in one place of the step (a sharded step:
    ``profile(world_size=...)``), summed over their ``calls``.

    ``bytes`` is the payload per rank as NCCL's performance tests define it: an all-gather's
    output, a reduce-scatter's input, an all-reduce's tensor, an all-to-all's input, the tensor
    of a broadcast, reduce, send or receive. ``bus_bytes`` is what a ring moves per rank:
    ``bytes * (N-1)/N`` for all-gather, reduce-scatter and all-to-all, ``bytes * 2(N-1)/N``
    for all-reduce, ``bytes`` for the others, N being the group's size.
    """

    kind: str  # all_gather, reduce_scatter, all_reduce, all_to_all, broadcast, reduce, gather, scatter, send, recv, barrier
    op: str  # the operator, e.g. "c10d._allgather_base_"
    phase: Phase
    module: str  # the module it ran for ("" the model; "<outside the model>")
    group_size: int
    dtype: str
    calls: int = 0
    bytes: int = 0
    bus_bytes: float = 0.0
    nodes: int = 1  # how many nodes the group spans (ranks placed in order, node_gpus to a node: 8, or the target's)


@dataclass
class OpTime:
    """Time of one operator (profiler name, e.g. ``aten::mm``) in one module and phase.

    ``self_*`` excludes the time of the ops it called; ``device_*`` is kernel time on the
    accelerator (0 on CPU). Seconds are per workload call (averaged over profiled calls).
    """

    op: str
    phase: str
    module: str
    calls: float = 0
    seconds: float = 0.0
    self_seconds: float = 0.0
    device_seconds: float = 0.0
    self_device_seconds: float = 0.0


@dataclass
class ModuleStats:
    """One module of the profiled model, at one dotted path.

    FLOPs are inclusive (the module and everything it called); ``self_*`` excludes
    what ran inside child modules. ``recompute_flops`` is forward work repeated in
    the backward pass by activation checkpointing. A ``container`` (an ``nn.ModuleList``
    or ``nn.ModuleDict`` that its parent iterates over, never called itself) shows the
    sums of its children's figures, and the most memory any of them held.
    """

    path: str
    type: str
    depth: int
    calls: int = 0
    params: int = 0
    forward_flops: int = 0
    backward_flops: int = 0
    recompute_flops: int = 0
    forward_macs: int = 0
    backward_macs: int = 0
    self_forward_flops: int = 0
    self_backward_flops: int = 0
    share: float = 0.0
    ops: list[ModuleOp] = field(default_factory=list)
    activation_bytes: int = 0  # saved for backward by its ops (and its children's)
    forward_peak_bytes: int = 0  # the most memory in use while its forward ran
    backward_peak_bytes: int = 0  # ... while its backward ran (recomputation included)
    # per-module times (seconds per workload call; None until layer timing ran): total
    # includes the module's children, self excludes them; device_* is kernel time
    forward_seconds: float | None = None
    backward_seconds: float | None = None
    self_forward_seconds: float | None = None
    self_backward_seconds: float | None = None
    forward_device_seconds: float | None = None
    backward_device_seconds: float | None = None
    # a target GPU's predicted kernel seconds of the module and its children, all phases (None: no target)
    predicted_seconds: float | None = None
    # a sharded step: the payload (NCCL's bytes) of the collectives serving the module and its children (None: unsharded)
    comm_bytes: int | None = None
    container: bool = False

    @property
    def peak_bytes(self) -> int:
        """The most memory in use while it ran, forward or backward."""
        return max(self.forward_peak_bytes, self.backward_peak_bytes)

    @property
    def flops(self) -> int:
        """All FLOPs this module ran: forward, backward and recomputation."""
        return self.forward_flops + self.backward_flops + self.recompute_flops

    @property
    def macs(self) -> int:
        return self.forward_macs + self.backward_macs

    @property
    def name(self) -> str:
        """The last component of the path ("" for the root)."""
        return self.path.rpartition(".")[2]


@dataclass
class OpStats:
    """One ATen operator (overload packet, e.g. ``aten.mm``) in one phase."""

    op: str
    phase: Phase | Literal["all"]  # "all": Profile.op()'s sum over the phases
    calls: int = 0
    flops: int = 0
    macs: int = 0
    modules: list[str] = field(default_factory=list)
    allocated_bytes: int = 0  # new storages its calls made (0 when memory was not followed)


@dataclass
class Profile:
    """FLOPs, MACs and parameter figures of one profiled workload.

    ``flops`` and ``macs`` cover the whole workload: the forward pass for inference;
    forward, loss, backward, any recomputation and the optimizer step (when one was
    given) for a training step (``train=True``).
    ``peak_activation_bytes``, ``peak_memory_bytes``, ``latency_seconds`` (median) and
    ``machine`` (what the latency was measured on) are ``None`` when not measured.
    ``peak_activation_bytes`` is, for a training step, the most bytes saved for the
    backward pass at any moment; for inference (nothing is saved for a backward pass),
    the most bytes of intermediate tensors alive at once: everything the forward pass
    allocates (layer outputs, temporaries, the output), not the weights or the inputs.
    """

    model: str
    train: bool
    device: str
    analytic: bool
    forward_flops: int = 0
    loss_flops: int = 0
    backward_flops: int = 0
    recompute_flops: int = 0
    optimizer_flops: int = 0
    forward_macs: int = 0
    loss_macs: int = 0
    backward_macs: int = 0
    recompute_macs: int = 0
    optimizer_macs: int = 0
    skipped_flops: int = 0  # of the FLOPs above, those causal attention kernels skip (see useful_flops)
    params: int = 0
    trainable_params: int = 0
    buffers: int = 0
    param_bytes: int = 0
    buffer_bytes: int = 0
    modules: list[ModuleStats] = field(default_factory=list)
    ops: list[OpStats] = field(default_factory=list)
    uncounted: dict[str, int] = field(default_factory=dict)
    flops_counted: bool = True  # False: a profile without the FLOP meter (profile(flops=False)), its FLOPs not measured
    target: str | None = None  # the GPU the step was profiled for (profile(target=...)), None: the device it ran on
    target_memory_bytes: int | None = None  # that GPU's memory
    name: str | None = None
    # Memory and latency figures: None until the memory and timing meters measure them.
    peak_activation_bytes: int | None = None
    peak_memory_bytes: int | None = None
    latency_seconds: float | None = None
    machine: str | None = None
    memory: MemoryReport | None = None
    latency: LatencyReport | None = None
    op_times: list[OpTime] = field(default_factory=list)
    predicted: PredictedReport | None = None  # a target GPU's predicted step time (profile(target=...))
    # a sharded step (profile(world_size=...)): which rank of how many, and the collectives it ran
    world_size: int | None = None
    rank: int | None = None
    collectives: list[Collective] = field(default_factory=list)
    # the raw torch.profiler events of the layer timing (an EventList); not serialized
    profiler_events: Any = field(default=None, repr=False, compare=False)

    @property
    def flops(self) -> int:
        return self.forward_flops + self.loss_flops + self.backward_flops + self.recompute_flops + self.optimizer_flops

    @property
    def useful_flops(self) -> int:
        """The FLOPs without the masked scores that causal attention kernels skip (``skipped_flops``)."""
        return self.flops - self.skipped_flops

    @property
    def gflops(self) -> float:
        return self.flops / 1e9

    @property
    def macs(self) -> int:
        return self.forward_macs + self.loss_macs + self.backward_macs + self.recompute_macs + self.optimizer_macs

    @property
    def flops_per_second(self) -> float | None:
        """Achieved FLOP/s: the counted FLOPs over the median latency."""
        return self.flops / self.latency_seconds if self.latency_seconds else None

    @property
    def fits(self) -> bool | None:
        """Whether the step fits in the target GPU's memory: the caching allocator's reserved peak
        (its segments, the CUDA context aside) against the GPU's memory; None without a target."""
        if self.target_memory_bytes is None or self.memory is None:
            return None
        return self.memory.footprint_bytes <= self.target_memory_bytes

    @property
    def comm_bytes(self) -> int | None:
        """The collectives' payload per rank in the step (see :class:`Collective`); None for an unsharded step."""
        return sum(c.bytes for c in self.collectives) if self.world_size is not None else None

    @property
    def comm_bus_bytes(self) -> float | None:
        """What a ring moves per rank in the step (see :class:`Collective`); None for an unsharded step."""
        return sum(c.bus_bytes for c in self.collectives) if self.world_size is not None else None

    @property
    def model_size_bytes(self) -> int:
        """Bytes of parameters and buffers (each storage counted once)."""
        return self.param_bytes + self.buffer_bytes

    def module(self, path: str) -> ModuleStats:
        """The stats of the module at ``path`` ("" is the model itself)."""
        for stats in self.modules:
            if stats.path == path:
                return stats
        known = ", ".join(repr(m.path) for m in self.modules[:8])
        raise KeyError(f"no module at path {path!r} in this profile (paths include {known})")

    def op(self, op: str, phase: Phase | None = None) -> OpStats:
        """Totals for one operator (e.g. ``"aten.mm"``), over all phases unless one is given."""
        rows = [row for row in self.ops if row.op == op and (phase is None or row.phase == phase)]
        if not rows:
            raise KeyError(f"operator {op!r} did not run{'' if phase is None else f' in {phase}'}")
        modules = sorted({path for row in rows for path in row.modules})
        return OpStats(op, phase or "all", sum(r.calls for r in rows), sum(r.flops for r in rows), sum(r.macs for r in rows), modules)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(dataclasses.replace(self, profiler_events=None))
        del data["profiler_events"]
        data.update(
            flops=self.flops,
            useful_flops=self.useful_flops,
            macs=self.macs,
            model_size_bytes=self.model_size_bytes,
            flops_per_second=self.flops_per_second,
            fits=self.fits,
            comm_bytes=self.comm_bytes,
            comm_bus_bytes=self.comm_bus_bytes,
        )
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["modules"] = [ModuleStats(**{**m, "ops": [ModuleOp(**o) for o in m.get("ops", [])]}) for m in data.get("modules", [])]
        values["ops"] = [OpStats(**o) for o in data.get("ops", [])]
        if data.get("memory") is not None:
            memory = dict(data["memory"])
            memory["timeline"] = [(phase, list(row)) for phase, row in memory["timeline"]]
            memory["parameters"] = [tuple(entry) for entry in memory.get("parameters", [])]
            values["memory"] = MemoryReport(**memory)
        if data.get("latency") is not None:
            values["latency"] = LatencyReport(**data["latency"])
        values["op_times"] = [OpTime(**o) for o in data.get("op_times", [])]
        if data.get("predicted") is not None:
            predicted = dict(data["predicted"])
            predicted["ops"] = [PredictedOp(**o) for o in predicted.get("ops", [])]
            values["predicted"] = PredictedReport(**predicted)
        values["collectives"] = [Collective(**c) for c in data.get("collectives", [])]
        return cls(**values)
