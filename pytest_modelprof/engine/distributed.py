"""One rank of a sharded step, in this process: a fake process group and device mesh of
``world_size`` ranks, the user's own sharding (FSDP2's ``fully_shard``, ``parallelize_module``,
DDP) applied to a copy of the model, and everything torn down after the run.

The fake process group (torch's ``"fake"`` backend) answers every collective at once
without moving data, so a single process runs rank ``rank``'s step as the real code paths
run it: FSDP2 all-gathers before each forward and backward, reduce-scatters gradients, DTensor
redistributes. What each collective would move is read from its tensors
(:mod:`.meters.collectives`); what the rank holds, from the local shards.

Analytic runs build the copy on the meta device, shard it there (no memory) and give it
fake storage, so a 70B-parameter model's rank is profiled on a laptop. The mesh is a CPU
mesh: FSDP2 on a CUDA mesh needs a driver (its streams and events).
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from .errors import ProfileError

Parallelize = Callable[[nn.Module, Any], "nn.Module | None"]


@dataclass(frozen=True)
class Parallel:
    """How the step is sharded: ``world_size`` ranks, of which this run is ``rank``; ``mesh``
    the device mesh's shape (``(world_size,)`` by default) and dimension names; ``parallelize``
    the user's ``fn(model, mesh)`` that shards the model in place or returns the wrapper."""

    world_size: int
    parallelize: Parallelize
    rank: int = 0
    mesh_shape: tuple[int, ...] = ()
    mesh_dim_names: tuple[str, ...] | None = None

    @classmethod
    def build(cls, world_size: Any, parallelize: Any, rank: Any, mesh: Any) -> Parallel | None:
        """The sharding of :func:`~pytest_modelprof.profile`'s ``world_size=``, ``parallelize=``,
        ``rank=`` and ``mesh=`` arguments (None: an unsharded step), checked."""
        if world_size is None:
            if parallelize is not None or mesh is not None or rank != 0:
                raise ProfileError("parallelize=, rank= and mesh= describe a sharded step: pass world_size= too")
            return None
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ProfileError(f"world_size must be a positive int, got {world_size!r}")
        if parallelize is None or not callable(parallelize):
            raise ProfileError(
                "world_size= needs parallelize=fn, where fn(model, mesh) shards the model (fully_shard, parallelize_module, ...)"
            )
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ProfileError(f"rank must be an int in [0, {world_size}), got {rank!r}")
        names: tuple[str, ...] | None = None
        if mesh is None:
            shape: tuple[int, ...] = (world_size,)
        elif isinstance(mesh, dict):
            names, shape = tuple(mesh), tuple(mesh.values())
        else:
            shape = tuple(mesh)
        if not shape or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in shape) or _product(shape) != world_size:
            raise ProfileError(f"mesh must be positive sizes whose product is world_size={world_size}, got {mesh!r}")
        return cls(world_size, parallelize, rank, shape, names)


def _product(values: tuple[int, ...]) -> int:
    result = 1
    for value in values:
        result *= value
    return result


def _fake_store() -> Any:
    try:
        from torch._C._distributed_c10d import FakeStore
    except ImportError:  # older releases keep it in the testing package only
        from torch.testing._internal.distributed.fake_pg import FakeStore
    # registers the "fake" backend where this release does not have it built in
    import torch.testing._internal.distributed.fake_pg  # noqa: F401

    return FakeStore()


@contextlib.contextmanager
def fake_world(parallel: Parallel, device_type: str = "cpu") -> Iterator[Any]:
    """A fake process group of ``parallel.world_size`` ranks, this process being ``parallel.rank``,
    and its device mesh; destroyed on exit, also after an error."""
    import torch.distributed as dist

    if not dist.is_available():
        raise ProfileError("world_size= needs torch.distributed, which this build of PyTorch does not have")
    if dist.is_initialized():
        raise ProfileError(
            "a process group is already initialized in this process; world_size= runs one rank under a fake "
            "process group of its own: call it outside torch.distributed (or destroy_process_group() first)"
        )
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("fake", store=_fake_store(), rank=parallel.rank, world_size=parallel.world_size)
    try:
        yield init_device_mesh(device_type, parallel.mesh_shape, mesh_dim_names=parallel.mesh_dim_names)
    finally:
        dist.destroy_process_group()


def sharded_copy(model: nn.Module, parallel: Parallel, mesh: Any, analytic: bool) -> nn.Module:
    """A copy of ``model`` sharded by ``parallel.parallelize`` (the caller's model is untouched):
    for an analytic run, built on the meta device (nothing allocated, also for a 70B model)."""
    memo: dict[int, Any] = {}
    if analytic:
        for param in model.parameters():
            memo[id(param)] = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        for buffer in model.buffers():
            memo[id(buffer)] = buffer.detach().to("meta")
    copied = copy.deepcopy(model, memo)
    try:
        result = parallel.parallelize(copied, mesh)
    except ProfileError:
        raise
    except Exception as error:
        raise ProfileError(f"parallelize({type(model).__name__}, mesh) raised {type(error).__name__}: {error}") from error
    if result is not None and not isinstance(result, nn.Module):
        raise ProfileError(f"parallelize must shard the model in place (return None) or return a module, got {type(result).__name__}")
    sharded = result if result is not None else copied
    _observe_ddp(sharded)
    return sharded


def _observe_ddp(model: nn.Module) -> None:
    """Make DDP's all-reduces visible: its reducer calls the process group from C++, past the
    dispatcher, unless a comm hook does it from Python. A DDP module without a hook of its own
    gets one that all-reduces each bucket (averaged, as DDP's default) through ``torch.distributed``."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    def allreduce(group, bucket):  # type: ignore[no-untyped-def]  # DDP reads the annotations: none, or its own types
        tensor = bucket.buffer()
        group = group or dist.group.WORLD
        tensor.div_(dist.get_world_size(group))
        dist.all_reduce(tensor, group=group)  # the fake group returns at once, with no data to wait for
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        future.set_result(tensor)
        return future

    for module in model.modules():
        if isinstance(module, DistributedDataParallel) and not getattr(module, "_comm_hooks", None):
            module.register_comm_hook(module.process_group, allreduce)


_UNSHARDED = (torch.Tensor, FakeTensor, nn.Parameter)  # tensor types that are never a DTensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    """What this rank holds of ``tensor``: a DTensor's local shard; any other tensor itself."""
    if type(tensor) in _UNSHARDED:
        return tensor  # (the common case, without an attribute look-up that fails)
    inner = getattr(tensor, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else tensor


def wait_for(output: Any) -> None:
    """Wait for the collectives still in flight in ``output`` (a tensor-parallel output is an
    AsyncCollectiveTensor), as its use in a real step would: none is left unwaited."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.utils._pytree import tree_flatten

    for value in tree_flatten(output)[0]:
        if isinstance(value, AsyncCollectiveTensor):
            value.trigger_wait()  # type: ignore[no-untyped-call]  # the tensor stays as it is, with its autograd graph


def transparent_types() -> tuple[type, ...]:
    """Tensor subclasses whose ops the dispatcher lets run as their local ops (a DTensor's op
    is its shard's op, plus the collectives of a redistribution): what one rank runs."""
    import torch.distributed as dist

    if not dist.is_available():
        return ()
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.tensor import DTensor

    return (DTensor, AsyncCollectiveTensor)


def _elementwise_optimizers() -> frozenset[type]:
    """The optimizers whose step updates each element of a parameter from the same element of its gradient
    and state, and per-parameter scalars (no norm, no reduction over a parameter): on a shard, the same step."""
    optim = torch.optim
    return frozenset(
        {
            optim.SGD,
            optim.Adam,
            optim.AdamW,
            optim.Adagrad,
            optim.Adadelta,
            optim.Adamax,
            optim.NAdam,
            optim.RAdam,
            optim.RMSprop,
            optim.ASGD,
        }
    )


@contextlib.contextmanager
def on_local_shards(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """An elementwise optimizer's step (see ``_elementwise_optimizers``: the class itself, not a subclass)
    run on this rank's shards, each DTensor parameter, its gradient and its state replaced by their local
    tensors while the step runs: the ops DTensor would run, op for op, without its working out each op's
    sharding (for a foreach op over N parameters that takes O(N^2) the first time: 11 s of a 70B FSDP2
    rank's 28). Only where each DTensor's gradient and state have its own mesh and placements, and no
    group mixes DTensors with plain tensors (else DTensor would redistribute: the step runs as it is).
    A state tensor the step makes (its first) is made a DTensor of its parameter's placements again."""
    swaps = _swaps(optimizer)
    if not swaps:
        yield
        return
    from torch.distributed.tensor import DTensor
    from torch.optim.optimizer import _default_to_fused_or_foreach

    foreach = [group for group in optimizer.param_groups if group.get("foreach", False) is None]
    for group in foreach:  # as DTensor parameters have it (a plain fake tensor is not of a foreach type)
        group["foreach"] = _default_to_fused_or_foreach(group["params"], group.get("differentiable", False))[1]
    for group, index, p, state in swaps:
        shard = group["params"][index] = p._local_tensor
        shard.grad = p.grad._local_tensor if p.grad is not None else None
        optimizer.state.pop(p, None)
        if state:
            optimizer.state[shard] = {key: value._local_tensor if isinstance(value, DTensor) else value for key, value in state.items()}
    try:
        yield
    finally:
        for group, index, p, state in reversed(swaps):
            shard = group["params"][index]
            group["params"][index] = p
            shard.grad = None
            stepped = optimizer.state.pop(shard, None)
            if stepped:
                optimizer.state[p] = {key: _sharded_like(value, state.get(key), p) for key, value in stepped.items()}
        for group in foreach:
            group["foreach"] = None


def _swaps(optimizer: torch.optim.Optimizer) -> list[tuple[dict[str, Any], int, Any, dict[str, Any]]]:
    """(group, place, DTensor parameter, its state) for each parameter of ``optimizer``, where its step can run
    on the local shards (see :func:`on_local_shards`); none where it cannot."""
    if type(optimizer) not in _elementwise_optimizers() or "torch.distributed.tensor" not in sys.modules:
        return []  # (no parameter is a DTensor where DTensor was never imported)
    from torch.distributed.tensor import DTensor

    swaps = []
    for group in optimizer.param_groups:
        params = group["params"]
        if not any(isinstance(p, DTensor) for p in params):
            continue
        for index, p in enumerate(params):
            state = optimizer.state.get(p, {})
            held = [t for t in (p.grad, *state.values()) if isinstance(t, torch.Tensor)]
            if not isinstance(p, DTensor) or not all(
                _same_sharding(t, p) if isinstance(t, DTensor) else t is not p.grad and t.dim() == 0 for t in held
            ):
                return []  # (a group that mixes DTensors and plain tensors; a gradient or state sharded otherwise)
            swaps.append((group, index, p, state))
    return swaps


def _same_sharding(t: Any, p: Any) -> bool:
    return bool(t.device_mesh == p.device_mesh and tuple(t.placements) == tuple(p.placements) and t.shape == p.shape)


def _sharded_like(value: Any, before: Any, p: Any) -> Any:
    """A state value after a step on the local shard: the DTensor it was, where the step updated its local
    tensor in place; a new tensor of the shard's shape made a DTensor like ``p``; anything else as it is."""
    from torch.distributed.tensor import DTensor

    if isinstance(before, DTensor) and before._local_tensor is value:
        return before
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == p._local_tensor.shape:
        if value.dtype == p.dtype and value.stride() == p._local_tensor.stride():  # p's spec is its spec (what zeros_like(p) makes)
            return DTensor(value, p._spec, requires_grad=False)
        return DTensor.from_local(value, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())
    return value


@contextlib.contextmanager
def _patched(owner: Any, replacements: dict[str, Any]) -> Iterator[None]:
    """``owner``'s attributes replaced for the block, and restored after it (also after an error)."""
    originals = {name: getattr(owner, name) for name in replacements}
    try:
        for name, value in replacements.items():
            setattr(owner, name, value)
        yield
    finally:
        for name, value in originals.items():
            setattr(owner, name, value)


def _fsdp_internals() -> tuple[ModuleType, ModuleType] | None:
    """FSDP2's internal modules ``_fsdp_param`` and ``_fsdp_param_group``, when FSDP2 is in use in this
    process (imported: its internals are patched only then) and this torch has them; else None."""
    if "torch.distributed.fsdp" not in sys.modules:
        return None
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    except ImportError:
        return None
    return _fsdp_param, _fsdp_param_group


@contextlib.contextmanager
def storage_resizes(allocated: Callable[[torch.Tensor], None], freed: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """Tell of the storages FSDP2 allocates and frees by resizing them (the unsharded parameters
    and all-gather buffers, between an all-gather and the reshard): no ATen op shows those."""
    internals = _fsdp_internals()
    if internals is None:
        yield
        return
    _fsdp_param, _fsdp_param_group = internals
    alloc, free = _fsdp_param.alloc_storage, getattr(_fsdp_param, "free_storage", None)

    def alloc_storage(tensor: torch.Tensor) -> None:
        before = tensor.untyped_storage().nbytes()
        alloc(tensor)
        if tensor.untyped_storage().nbytes() != before:
            allocated(tensor)

    def free_storage(tensor: torch.Tensor) -> None:
        if tensor.untyped_storage().nbytes():
            freed(tensor)
        if free is not None:
            free(tensor)

    with contextlib.ExitStack() as stack:
        for module in (_fsdp_param, _fsdp_param_group):  # FSDP2's module globals: each imports its own names
            replacements = {"alloc_storage": alloc_storage, "free_storage": free_storage}
            stack.enter_context(_patched(module, {k: v for k, v in replacements.items() if hasattr(module, k)}))
        yield


_serving: list[str] = []  # the modules whose FSDP2 collectives are under way, innermost last


def served_module() -> str | None:
    """The module (dotted path) whose parameters FSDP2 is gathering or whose gradients it is reducing
    right now; None outside FSDP2's all-gather and reduce-scatter (prefetches included)."""
    return _serving[-1] if _serving else None


@contextlib.contextmanager
def fsdp_served_modules() -> Iterator[None]:
    """Track :func:`served_module` while FSDP2 unshards a module's parameters or reduces its
    gradients: a prefetch runs in another module's hook, but serves the module it gathers for."""
    internals = _fsdp_internals()
    if internals is None:
        yield
        return
    FSDPParamGroup = internals[1].FSDPParamGroup

    def serving(method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            _serving.append(getattr(self, "_module_fqn", None) or "")
            try:
                return method(self, *args, **kwargs)
            finally:
                _serving.pop()

        return wrapper

    methods = ("unshard", "post_backward")
    with _patched(FSDPParamGroup, {name: serving(getattr(FSDPParamGroup, name)) for name in methods if hasattr(FSDPParamGroup, name)}):
        yield


@contextlib.contextmanager
def shape_propagation_apart() -> Iterator[None]:
    """DTensor works out an op's output shape by running it on fake tensors of the global shape, in the
    active fake mode if there is one: in an analytic run that is the run's own, and those ops would pass
    for the rank's work. Give it a fake mode of its own, as in a real run (where there is none to find):
    the dispatcher tells its tensors from the run's and leaves them out."""
    try:
        from torch.distributed.tensor import _sharding_prop
    except ImportError:
        yield
        return
    if not hasattr(_sharding_prop, "detect_fake_mode"):
        yield
        return
    with _patched(_sharding_prop, {"detect_fake_mode": lambda *args, **kwargs: None}):
        yield
