"""The predicted-time meter: each op's kernel time on the target GPU, and the step's (see :mod:`..targets.cost`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_flatten

from ...results import ModuleStats, Phase, PredictedOp, PredictedReport, Profile
from ..analytic.backward import handed_back
from ..formulas import FormulaTable, cost_of
from ..targets.cost import (
    COMPUTE_KINDS,
    NATIVE_NORM_KINDS,
    NORM_KINDS,
    POOL_KINDS,
    Bound,
    Issuer,
    StepClock,
    Work,
    foreach_kernels,
    kind_of,
    norm_elements,
    norm_work,
    pool_elements,
    strided_elements,
    tf32_allowed,
)
from ..targets.gpus import GPUSpec
from ..targets.norm_kernel import weight_gradient
from ..targets.products import gemms_of, relayout_bytes
from ..targets.recurrent import recurrent_of
from ..targets.reduce_kernel import launches
from . import Meter, Op

if TYPE_CHECKING:
    from ..analytic.fake import RunTensors


class PredictedMeter(Meter):
    """Predicted seconds per op (by phase) and for the step, on ``gpu``."""

    def __init__(self, gpu: GPUSpec, formulas: FormulaTable | None = None) -> None:
        self.gpu = gpu
        self.formulas = formulas or FormulaTable()
        self.clock = StepClock(gpu)
        # (op, phase) -> [calls, seconds, flops, bytes, {bound: seconds}]
        self.rows: dict[tuple[str, Phase], list[Any]] = {}
        self.module_seconds: dict[str, float] = {}  # module path -> predicted kernel seconds, its children's included
        self.device_type = "meta"

    def start(self, run: RunTensors, target: torch.device) -> None:
        self.device_type = target.type

    def op(self, op: Op) -> None:
        work = op_features(op, self.formulas, self.device_type)
        seconds, bound = self.clock.issue(work)
        if work.kind == "none" or not work.on_device:
            return
        for path in op.key:
            self.module_seconds[path] = self.module_seconds.get(path, 0.0) + seconds
        row = self.rows.get((op.name, op.phase))
        if row is None:
            row = self.rows[(op.name, op.phase)] = [0, 0.0, 0, 0, {}]
        row[0] += 1
        row[1] += seconds
        row[2] += work.flops
        row[3] += work.bytes
        bounds: dict[Bound, float] = row[4]
        bounds[bound] = bounds.get(bound, 0.0) + seconds

    def contribute(self, profile: Profile, modules: dict[str, ModuleStats]) -> None:
        ops = [
            PredictedOp(name, phase, calls, seconds, flops, nbytes, max(bounds, key=bounds.get))
            for (name, phase), (calls, seconds, flops, nbytes, bounds) in self.rows.items()
        ]
        ops.sort(key=lambda row: (-row.seconds, row.op, row.phase))
        for path, stats in modules.items():
            stats.predicted_seconds = self.module_seconds.get(path, 0.0)
        clock = self.clock
        profile.predicted = PredictedReport(
            target=self.gpu.name,
            seconds=clock.seconds,
            gpu_seconds=clock.busy,
            host_seconds=clock.issuing,
            calibrated=clock.calibration.calibrated,
            calibration=clock.calibration.source,
            ops=ops,
            peak_flops=dict(self.gpu.peak_flops),
            bandwidth=self.gpu.bandwidth,
        )


def op_features(op: Op, formulas: FormulaTable, device_type: str = "meta") -> Work:
    """What the cost model needs of an op: its kind of kernel, FLOPs (done), bytes read and written,
    dtype, number of kernels, matrix products, and for a normalisation how it goes over its data.
    ``device_type``: where the run keeps the target GPU's tensors; an op with all its tensors on the
    host elsewhere (Adam's step counts in an analytic run) runs no kernel. A sharded step, which
    stands the GPU's tensors on the CPU, cannot tell them apart."""
    if op.phase == "backward" and run_own(op):
        return Work(op.name, "none", 0, 0, torch.float32, 0, issuer="profiler")
    kind = kind_of(op.name, op.args)
    if kind == "none":
        return Work(op.name, kind, 0, 0, torch.float32, 0)
    tensors = [t for t in tree_flatten((op.args, op.kwargs))[0] if isinstance(t, torch.Tensor)]
    outputs = [t for t in tree_flatten(op.out)[0] if isinstance(t, torch.Tensor)]
    on_device = device_type == "cpu" or any(t.device.type != "cpu" for t in (*tensors, *outputs))
    nbytes = sum(_bytes(t) for t in tensors) + sum(_bytes(t) for t in outputs)
    if op.name.endswith("_") and not outputs:  # an in-place op over lists (foreach): its first list is written
        first = op.args[0] if op.args else ()
        nbytes += sum(_bytes(t) for t in tree_flatten(first)[0] if isinstance(t, torch.Tensor))
    formula = formulas.formula_for(op.func)
    cost = cost_of(formula, op) if formula is not None else None
    flops = cost.flops - cost.skipped if cost is not None else 0
    dtype = next((t.dtype for t in (*tensors, *outputs) if t.is_floating_point()), torch.float32)
    lists = [a for a in op.args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
    kernels = foreach_kernels(len(lists[0])) if op.name.startswith("aten._foreach_") and lists else 1
    recurrent = recurrent_of(op.name, op.args) if kind == "rnn" else None  # its kernels by the GPU's algorithm (cost)
    passes, reductions = norm_work(op.name, op.args) if kind in NORM_KINDS else (1.0, 0)
    gemms = gemms_of(op.name, op.args, op.out) if kind in COMPUTE_KINDS else ()
    if kind in POOL_KINDS:
        elements = pool_elements(op.args)
    elif kind in NATIVE_NORM_KINDS:
        elements = norm_elements(op.name, op.args)
    else:
        elements = strided_elements(op.name, op.func, tensors, outputs) if kind == "memory" else 0
    columns = weight_gradient(op.name, op.args) if kind == "norm_backward" else 0
    if columns:  # its input's elements (the output gradient's), the weight's gradient's kernel after the input's (if asked)
        elements, kernels = op.args[0].numel(), 1 + bool(op.args[-1][0])
    who = issuer(op, tensors)
    relayout = relayout_bytes(op.name, op.args, op.out) if kind in ("conv", "conv_backward") else 0
    tf32 = tf32_allowed(kind)
    reduce = launches(op.func, op.args, op.kwargs, op.out) if kind == "memory" else ()
    return Work(
        op.name,
        kind,
        flops,
        nbytes,
        dtype,
        kernels,
        gemms,
        passes,
        reductions,
        on_device,
        who,
        tf32,
        elements,
        relayout,
        reduce,
        recurrent,
        columns,
    )


# autograd nodes that copy a tensor they saved where they are to keep it for another pass (``retain_variables``:
# derivatives.yaml's ``retain_variables ? result3.clone() : result3``, a batch norm's or a cuDNN RNN's reserve);
# the engine tells a node it will not (``will_release_variables``), which a node called from Python is never told
RETAINING = frozenset(
    {"CudnnBatchNormBackward0", "BatchNormWithUpdateBackward0", "BatchNormNoUpdateBackward0", "CudnnRnnBackward0", "MiopenRnnBackward0"}
)


def run_own(op: Op) -> bool:
    """Whether a backward op is the analytic run's own, one its backward executor (:mod:`..analytic.backward`)
    dispatches and the autograd engine does not: the detach autograd makes of a saved tensor the run's unpack hook
    hands back (:func:`~..analytic.backward.handed_back`), a node's copy of what it saved (:data:`RETAINING`; not a
    ``contiguous()`` of the gradient, which names its layout)."""
    if op.name == "aten.detach":
        return bool(op.args) and handed_back(op.args[0])
    return op.name == "aten.clone" and not op.kwargs and type(op.node).__name__ in RETAINING


def issuer(op: Op, tensors: list[torch.Tensor]) -> Issuer:
    """Who issued ``op`` (:data:`~..targets.cost.Issuer`): an op run for an autograd node (the backward pass,
    the loss's included) comes from autograd's engine; the others from Python (a checkpoint's recompute too),
    recorded where grad mode is on and an input requires grad (read as it ran)."""
    if op.node is not None or op.phase == "backward":
        return "engine"
    return "recorded" if torch.is_grad_enabled() and any(t.requires_grad for t in tensors) else "plain"


def _bytes(t: torch.Tensor) -> int:
    """The bytes a kernel moves for ``t``: its distinct elements (a broadcast, stride-0 dimension is read once)."""
    distinct = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            distinct *= size
    return distinct * t.element_size()
