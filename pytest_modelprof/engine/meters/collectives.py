"""The collective meter: what each collective of a sharded step moves, per rank.

Every collective reaches the dispatch mode as an op: the ``c10d`` ops of
``torch.distributed``'s calls (FSDP2's all-gathers and reduce-scatters, a DDP comm hook's
all-reduces) and the ``_c10d_functional`` ops of DTensor's redistributions (tensor
parallelism). The meter reads each one's tensors and group: the payload per rank as NCCL's
performance tests define it (``bytes``) and what a ring moves (``bus_bytes``), see
:class:`~pytest_modelprof.results.Collective`. Nothing is moved: under the fake process
group every collective returns at once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ...results import Collective, ModuleStats, Phase, Profile
from ..analytic.fake import RunTensors
from ..distributed import fsdp_served_modules, served_module
from ..observe.modules import StackKey
from . import Meter, Op

# kind, which argument holds the payload (an index, or "out"), where the group's size comes from
_C10D: dict[str, tuple[str, int | str]] = {
    "c10d._allgather_base_": ("all_gather", 0),
    "c10d.allgather_": ("all_gather", 0),
    "c10d.allgather_coalesced_": ("all_gather", 0),
    "c10d.allgather_into_tensor_coalesced_": ("all_gather", 0),
    "c10d._reduce_scatter_base_": ("reduce_scatter", 1),
    "c10d.reduce_scatter_": ("reduce_scatter", 1),
    "c10d.reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "c10d.allreduce_": ("all_reduce", 0),
    "c10d.allreduce_coalesced_": ("all_reduce", 0),
    "c10d.alltoall_base_": ("all_to_all", 1),
    "c10d.alltoall_": ("all_to_all", 1),
    "c10d.broadcast_": ("broadcast", 0),
    "c10d.reduce_": ("reduce", 0),
    "c10d.gather_": ("gather", 0),
    "c10d.gather_into_tensor_": ("gather", 0),
    "c10d.scatter_": ("scatter", 1),
    "c10d.send": ("send", 0),
    "c10d.recv_": ("recv", 0),
    "c10d.recv_any_source_": ("recv", 0),
    "c10d.barrier": ("barrier", -1),
    "c10d.monitored_barrier_": ("barrier", -1),
}
# functional collectives: kind, payload, and which argument names the group
_FUNCTIONAL: dict[str, tuple[str, int | str, int]] = {
    "_c10d_functional.all_gather_into_tensor": ("all_gather", "out", 2),
    "_c10d_functional.all_gather_into_tensor_coalesced": ("all_gather", "out", 2),
    "_c10d_functional.reduce_scatter_tensor": ("reduce_scatter", 0, 3),
    "_c10d_functional.reduce_scatter_tensor_coalesced": ("reduce_scatter", 0, 3),
    "_c10d_functional.all_reduce": ("all_reduce", 0, 2),
    "_c10d_functional.all_reduce_": ("all_reduce", 0, 2),
    "_c10d_functional.all_reduce_coalesced": ("all_reduce", 0, 2),
    "_c10d_functional.all_reduce_coalesced_": ("all_reduce", 0, 2),
    "_c10d_functional.all_to_all_single": ("all_to_all", 0, 3),
    "_c10d_functional.broadcast": ("broadcast", 0, 2),
    "_c10d_functional.broadcast_": ("broadcast", 0, 2),
    "_c10d_functional.isend": ("send", 0, 3),
    "_c10d_functional.irecv": ("recv", 0, 3),
}
COLLECTIVE_OPS = frozenset(_C10D) | frozenset(_FUNCTIONAL)


def bus_factor(kind: str, group_size: int) -> float:
    """What a ring moves per rank, per byte of payload (NCCL's bus bandwidth factors)."""
    n = group_size
    if kind in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    return 1.0


def _bytes(value: Any) -> tuple[int, str]:
    tensors = [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in tensors})
    return sum(t.numel() * t.element_size() for t in tensors), ",".join(dtypes)


def _group_of(args: Any) -> Any:
    """The ProcessGroup of a c10d op (a script object among its arguments)."""
    import torch.distributed as dist

    for arg in args:
        if isinstance(arg, torch.ScriptObject):
            try:
                return dist.ProcessGroup.unbox(arg)
            except RuntimeError:
                continue
    return None


def _named_group(name: Any) -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d._resolve_process_group(name)  # type: ignore[attr-defined]


def _nodes(group: Any, node_gpus: int) -> int:
    """How many nodes of ``node_gpus`` consecutive ranks the group's ranks span."""
    import torch.distributed as dist

    if group is None:
        return 1
    return len({rank // node_gpus for rank in dist.get_process_group_ranks(group)})


def _place(key: StackKey) -> str:
    return key[-1] if key else "<outside the model>"


class CollectiveMeter(Meter):
    """Each collective: its kind, payload and ring traffic per rank, group, dtype, phase and module
    (for FSDP2's, the module it serves: whose parameters it gathers, whose gradients it reduces)."""

    def __init__(self, node_gpus: int = 8) -> None:
        self.node_gpus = node_gpus  # ranks per node, consecutive: whether a group's collective leaves its node
        # (kind, op, phase, module, group size, nodes, dtype) -> [calls, bytes, bus bytes], in order of first call
        self.rows: dict[tuple[str, str, Phase, str, int, int, str], list[float]] = {}
        self._serving: Any = None

    def start(self, run: RunTensors, target: torch.device) -> None:
        self._serving = fsdp_served_modules()  # which module an FSDP2 collective serves
        self._serving.__enter__()

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.__exit__(None, None, None)
            self._serving = None

    def op(self, op: Op) -> None:
        if op.name not in COLLECTIVE_OPS:
            return
        kind, payload, dtype, group = self._read(op)
        size = int(group.size()) if group is not None else 1
        served = served_module()
        key = (kind, op.name, op.phase, served if served is not None else _place(op.key), size, _nodes(group, self.node_gpus), dtype)
        row = self.rows.setdefault(key, [0, 0, 0.0])
        row[0] += 1
        row[1] += payload
        row[2] += payload * bus_factor(kind, size)

    def _read(self, op: Op) -> tuple[str, int, str, Any]:
        """(kind, payload bytes, dtype, process group) of a collective op."""
        args = op.args
        if op.name in _C10D:
            kind, at = _C10D[op.name]
            group = _group_of(args)
            if at == -1:
                return kind, 0, "", group
            payload, dtype = _bytes(args[at])
            return kind, payload, dtype, group
        kind, at, where = _FUNCTIONAL[op.name]
        payload, dtype = _bytes(op.out if at == "out" else args[at])
        return kind, payload, dtype, _named_group(args[where]) if where < len(args) else None

    def contribute(self, profile: Profile, modules: dict[str, ModuleStats]) -> None:
        for stats in modules.values():
            stats.comm_bytes = 0
        for (_, _, _, module, _, _, _), (_, payload, _) in self.rows.items():
            if module in modules:  # the module and the modules holding it
                parts = module.split(".") if module else []
                for depth in range(len(parts) + 1):
                    ancestor = modules.get(".".join(parts[:depth]))
                    if ancestor is not None:
                        ancestor.comm_bytes = (ancestor.comm_bytes or 0) + int(payload)
        profile.collectives = [
            Collective(kind, name, phase, module, size, dtype, int(calls), int(payload), bus, nodes)
            for (kind, name, phase, module, size, nodes, dtype), (calls, payload, bus) in self.rows.items()
        ]
