"""Where a workload runs, and its tensors for one run: real copies, or fake tensors (analytic mode).

An analytic run (``device="meta"``, or a model or inputs that are already fake tensors)
runs on fake tensors of one :class:`FakeTensorMode` that claim the model's real device,
so the same kernels are chosen as in a real run while nothing is allocated or computed.
A real run works on its own copies wherever the step would write into the caller's
tensors (gradients, an optimizer step, buffers a training forward updates).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import ProfileError
from ..ops import beneath_the_run
from ..targets.gpus import GPUSpec
from .beside import detached
from .inputs import Inputs, input_tensors

CUDA_TARGET = torch.device("cuda", 0)  # what the fake tensors of an analytic GPU-target run claim


def choose_mode(
    model_name: str, tensors: list[torch.Tensor], device: torch.device | None, gpu: GPUSpec | None = None
) -> tuple[FakeTensorMode | None, torch.device]:
    """The fake mode of an analytic run (None for a real one) and the device the run targets.

    ``tensors`` are the model's parameters and buffers and the input tensors; ``device``
    is what the caller asked for (None: where the model is); ``gpu`` the target GPU, whose
    run is analytic on fake tensors that claim ``cuda:0`` unless ``device="cuda"`` asks for
    a real run on this machine's GPU.
    """
    if gpu is not None:
        if device is None or device.type == "meta":
            existing = next((t.fake_mode for t in tensors if isinstance(t, FakeTensor)), None)
            return existing or FakeTensorMode(allow_non_fake_inputs=True), CUDA_TARGET
        if device.type != "cuda":
            raise ProfileError(
                f"target={gpu.name!r} is a GPU: run it analytically (device=None or 'meta') "
                f"or for real (device='cuda'), not on {str(device)!r}"
            )
    existing_fake = next((t.fake_mode for t in tensors if isinstance(t, FakeTensor)), None)
    model_device = next((t.device for t in tensors if not isinstance(t, FakeTensor)), None)
    if existing_fake is not None:
        fake_device = next(t.device for t in tensors if isinstance(t, FakeTensor))
        return existing_fake, fake_device
    if device is not None and device.type == "meta":
        # fake tensors claim the model's own device, so kernels are chosen as in a real run
        claimed = model_device if model_device is not None and model_device.type != "meta" else torch.device("cpu")
        # tensors the model keeps outside its parameters and buffers (plain attributes,
        # closures) become fake on first use
        return FakeTensorMode(allow_non_fake_inputs=True), claimed
    target = device or model_device or torch.device("cpu")
    if target.type == "meta":
        raise ProfileError(f"{model_name} has tensors on the meta device: profile it analytically with device='meta'")
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ProfileError(f"device {str(target)!r} was asked for, but CUDA is not available on this machine")
    return None, target


@dataclass
class RunTensors:
    """The tensors one run works on, and its copy of the optimizer over them."""

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    optimizer: torch.optim.Optimizer | None
    # an analytic run's fake inputs and buffers beside the real tensors they stand for (see values.py)
    sources: Iterable[tuple[torch.Tensor, torch.Tensor]] = ()


class StandIns:
    """Fake tensors beside the real ones they stand for, the fakes held weakly: an input the step drops
    (a cache's keys, replaced by their concatenation) is freed, as in a real run."""

    def __init__(self) -> None:
        self._pairs: list[tuple[weakref.ref[torch.Tensor], torch.Tensor]] = []

    def add(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        self._pairs.append((weakref.ref(fake), real))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return ((fake, real) for ref, real in self._pairs if (fake := ref()) is not None)


class ShardedModel(Protocol):
    """What :func:`run_tensors` reads of a sharded step's copy of the model (a ``workload.Sharded``)."""

    @property
    def source_params(self) -> Mapping[str, torch.Tensor]: ...  # the caller's parameters by name
    @property
    def gpu(self) -> GPUSpec | None: ...  # the GPU the ranks run on (target=)


class Step(Protocol):
    """What :func:`run_tensors` reads of a workload (a ``workload.Workload``, which this module does not import:
    the workload is built on it)."""

    @property
    def model(self) -> torch.nn.Module: ...
    @property
    def args(self) -> tuple[Any, ...]: ...
    @property
    def kwargs(self) -> dict[str, Any]: ...
    @property
    def train(self) -> bool: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer | None: ...
    @property
    def target(self) -> torch.device: ...
    @property
    def fake_mode(self) -> FakeTensorMode | None: ...
    @property
    def named_params(self) -> dict[str, torch.Tensor]: ...
    @property
    def named_buffers(self) -> dict[str, torch.Tensor]: ...
    @property
    def sharded(self) -> ShardedModel | None: ...
    @property
    def in_place(self) -> bool: ...


def run_tensors(workload: Step) -> RunTensors:
    """Tensors for a run of ``workload`` (made outside any fake mode): real copies on its target,
    or fake tensors of its fake mode. The caller's tensors never receive gradients or in-place updates."""
    fake_mode, target, train = workload.fake_mode, workload.target, workload.train
    # an optimizer step writes into the parameters: then the run needs copies of its own
    copy_params = workload.optimizer is not None

    stand_ins = StandIns()

    def convert(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(target) if fake_mode is None else to_fake(t, fake_mode, target)

    def known(t: torch.Tensor, copied: bool = False) -> torch.Tensor:
        """``t`` converted, remembered beside its source: an input's or a buffer's values can be known. ``copied``: as the
        real run's copy, on a storage of its own, freed when the run drops it (not a meta tensor's, which the caller
        holds), and no larger (a view of part of one, a sliding window's keys, holds no more)."""
        own = copied and (t.device.type == "meta" or _part_of_its_storage(t))
        converted = convert(t.detach().to("meta", copy=True) if own else t)
        if fake_mode is not None:
            stand_ins.add(converted, t)
        return converted

    def parameter(t: torch.Tensor) -> torch.Tensor:
        if workload.in_place:  # the model's own parameter: a module converted as it runs converts this one
            return t
        run = t.detach().to(target, copy=True) if copy_params and fake_mode is None else convert(t)
        return run.requires_grad_(t.requires_grad)  # as the caller's: matmul folds by it, and grad-enabled inference saves by it

    def copy(t: torch.Tensor) -> torch.Tensor:
        copied = t.detach().to(target, copy=True) if fake_mode is None else known(t, copied=True)
        if copied.is_floating_point() or copied.is_complex():
            copied.requires_grad_(t.requires_grad)
        return copied

    args, kwargs = Inputs(copy, target).of(workload.args, workload.kwargs)
    cuda_defaults = fake_mode is not None and target.type == "cuda"
    if workload.sharded is not None:  # the run's own sharded copy of the model: its tensors as they are
        params, buffers = dict(workload.named_params), dict(workload.named_buffers)
        sources = workload.sharded.source_params
        cuda_defaults = workload.sharded.gpu is not None
    else:
        params = {name: parameter(t) for name, t in workload.named_params.items()}
        if workload.in_place:  # the model's own buffers, as its own parameters: nothing of the run writes them
            buffers = dict(workload.named_buffers)
        else:  # a parameter also held as a buffer is one tensor in the run too (functional_call refuses two for it)
            ran = {id(t): params[name] for name, t in workload.named_params.items()}
            buffers = {name: ran[id(t)] if id(t) in ran else copy(t) if train else known(t) for name, t in workload.named_buffers.items()}
        sources = workload.named_params
    run_optimizer = None
    if workload.optimizer is not None:
        by_id = {id(sources[source]): tensor for name, tensor in params.items() if (source := _source_name(name, sources)) is not None}
        with_state = workload.sharded is None  # a shard's state is made by its own first step
        model = type(workload.model).__name__
        run_optimizer = _copy_optimizer(workload.optimizer, by_id, fake_mode, target, model, with_state, cuda_defaults)
    return RunTensors(params, buffers, args, kwargs, run_optimizer, stand_ins)


def _part_of_its_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` (a dense tensor of torch's own class) is a view of part of its storage."""
    return type(t) is torch.Tensor and t.layout == torch.strided and t.untyped_storage().nbytes() > t.numel() * t.element_size()


def _source_name(name: str, sources: Mapping[str, torch.Tensor]) -> str | None:
    """The caller's name of the run's parameter ``name`` (a wrapper such as DDP adds ``module.``)."""
    if name in sources:
        return name
    unwrapped = name.removeprefix("module.")
    return unwrapped if unwrapped in sources else None


def tensors_in(inputs: tuple[tuple[Any, ...], dict[str, Any]]) -> list[torch.Tensor]:
    """The tensors of ``(args, kwargs)``, each once, those objects hold included (see :class:`.inputs.Inputs`)."""
    return input_tensors(*inputs)[0]


def _copy_optimizer(
    optimizer: torch.optim.Optimizer,
    run_tensors: dict[int, torch.Tensor],
    fake_mode: FakeTensorMode | None,
    target: torch.device,
    model: str,
    with_state: bool = True,
    cuda_defaults: bool = False,
) -> torch.optim.Optimizer:
    """The same optimizer (class, groups, hyperparameters, and with ``with_state`` its state) over the run's
    tensors; ``cuda_defaults``: as CUDA runs it (foreach kernels unless the optimizer says otherwise)."""
    groups = []
    for group in optimizer.param_groups:
        params = []
        for param in group["params"]:
            run = run_tensors.get(id(param))
            if run is None:
                raise ProfileError(f"the optimizer holds a parameter of shape {tuple(param.shape)} that is not one of {model}'s parameters")
            params.append(run)
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
    accepted = inspect.signature(type(optimizer)).parameters
    if cuda_defaults and "foreach" in accepted:
        # CUDA's default when neither is asked for: the foreach kernels (the optimizers'
        # _default_to_fused_or_foreach, which does not take fake tensors for CUDA ones)
        for group in groups:
            if group.get("foreach") is None and not group.get("fused") and not group.get("differentiable"):
                group["foreach"] = True
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    try:
        # under the run's fake mode: a constructor that makes state itself (Adagrad's fused step
        # counter, on its parameters' device) makes fake tensors, not real ones on a GPU
        with fake_mode if fake_mode is not None else contextlib.nullcontext():
            copy = type(optimizer)(groups, **defaults)
    except TypeError as error:
        raise ProfileError(f"cannot make a copy of {type(optimizer).__name__} for the run: {error}") from error
    for param, state in optimizer.state.items() if with_state else ():
        run = run_tensors.get(id(param))
        if run is not None:
            copy.state[run] = {k: _copy_state(v, fake_mode, target) if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    return copy


def _copy_state(t: torch.Tensor, fake_mode: FakeTensorMode | None, target: torch.device) -> torch.Tensor:
    counter = t.dim() == 0 and t.device.type == "cpu"  # a step counter, kept on the CPU as optimizers keep them
    if fake_mode is None:
        return t.detach().to(t.device if counter else target, copy=True)
    if counter and not isinstance(t, FakeTensor):
        # a fake constant keeps its value: the optimizer reads it (step.item()) to schedule its step
        return fake_mode.fake_tensor_converter.from_real_tensor(fake_mode, t.detach().clone(), make_constant=True)
    return to_fake(t, fake_mode, target)


def to_fake(t: torch.Tensor, fake_mode: FakeTensorMode, target: torch.device) -> torch.Tensor:
    """``t`` as a fake tensor of ``fake_mode`` claiming ``target`` (meta tensors) or its own device."""
    if isinstance(t, FakeTensor):
        return detached(t)
    if t.device.type == "meta" or (target.type == "cuda" and t.device.type != "cuda"):
        # made from the shape alone: a tensor of a model that claims (or targets) a device it is not on
        return fake_mode.fake_tensor_converter.from_meta_and_device(fake_mode, t.detach().to("meta"), target)
    return fake_mode.from_tensor(t.detach())


# In-place fused optimizer kernels PyTorch registers no meta kernel for: a fake tensor run would fall
# back to running them for real on zero-filled copies of every parameter and state (on a GPU for
# CUDA tensors). They return nothing and change no metadata, so their meta kernel does nothing.
_FUSED_STEPS = (
    "_fused_sgd_",
    "_fused_sgd_.tensor_lr",
    "_fused_adagrad_",
    "_fused_adagrad_.tensor_lr",
    "_fused_adam_.tensor_lr",
    "_fused_adamw_.tensor_lr",
)


def _no_op(*_: Any, **__: Any) -> None:
    return None


@contextlib.contextmanager
def meta_kernels(kernels: Mapping[str, Any]) -> Iterator[None]:
    """For a run: ``kernels`` (``"op"`` or ``"op.overload"`` of ``aten``: its meta kernel) registered where
    PyTorch has no meta kernel of its own (ops it does not have are skipped), and removed after."""
    library = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    try:
        for name, kernel in kernels.items():
            packet, _, overload = name.partition(".")
            ops = getattr(torch.ops.aten, packet, None)
            if ops is None or (overload and overload not in ops.overloads()):
                continue
            if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
                library.impl(name, kernel, "Meta")  # type: ignore[no-untyped-call]
        yield
    finally:
        library._destroy()  # type: ignore[no-untyped-call]


def input_gradient_meta(grad: torch.Tensor, input: torch.Tensor, *_: Any) -> torch.Tensor:
    """The meta kernel of a backward op whose one output is its input's gradient, contiguous (CTC's:
    ``at::full_like(log_probs, -inf)``; the margin losses' and 3-d fractional pooling's)."""
    return torch.empty_like(input, memory_format=torch.contiguous_format)


def analytic_meta_kernels() -> Any:
    """For an analytic run: meta kernels of ops PyTorch has none for, whose fake run would fall back to
    their real kernels on zero-filled copies of their inputs (on a GPU for CUDA tensors): the fused
    optimizer steps (see ``_FUSED_STEPS``) and CTC's backward."""
    kernels: dict[str, Any] = dict.fromkeys(_FUSED_STEPS, _no_op)
    kernels.update(dict.fromkeys(("_ctc_loss_backward", "_ctc_loss_backward.Tensor"), input_gradient_meta))
    return meta_kernels(kernels)


@contextlib.contextmanager
def conversions_in_place() -> Iterator[None]:
    """For an analytic run: a module converted as the model runs (``self.router.to(self.dtype)``, ``.float()``)
    converts its fake parameters as a real run converts real ones, in place (``param.data = converted``).

    ``Module._apply`` swaps a fake parameter's contents with its conversion instead (``torch.utils.swap_tensors``),
    which refuses a tensor that something refers to weakly, as fake mode's own memo of converted tensors does:
    between fake tensors the swap is done as the real run's assignment."""
    original = torch.utils.swap_tensors

    def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
        if not (isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor)):
            original(t1, t2)  # type: ignore[no-untyped-call]
            return
        with torch.no_grad():
            t1.data = t2
        t1.fake_device = t2.fake_device

    torch.utils.swap_tensors = swap_tensors
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


# devices whose one_hot kernel leaves its indices unchecked (it relies on the scatter's device asserts)
_UNCHECKED_ONE_HOT = ("cuda", "mps", "xla", "privateuseone")


@functools.cache
def _one_hot_checks() -> tuple[Any, ...]:
    """The reductions ATen's CPU ``one_hot`` checks its indices with before it allocates (``aminmax``; older
    versions ``min`` and ``max``), as this torch's kernel runs them on a small real tensor."""
    seen: list[Any] = []

    class Record(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with beneath_the_run():
        indices = torch.zeros(2, dtype=torch.long)
        with Record():  # type: ignore[no-untyped-call]
            torch.nn.functional.one_hot(indices, 3)
    before = seen[: next((i for i, f in enumerate(seen) if f.overloadpacket is torch.ops.aten.zeros), len(seen))]
    return tuple(f for f in before if torch.Tag.reduction in f.tags)


@contextlib.contextmanager
def device_one_hot(value: Callable[[torch.Tensor], torch.Tensor | None]) -> Iterator[None]:
    """For an analytic run: ``F.one_hot`` of fake indices runs the device's kernel (aten/src/ATen/native/Onehot.cpp),
    not the comparison with ``arange`` ATen runs for meta and fake tensors: where it checks the indices (not on
    CUDA) their reductions, then zeros and a scatter of ones. The checks raise as the kernel's do where ``value``
    knows the indices; elsewhere they are taken to pass. An unknown number of classes (-1) is left to ATen."""
    stock = torch.nn.functional.one_hot

    def one_hot(input: torch.Tensor, num_classes: int = -1) -> torch.Tensor:  # the stock function's keywords
        tensor = input
        if not isinstance(tensor, FakeTensor) or tensor.dtype != torch.long or tensor.numel() == 0 or num_classes == -1:
            return stock(tensor, num_classes)
        if tensor.device.type not in _UNCHECKED_ONE_HOT:
            for reduction in _one_hot_checks():
                reduction(tensor)
            known = value(tensor)
            if known is not None:
                with beneath_the_run():
                    low, high = int(known.min()), int(known.max())
                if low < 0:
                    raise RuntimeError("Class values must be non-negative.")
                if num_classes <= high:
                    raise RuntimeError("Class values must be smaller than num_classes.")
        elif num_classes < 1:
            raise RuntimeError("num_classes should be positive")
        out = torch.zeros((*tensor.shape, num_classes), dtype=torch.long, device=tensor.device)
        return out.scatter_(-1, tensor.unsqueeze(-1), 1)

    torch.nn.functional.one_hot = one_hot  # type: ignore[assignment]  # the stub names the argument tensor; it is input
    try:
        yield
    finally:
        torch.nn.functional.one_hot = stock


class _MetaFailure(logging.Filter):
    """fake mode's log of a meta kernel that raised (``log.exception``, with its traceback): the error goes on
    to the caller, where the engine reports it with the module that raised it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("failed while attempting to run meta")


@contextlib.contextmanager
def quiet_meta_failures() -> Iterator[None]:
    """For an analytic run: a model's own error (a shape mismatch its meta kernel finds) is raised once, as a
    :class:`ProfileError` naming the module, without fake mode's traceback logged to stderr before it."""
    logger, quiet = logging.getLogger("torch._subclasses.fake_tensor"), _MetaFailure()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
