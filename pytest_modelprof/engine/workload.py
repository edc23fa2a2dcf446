"""The workload: what one profiled step is, validated once, and the one method that runs it.

A :class:`Workload` is built from :func:`~pytest_modelprof.profile`'s arguments
(:meth:`Workload.build`, which checks them all before anything runs). Its
:meth:`~Workload.prepared` run holds the tensors one run works on; :meth:`Run.step`
runs one step: the forward pass, and for training the loss, the backward pass and the
optimizer step. The meters' pass and the clock's repeats run that same method.

The caller's model is never modified: parameters and buffers are swapped in for the
run with :func:`torch.func.functional_call` (detached views of the caller's tensors,
clones of buffers where a training step would update them), the train/eval flags and
the RNG state are restored, and inputs are copied before the model sees them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten

from .analytic.backward import HookGuard, SavedTensors, run_backward
from .analytic.fake import RunTensors, choose_mode, run_tensors, tensors_in
from .analytic.inputs import Inputs
from .analytic.modes import Deciders, analytic_modes, attributes_kept
from .analytic.values import unknown_value_hint
from .distributed import Parallel, on_local_shards, wait_for
from .errors import ProfileError
from .observe.modules import ModuleTracker, named_members
from .targets.catalog import gpu_spec
from .targets.gpus import GPUSpec

DEVICE_KINDS = ("cpu", "cuda", "meta")  # what device= accepts ("meta": analytic)


def parse_device(device: str | torch.device) -> torch.device:
    """``device=`` as a torch device; a ValueError naming it where torch knows no such device."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError) as error:
        raise ValueError(f"device={device!r} is not a device torch knows: {error}") from None


def device_kind(device: str) -> str | None:
    """The kind of device a ``device=`` string names (``"cuda:1"`` -> ``"cuda"``); None if torch cannot parse it."""
    try:
        return parse_device(device).type
    except ValueError:
        return None


@dataclass(frozen=True)
class Sharded:
    """A sharded copy of the caller's model to profile (see :mod:`.distributed`)."""

    parallel: Parallel
    fake_mode: FakeTensorMode | None  # an analytic run: the copy's storage is fake
    source_params: Mapping[str, torch.Tensor]  # the caller's parameters by name
    gpu: GPUSpec | None = None  # the GPU the ranks run on (target=): the optimizer's CUDA defaults


@dataclass
class Workload:
    """One step of a model: inference (a forward pass) or a training step."""

    model: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    train: bool
    loss_fn: Callable[[Any], torch.Tensor] | None
    optimizer: torch.optim.Optimizer | None
    no_grad: bool  # inference: under torch.no_grad() (False: what autograd saves is kept)
    set_to_none: bool  # the step's zero_grad frees the gradients (False: zeroes them in place)
    autocast: torch.dtype | None
    target: torch.device  # the device the step runs on (or that its fake tensors claim)
    fake_mode: FakeTensorMode | None  # set: an analytic run on fake tensors
    gpu: GPUSpec | None  # the GPU a CUDA step runs on (target=), for its kernels, allocator and memory
    named_params: dict[str, torch.Tensor] = field(repr=False)
    named_buffers: dict[str, torch.Tensor] = field(repr=False)
    named_modules: list[tuple[str, nn.Module]] = field(repr=False)
    # a sharded step (profile(world_size=...)): the model is the run's own sharded copy, stepped in place
    sharded: Sharded | None = field(default=None, repr=False)

    @classmethod
    def build(
        cls,
        model: nn.Module,
        inputs: Any = (),
        *,
        train: bool = False,
        loss_fn: Any = None,
        device: str | torch.device | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        no_grad: bool = True,
        set_to_none: bool = True,
        autocast: torch.dtype | None = None,
        target: str | GPUSpec | None = None,
        sharded: Sharded | None = None,
    ) -> Workload:
        """The workload of :func:`~pytest_modelprof.profile`'s arguments (see there), checked.
        ``sharded``: ``model`` is a sharded copy of the caller's model (see :mod:`.distributed`)."""
        if not isinstance(model, nn.Module):
            raise TypeError(f"profile() expects a torch.nn.Module as the model, got {type(model).__name__}")
        args, kwargs = split_inputs(inputs)
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
        if not set_to_none and not train:
            raise ProfileError("set_to_none=False describes the gradients of a training step: pass train=True")
        if optimizer is not None:
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
            if not train:
                raise ProfileError("an optimizer step needs a backward pass: pass train=True with optimizer=")
            closure = inspect.signature(optimizer.step).parameters.get("closure")
            if closure is not None and closure.default is inspect.Parameter.empty:
                raise ProfileError(
                    f"{type(optimizer).__name__}.step needs a closure (it evaluates the model again within the step, as "
                    "often as its values decide): profile() runs one forward and backward pass per step; profile "
                    "the closure's forward and backward pass instead, with an optimizer that takes none or without one"
                )
        named_modules, named_params, named_buffers = named_members(model)
        tensors = [*named_params.values(), *named_buffers.values(), *tensors_in((args, kwargs))]
        gpu = gpu_spec(target) if target is not None else None
        if sharded is not None:
            fake_mode, run_device = sharded.fake_mode, torch.device("cpu")
        else:
            fake_mode, run_device = choose_mode(type(model).__name__, tensors, torch.device(device) if device is not None else None, gpu)
        return cls(
            model=model,
            args=args,
            kwargs=kwargs,
            train=train,
            loss_fn=loss_fn,
            optimizer=optimizer,
            no_grad=no_grad,
            set_to_none=set_to_none,
            autocast=autocast,
            target=run_device,
            fake_mode=fake_mode,
            gpu=gpu,
            named_params=named_params,
            named_buffers=named_buffers,
            named_modules=named_modules,
            sharded=sharded,
        )

    @property
    def target_gpu(self) -> GPUSpec | None:
        """The GPU the step is profiled for: ``gpu``, or a sharded step's (whose ranks run on a CPU mesh)."""
        return self.gpu if self.sharded is None else self.sharded.gpu

    @property
    def parallel(self) -> Parallel | None:
        """How the step is sharded (None: it is not)."""
        return self.sharded.parallel if self.sharded is not None else None

    @property
    def analytic(self) -> bool:
        return self.fake_mode is not None

    @functools.cached_property
    def in_place(self) -> bool:
        """Whether the step runs on the caller's own tensors: a real inference run on the model's own device
        (nothing receives a gradient, eval mode updates no buffer), or a sharded step on the run's own copy.
        Every other run uses tensors of its own (moved, fake, or safe to backpropagate into). Worked out once:
        the run's copies ask it of every parameter."""
        return self.parallel is not None or (
            self.fake_mode is None
            and not self.train
            and all(t.device == self.target for t in (*self.named_params.values(), *self.named_buffers.values()))
        )

    @property
    def python_backward(self) -> bool:
        """Whether the backward pass runs in :mod:`.analytic.backward` (analytic CUDA runs: the engine needs a driver)."""
        return self.fake_mode is not None and self.target.type == "cuda"

    @contextlib.contextmanager
    def prepared(self) -> Iterator[Run]:
        """The workload ready to step, on tensors of its own (see :class:`Run`); undone on exit."""
        tensors = run_tensors(self)
        flags = {module: module.training for _, module in self.named_modules}
        with contextlib.ExitStack() as stack:
            deciders = None
            if self.fake_mode is None:
                cuda = [self.target] if self.target.type == "cuda" else []
                stack.enter_context(torch.random.fork_rng(devices=cuda, device_type=self.target.type))
            else:  # the fake mode and the modes an analytic step runs under, in their order (see modes.py)
                deciders = stack.enter_context(analytic_modes(self.fake_mode, self.model, self.gpu, tensors.sources))
            if tensors.optimizer is not None and self.parallel is None:
                _create_state(tensors.optimizer)
            if not self.set_to_none:  # gradients zeroed in place are resident from the start, as in later steps
                with torch.no_grad():
                    for tensor in tensors.params.values():
                        if tensor.requires_grad:
                            tensor.grad = torch.zeros_like(tensor)
            if self.fake_mode is not None:  # what the model records on itself as it runs on fake tensors
                stack.enter_context(attributes_kept(self.named_modules))
            stack.enter_context(_restore_training_flags(flags))
            if any(flag is not self.train for flag in flags.values()):
                self.model.train(self.train)
            run = Run(self, tensors, deciders)
            if self.parallel is not None:
                # a steady step: FSDP2 sets itself up in the first one (it also keeps what its forward passes
                # recorded until a backward pass ends: a forward pass alone would not do), DDP orders its buckets
                # by the first backward pass, and the optimizer makes its state (on the shards: on_local_shards);
                # an input the step changes (a cache that grows) is as it was for the next
                restore = run.inputs_kept()
                run.step()
                restore()
                del restore
            yield run


class Run:
    """A workload prepared for stepping: ``tensors`` are those the model uses in this run."""

    def __init__(self, workload: Workload, tensors: RunTensors, deciders: Deciders | None = None) -> None:
        self.workload = workload
        self.tensors = tensors
        self.deciders = deciders  # an analytic run's modes that work out values (None: a real run)
        self._state = None if workload.in_place else {**tensors.params, **tensors.buffers}
        self._trainable = [t for t in tensors.params.values() if t.requires_grad]
        # the backward pass run in Python holds what autograd saves, to release it as the engine does
        self.saved = SavedTensors() if workload.python_backward and workload.train else None

    def _autocast(self) -> Any:
        dtype = self.workload.autocast
        if dtype is None:
            return contextlib.nullcontext()
        if self.workload.analytic and self.workload.target.type == "cuda":
            return _cuda_autocast(dtype)
        return torch.autocast(self.workload.target.type, dtype=dtype)

    def _target_modes(self) -> Any:
        """When the backward pass runs in Python: the guard against the hooks it cannot run."""
        return HookGuard() if self.saved is not None else contextlib.nullcontext()

    def _reparametrized(self) -> Any:
        """The run's parameters and buffers in the model (what ``torch.func.functional_call`` does for one
        call), for the whole step: an activation-checkpointed block recomputes its forward during the
        backward pass, on the tensors its forward ran on."""
        if self._state is None:
            return contextlib.nullcontext()
        # stack_weights: restored in the reverse order of the swap, so that a module reached under two
        # names (a block shared by two stages) gets its own tensors back, not the run's from the second swap
        reparametrize = torch.nn.utils.stateless._reparametrize_module
        lifo = {"stack_weights": True} if "stack_weights" in inspect.signature(reparametrize).parameters else {}
        return reparametrize(self.workload.model, self._state, tie_weights=True, strict=False, **lifo)

    def inputs_kept(self) -> Callable[[], None]:
        """A way back to the run's inputs as they are now: calling it gives the run fresh copies of the objects
        and containers that hold them (the tensors shared), so that a step that changed an input object (a KV
        cache that grew) leaves the next step's inputs as they were. Inputs that are tensors and containers
        alone need none: calling it then does nothing."""
        given = self.tensors.args, self.tensors.kwargs
        if all(isinstance(leaf, (torch.Tensor, int, float, bool, str, type(None))) for leaf in tree_flatten(given)[0]):
            return lambda: None
        kept = Inputs(_same).of(*given)  # copies of its own, which no step changes

        def restore() -> None:
            self.tensors.args, self.tensors.kwargs = Inputs(_same).of(*kept)

        return restore

    def step(self, region: Callable[[str], None] | None = None, tracker: ModuleTracker | None = None) -> Any:
        """Run one step; its output (None for a training step). ``region`` hears the step move on (``"loss"``, ``"optimizer"``,
        ``"end"``); ``tracker`` names the module an error came from."""
        workload = self.workload
        model = workload.model
        with self._reparametrized():
            try:
                with torch.set_grad_enabled(workload.train or not workload.no_grad), self._autocast(), self._target_modes():
                    output = model(*self.tensors.args, **self.tensors.kwargs)
            except ProfileError as error:  # the engine's own refusal keeps its type and cause: the place goes first
                error.args = (f"in {_place(model, tracker)}: {error}", *error.args[1:])
                raise
            except Exception as error:
                raise _model_error(model, tracker, error) from error
            if workload.parallel is not None:
                wait_for(output)
            if workload.train:
                loss = self._loss(output, region)
                # a training loop keeps the loss, not the output: the output lives on only if
                # the loss function (or the graph) holds it
                output = None
                self._backward(loss, region)
                del loss
        if region is not None:
            region("end")
        if workload.train and self.tensors.optimizer is None:
            for tensor in self._trainable:  # the next step starts without gradients, as after zero_grad()
                tensor.grad = None
        return output

    def _loss(self, output: Any, region: Callable[[str], None] | None) -> torch.Tensor:
        workload = self.workload
        if region is not None:
            region("loss")
        try:
            with self._autocast():
                loss = workload.loss_fn(output) if workload.loss_fn is not None else sum_of_outputs(output)
        except ProfileError:
            raise
        except Exception as error:
            raise ProfileError(f"the loss function raised {type(error).__name__}: {error}") from error
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ProfileError(f"the loss must be a scalar tensor, got {shape}")
        if not loss.requires_grad:
            raise ProfileError("the loss does not depend on any parameter that requires grad: nothing to backpropagate")
        return loss

    def _backward(self, loss: torch.Tensor, region: Callable[[str], None] | None) -> None:
        workload = self.workload
        try:
            if self.saved is not None:
                run_backward(loss, self.saved)
            else:
                loss.backward()  # type: ignore[no-untyped-call]
        except ProfileError:
            raise
        except Exception as error:
            hint = _mixed_precision_hint(error, workload.autocast, workload.target)
            raise ProfileError(
                f"the backward pass of {type(workload.model).__name__} raised {type(error).__name__}: {error}{hint}"
            ) from error
        optimizer = self.tensors.optimizer
        if optimizer is None:
            return
        if region is not None:
            region("optimizer")
        try:
            with on_local_shards(optimizer):
                optimizer.step()
            optimizer.zero_grad(set_to_none=workload.set_to_none)
        except ProfileError:
            raise
        except Exception as error:
            raise ProfileError(f"the step of {type(optimizer).__name__} raised {type(error).__name__}: {error}") from error


def split_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A tensor, a tuple (or list) of positional inputs, a dict of keyword inputs, or ``(args, kwargs)``."""
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, dict):
        _check_keywords(inputs)
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        if len(inputs) == 2 and isinstance(inputs[0], (tuple, list)) and isinstance(inputs[1], dict):
            _check_keywords(inputs[1])
            return tuple(inputs[0]), dict(inputs[1])
        return tuple(inputs), {}
    raise TypeError(
        "inputs must be a tensor, a tuple of positional inputs, a dict of keyword inputs "
        f"or a pair (args, kwargs); got {type(inputs).__name__}"
    )


def _check_keywords(kwargs: dict[Any, Any]) -> None:
    bad = [k for k in kwargs if not isinstance(k, str)]
    if bad:
        raise TypeError(f"keyword inputs need string keys, got {bad[0]!r}")


def sum_of_outputs(output: Any) -> torch.Tensor:
    """The default loss: the sum of every floating-point (or complex: its real part) tensor in the output."""
    tensors = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]
    if not tensors:
        raise ProfileError("the model's output holds no floating-point tensor to sum into a loss; pass loss_fn")
    loss = tensors[0].sum()
    for t in tensors[1:]:
        loss = loss + t.sum()
    return loss.real if loss.is_complex() else loss


def _create_state(optimizer: torch.optim.Optimizer) -> None:
    """Make an optimizer that creates its state lazily hold it, as it does from its second
    step on: one step on zero gradients, before the run and unmetered."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if all(optimizer.state.get(p) for p in params):
        return
    with torch.no_grad():
        for param in params:
            param.grad = torch.zeros_like(param)
        try:
            optimizer.step()
        except Exception as error:
            hint = unknown_value_hint(error)
            raise ProfileError(
                f"the step of {type(optimizer).__name__} (made once before the profiled step, to create its state) "
                f"raised {type(error).__name__}: {error}{hint}"
            ) from error
        for param in params:
            param.grad = None


@contextlib.contextmanager
def _cuda_autocast(dtype: torch.dtype) -> Iterator[None]:
    """``torch.autocast("cuda", dtype)`` for fake CUDA tensors: what its ``__enter__`` and ``__exit__``
    do, without its check for a CUDA device (which disables it on a machine without one)."""
    enabled, previous_dtype, cache = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"), torch.is_autocast_cache_enabled()
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    torch.autocast_increment_nesting()
    torch.set_autocast_cache_enabled(True)
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", previous_dtype)
        torch.set_autocast_cache_enabled(cache)


def _place(model: nn.Module, tracker: ModuleTracker | None) -> str:
    """The module an error was raised in."""
    where = tracker.innermost() if tracker is not None else None
    if where is None:
        return f"{type(model).__name__} (the model itself)"
    path, module = where
    return f"module {path or '<root>'!r} ({type(module).__name__})"


def _model_error(model: nn.Module, tracker: ModuleTracker | None, error: Exception) -> ProfileError:
    hints = f"{unknown_value_hint(error)}{_device_hint(error)}"
    return ProfileError(f"{_place(model, tracker)} raised {type(error).__name__}: {error}{hints}")


_MIXED_DTYPES = ("expected scalar type", "must have the same dtype", "expected both", "to have the same dtype", "should be the same")


def _mixed_precision_hint(error: Exception, autocast: torch.dtype | None, device: torch.device) -> str:
    """What to add where the backward pass of an autocast step met operands of two precisions: autocast
    chose them in the forward pass, and the backward pass runs without it (as ``loss.backward()`` does
    outside the ``torch.autocast`` block), so a custom ``autograd.Function`` that multiplies what it saved
    with the incoming gradient fails alike in a real step."""
    if autocast is None or not any(text in str(error) for text in _MIXED_DTYPES):
        return ""
    where = "; CUDA's autocast keeps more ops in float32 than the CPU's (acos, pow, exp, softmax...)" if device.type == "cuda" else ""
    return (
        " (the forward pass ran under autocast, the backward pass runs without it, as loss.backward() does after the "
        "autocast block: an autograd.Function whose backward combines a saved tensor and the gradient of two precisions "
        f"fails alike in a real step{where}; cast them to one dtype in its backward, or decorate it with "
        "torch.amp.custom_fwd/custom_bwd)"
    )


def _device_mismatch(error: Exception) -> bool:
    """Whether fake tensors refused an op over two devices: a ``FakeTensorDeviceMismatchError`` where PyTorch
    has it, before that (PyTorch 2.11) a ``RuntimeError`` that says so."""
    mismatch = getattr(fake_tensor, "FakeTensorDeviceMismatchError", None)
    if mismatch is not None:
        return isinstance(error, mismatch)
    return isinstance(error, RuntimeError) and "found two different devices" in str(error)


def _device_hint(error: Exception) -> str:
    """What to add where a CUDA-target run met a CPU tensor: as on the GPU itself, a tensor the model makes
    without ``device=`` is on the CPU."""
    if not _device_mismatch(error) or "cuda" not in str(error):
        return ""
    return (
        " (on a CUDA target the inputs and weights are on the GPU, as in a real CUDA run, which fails alike: "
        "make tensors inside the model on their inputs' device, e.g. torch.arange(n, device=x.device))"
    )


@contextlib.contextmanager
def _restore_training_flags(flags: dict[nn.Module, bool]) -> Iterator[None]:
    try:
        yield
    finally:
        for module, training in flags.items():
            if module.training is not training:  # Module.__setattr__ is slow on deep models
                module.training = training


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
