"""Where the time of a profile goes, per part: a table a later change can be compared against.

For each workload it times, in one process and interleaved, the profile, the same step run
untracked (the floor: no profiler at all) and, for the FLOP-only analytic step, torch's
``FlopCounterMode`` (the goal of issue 40 is relative to it), and it counts the ATen ops the step
dispatches. Then the time is split by part in two ways, and the table says which row used which:

- **cProfile**: one run under cProfile; each function's own time (tottime) is summed by the engine
  file (or, for a few files, function) it belongs to, with PyTorch's fake tensor, dispatch, nn,
  autograd and C++ time as rows of their own. Built-in functions (``isinstance``, ``dict.get``), the
  standard library and ``torch.utils._pytree`` are charged to whoever called them (in proportion to
  their time from each caller). C++ that calls back into Python (an op beneath a Python dispatch mode)
  loses cProfile its own time, so the run's time beyond the functions' own times is put in the C++
  row. The rows are times under cProfile, whose run is slower than a plain one, and more so for code
  that makes many small calls: they say where the time goes (the shares), not what a part costs; the
  same step untracked is profiled alike, so that a torch row can be set beside the floor's.
- **ablation**: the profile run again with one part replaced (a dispatch mode's ``__torch_dispatch__``
  by a pass-through, wrapped as torch wraps a mode's own; a meter's ``op`` not called; a mode not
  entered at all; a decision worked out once instead of again and again), interleaved with the full
  run, best of N each: the saving is what the part costs. The figures the ablated runs give are
  wrong, and unused: only their time counts. A saving smaller than the profile's own spread (printed)
  is noise.

Per-op costs are microseconds per ATen op of the step (the untracked step's ops, counted by a
dispatch mode; where no untracked step is run, the ops that reached the fake mode). Shares are of
the profile's time and of its overhead (the profile's time less the floor's).

Workloads (``--only`` picks by name): the Llama-style 7B (examples/llama.py, hidden 4096, sequence
2048; ``--layers`` of its 32 decoder layers, 4 by default, so that the four default workloads run in
about a minute and a half on two cores) forward and backward on fake tensors, FLOPs only, as benchmarks/analytic_llama7b.py
runs it; the same with memory and an AdamW step, as benchmarks/memory_tracking.py; ResNet-50 batch 1
on real CPU tensors, forward FLOPs only and a training step with FLOPs and memory. With ``--all``, for
the parts only they run: the 7B step on an H100 target (the CUDA kernel choices, the backward pass in
Python, the predicted-time meter) and a Llama-style 70B rank of 64 under FSDP2 with an H100 target
(the collective meter), as benchmarks/llama70b_fsdp.py.

Timing is of this process's CPU time (``--clock wall`` for wall time) with one intra-op thread
(``--threads``), so that another process on the machine weighs on the figures as little as it can.

    python benchmarks/profiler_cost.py [--all] [--layers 4] [--repeats 3] [--only resnet] [--no-markdown]

The tables are also written as markdown between the markers of ``--markdown``
(benchmarks/profiler_cost.md); the rest of that file is left as it is.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import cProfile
import dataclasses
import datetime
import gc
import inspect
import os
import platform
import pstats
import statistics
import subprocess
import sys
import sysconfig
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torchvision
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from examples.llama import Llama, LlamaConfig  # noqa: E402
from pytest_modelprof import profile  # noqa: E402
from pytest_modelprof.engine import run as run_module  # noqa: E402
from pytest_modelprof.engine.analytic import backward as backward_module  # noqa: E402
from pytest_modelprof.engine.analytic import layers as layers_module  # noqa: E402
from pytest_modelprof.engine.analytic import modes as modes_module  # noqa: E402
from pytest_modelprof.engine.analytic.cuda.functions import CudaFunctions  # noqa: E402
from pytest_modelprof.engine.analytic.cuda.rnn import CudaOps  # noqa: E402
from pytest_modelprof.engine.analytic.kernel_outputs import KernelOutputs  # noqa: E402
from pytest_modelprof.engine.analytic.layers import Layer, Stacked, called  # noqa: E402
from pytest_modelprof.engine.analytic.routing import Routing  # noqa: E402
from pytest_modelprof.engine.analytic.values import KnownValues  # noqa: E402
from pytest_modelprof.engine.formulas import OpCost  # noqa: E402
from pytest_modelprof.engine.meters import Meter  # noqa: E402
from pytest_modelprof.engine.meters import flops as flops_module  # noqa: E402
from pytest_modelprof.engine.meters import predicted as predicted_module  # noqa: E402
from pytest_modelprof.engine.meters.collectives import CollectiveMeter  # noqa: E402
from pytest_modelprof.engine.meters.flops import FlopMeter  # noqa: E402
from pytest_modelprof.engine.meters.memory import MemoryMeter  # noqa: E402
from pytest_modelprof.engine.meters.predicted import PredictedMeter  # noqa: E402
from pytest_modelprof.engine.observe import blocks as blocks_module  # noqa: E402
from pytest_modelprof.engine.observe import modules as modules_module  # noqa: E402
from pytest_modelprof.engine.observe.dispatch import Dispatcher  # noqa: E402
from pytest_modelprof.engine.observe.memo import STOCK_LEAVES, LeafMemo  # noqa: E402
from pytest_modelprof.engine.observe.modules import ModuleTracker  # noqa: E402

SEQUENCE = 2048
ENGINE = ROOT / "pytest_modelprof" / "engine"
PACKAGE = ROOT / "pytest_modelprof"
TORCH = Path(torch.__file__).resolve().parent
TORCHVISION = Path(torchvision.__file__).resolve().parent
STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()
MARK_BEGIN = "<!-- profiler_cost.py: tables begin -->"
MARK_END = "<!-- profiler_cost.py: tables end -->"


# the workloads -----------------------------------------------------------------------------------


@dataclass
class Workload:
    name: str
    title: str
    run: Callable[[], Any]  # one profile() call
    floor: Callable[[], Any] | None  # the same step, untracked
    floor_title: str
    count: Callable[[], int] | None  # the ATen ops of the untracked step
    references: dict[str, Callable[[], Any]] = field(default_factory=dict)
    ablations: list[str] = field(default_factory=list)  # names of ABLATIONS that apply


class Counter(TorchDispatchMode):
    """Counts the ops that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


def ops_of(step: Callable[..., None]) -> Callable[[], int]:
    """The ATen ops of ``step`` run once under a :class:`Counter` (it takes the counter as ``counter``)."""

    def count() -> int:
        counter = Counter()
        step(counter=counter)
        return counter.ops

    return count


def llama_config(layers: int) -> LlamaConfig:
    return dataclasses.replace(LlamaConfig.llama_7b(), layers=layers)


def llama_flops(layers: int) -> Workload:
    """benchmarks/analytic_llama7b.py's step: forward and backward on fake tensors, FLOPs only."""
    with torch.device("meta"):
        model = Llama(llama_config(layers))
    tokens = torch.randint(0, 32000, (1, SEQUENCE))

    def step(flop_counter: bool = False, counter: Counter | None = None) -> None:
        fake = FakeTensorMode()
        convert = fake.fake_tensor_converter.from_meta_and_device
        state = {n: convert(fake, t.detach(), torch.device("cpu")).requires_grad_(t.requires_grad) for n, t in model.named_parameters()}
        state.update({n: convert(fake, t, torch.device("cpu")) for n, t in model.named_buffers()})
        fake_tokens = fake.from_tensor(tokens)
        with fake, FlopCounterMode(display=False) if flop_counter else contextlib.nullcontext(), counter or contextlib.nullcontext():
            torch.func.functional_call(model, state, (fake_tokens,)).sum().backward()

    return Workload(
        name="llama7b-flops",
        title=f"Llama-style 7B, {layers} of 32 layers, seq {SEQUENCE}: forward + backward on fake tensors, FLOPs only "
        "(profile(model, tokens, device='meta', train=True, memory=False))",
        run=lambda: profile(model, tokens, device="meta", train=True, memory=False),
        floor=step,
        floor_title="the same fake-tensor forward + backward (functional_call), untracked",
        count=ops_of(step),
        references={"torch FlopCounterMode": lambda: step(flop_counter=True)},
        ablations=[*ANALYTIC_ABLATIONS, "flop meter", "formula evaluation", "memo off", "block memo off"],
    )


def llama_memory(layers: int) -> Workload:
    """benchmarks/memory_tracking.py's step: a fake model, forward, backward and AdamW, FLOPs and memory."""
    mode = FakeTensorMode()
    with mode:
        model = Llama(llama_config(layers))
        tokens = torch.randint(0, 32000, (1, SEQUENCE))
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True)

    def step(counter: Counter | None = None) -> None:
        with mode, counter or contextlib.nullcontext():
            model(tokens).sum().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    step()  # the optimizer's state now exists
    return Workload(
        name="llama7b-memory-adamw",
        title=f"Llama-style 7B, {layers} of 32 layers, seq {SEQUENCE}: fake model, forward + backward + AdamW, FLOPs and memory "
        "(profile(model, tokens, train=True, optimizer=optimizer))",
        run=lambda: profile(model, tokens, train=True, optimizer=optimizer),
        floor=step,
        floor_title="the same fake-tensor step (forward, backward, AdamW step, zero_grad), untracked",
        count=ops_of(step),
        ablations=[*ANALYTIC_ABLATIONS, *NO_MEMO_ABLATIONS, "flop meter", "memory meter", "saved-tensor hooks", "formula evaluation"],
    )


def resnet_forward() -> Workload:
    """benchmarks/flops_overhead.py's first workload: ResNet-50, batch 1, real CPU forward, FLOPs only."""
    model, x = torchvision.models.resnet50().eval(), torch.randn(1, 3, 224, 224)

    def step(counter: Counter | None = None) -> None:
        with torch.no_grad(), counter or contextlib.nullcontext():
            model(x)

    return Workload(
        name="resnet50-forward-flops",
        title="ResNet-50, batch 1, real CPU forward, FLOPs only (profile(m, x, memory=False))",
        run=lambda: profile(model, x, memory=False),
        floor=step,
        floor_title="the plain forward under torch.no_grad()",
        count=ops_of(step),
        references={"torch FlopCounterMode": lambda: _fcm_forward(model, x)},
        ablations=[*REAL_ABLATIONS, "flop meter", "formula evaluation", "memo off", "leaves free"],
    )


def _fcm_forward(model: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad(), FlopCounterMode(display=False):
        model(x)


def resnet_train(batch: int) -> Workload:
    """benchmarks/memory_tracking.py's first workload (batch 8 there): a real CPU training step, FLOPs and memory."""
    model, x = torchvision.models.resnet50(), torch.randn(batch, 3, 224, 224)

    def step(counter: Counter | None = None) -> None:
        model.train()
        with counter or contextlib.nullcontext():
            model(x).sum().backward()
        model.zero_grad(set_to_none=True)

    return Workload(
        name="resnet50-train-memory",
        title=f"ResNet-50, batch {batch}, real CPU training step (forward, loss, backward), FLOPs and memory (profile(m, x, train=True))",
        run=lambda: profile(model, x, train=True),
        floor=step,
        floor_title="the plain training step (model(x).sum().backward(), zero_grad)",
        count=ops_of(step),
        ablations=[*REAL_ABLATIONS, *NO_MEMO_ABLATIONS, "flop meter", "memory meter", "saved-tensor hooks", "formula evaluation"],
    )


def llama_target(layers: int) -> Workload:
    """benchmarks/llama7b_target.py's step (without autocast) on an H100: the parts only a target runs."""
    with torch.device("meta"):
        model = Llama(llama_config(layers))
    tokens = torch.randint(0, 32000, (1, SEQUENCE))
    optimizer = torch.optim.AdamW(model.parameters())
    return Workload(
        name="llama7b-h100-target",
        title=f"Llama-style 7B, {layers} of 32 layers, seq {SEQUENCE}, H100 target: forward + backward (in Python) + AdamW, "
        "FLOPs, memory and predicted time (profile(model, tokens, train=True, optimizer=..., target='h100'))",
        run=lambda: profile(model, tokens, train=True, optimizer=optimizer, target="h100"),
        floor=None,
        floor_title="none: a fake CUDA step cannot run untracked without a driver (the Python backward pass is the engine's)",
        count=None,
        ablations=[
            *ANALYTIC_ABLATIONS,
            *NO_MEMO_ABLATIONS,
            "flop meter",
            "memory meter",
            "saved-tensor hooks",
            "predicted meter",
            "formula evaluation",
            "CUDA ops mode pass-through",
            "CUDA function mode pass-through",
            "hook guard pass-through",
        ],
    )


def llama70b_fsdp(layers: int) -> Workload:
    """benchmarks/llama70b_fsdp.py's step, with fewer layers: rank 0 of 64 under FSDP2, AdamW, H100 target."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    config = dataclasses.replace(LlamaConfig.llama_70b(), layers=layers)
    with torch.device("meta"):
        model = Llama(config)
    tokens = torch.randint(0, config.vocab_size, (1, 4096))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    def shard(module: torch.nn.Module, mesh: Any) -> None:
        for layer in module.layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(module, mesh=mesh, mp_policy=policy)

    def run() -> Any:
        optimizer = torch.optim.AdamW(model.parameters())
        return profile(model, tokens, train=True, optimizer=optimizer, world_size=64, parallelize=shard, device="meta", target="h100")

    return Workload(
        name="llama70b-fsdp64-h100",
        title=f"Llama-style 70B, {layers} of 80 layers, seq 4096, FSDP2 rank 0 of 64, AdamW, H100 target "
        "(benchmarks/llama70b_fsdp.py's call; the setup, sharding and unmetered first step are in the time)",
        run=run,
        floor=None,
        floor_title="none (the unmetered first step that FSDP2 sets itself up in is part of the profile's time)",
        count=None,
        ablations=[
            "dispatcher pass-through",
            "dispatcher off the stack",
            "module tracking pass-through",
            "module tracking removed",
            "known values pass-through",
            "kernel outputs pass-through",
            "routing pass-through",
            "dynamo-disable wrappers off",
            "flop meter",
            "memory meter",
            "saved-tensor hooks",
            "predicted meter",
            "collective meter",
            "formula evaluation",
            "markers passed down",
            "full collections allowed",
        ],
    )


# the ablations -----------------------------------------------------------------------------------


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` set to ``value`` while the context runs."""
    had = name in vars(owner)
    old = vars(owner).get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if had:
            setattr(owner, name, old)
        else:
            delattr(owner, name)


def _passthrough_dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
    return func(*args, **(kwargs or {}))


def _passthrough_function(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
    return func(*args, **(kwargs or {}))


def _passthrough_layer(self: Any, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
    return self.below(func, types, args, kwargs)


def dispatch_passthrough(cls: type) -> Any:
    """``cls.__torch_dispatch__`` replaced by a pass-through, wrapped as TorchDispatchMode wraps a subclass's
    own (``torch._disable_dynamo``): the mode stays on the stack, its logic is gone. For a layer of the
    analytic run's stacked mode (analytic/layers.py), its ``handle``: it stays in the stack, passing every op on."""
    if issubclass(cls, Layer):
        return patched(cls, "handle", _passthrough_layer)
    return patched(cls, "__torch_dispatch__", torch._disable_dynamo(_passthrough_dispatch, recursive=True))


class _NoMode:
    """A mode that is not entered: what an analytic run would do without one of its modes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _NoMode:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    reads = acted = 0  # KnownValues' and Routing's counts, which the block memo reads

    def value(self, t: torch.Tensor) -> None:  # KnownValues'
        return None

    def decided(self, t: torch.Tensor) -> None:  # Routing's
        return None

    def follows(self, t: torch.Tensor, finiteness: bool = True) -> bool:  # both
        return False

    def mark_unbounded(self, tensors: Any) -> None:  # KnownValues'
        pass


class _StackedPresent(Stacked):
    """The analytic run's stacked mode with the layers an ablation does not enter (a :class:`_NoMode`) left out."""

    def __init__(self, *layers: Any, bottom: Any = called) -> None:
        present = [layer for layer in layers if isinstance(layer, Layer)]
        if present:
            super().__init__(*present, bottom=bottom)
        else:
            Layer.__init__(self)
            self.layers, self._own, self.bottom = [], (), bottom
            self._link()

    def _link(self) -> None:
        if self.layers:
            super()._link()
        else:
            self._top = self.bottom  # no layer left: the mode only passes ops on


def _layer_removed(name: str) -> Any:
    stack = contextlib.ExitStack()
    stack.enter_context(patched(modes_module, name, _NoMode))
    stack.enter_context(patched(modes_module, "Stacked", _StackedPresent))
    return stack


class _Handle:
    def remove(self) -> None:
        pass


def _tracker_passthrough() -> Any:
    """The tracker's hooks stay (the leaf-module memo is told of every call through them); its bookkeeping goes,
    and with it the block memo, which replays calls under the stacks the tracker keeps."""

    def enter(self: ModuleTracker, module: Any, args: Any) -> None:
        if self.observer is not None:
            self.observer.enter(module, args, ())

    def exit_(self: ModuleTracker, module: Any, args: Any, output: Any) -> None:
        if self.observer is not None:
            self.observer.exit(module)

    stack = contextlib.ExitStack()
    stack.enter_context(_blocks_off())
    stack.enter_context(patched(ModuleTracker, "_enter", enter))
    stack.enter_context(patched(ModuleTracker, "_exit", exit_))
    return stack


def _tracker_removed() -> Any:
    stack = contextlib.ExitStack()
    stack.enter_context(patched(modules_module, "register_module_forward_pre_hook", lambda hook: _Handle()))
    stack.enter_context(patched(modules_module, "register_module_forward_hook", lambda hook: _Handle()))
    return stack


def _dispatcher_off_stack() -> Any:
    """The dispatcher neither a mode of its own (a real run's) nor the top layer of the analytic modes' stacked mode."""
    stack = contextlib.ExitStack()
    stack.enter_context(patched(Dispatcher, "__enter__", lambda self: self))
    stack.enter_context(patched(Dispatcher, "__exit__", lambda self, *exc: None))
    stack.enter_context(patched(Stacked, "topped", lambda self, layer: contextlib.nullcontext()))
    return stack


_ENGINE_DISPATCH_MODES = (Layer,)  # (the dispatcher and the stacked mode are layers: their mode's dispatch is Layer's)


def _dynamo_wrappers_off() -> Any:
    """Each engine dispatch mode's ``__torch_dispatch__`` as written, without the ``torch._disable_dynamo`` wrapper
    that ``TorchDispatchMode.__init_subclass__`` puts around it (what ``_should_skip_dynamo() -> False`` would give)."""
    stack = contextlib.ExitStack()
    for cls in _ENGINE_DISPATCH_MODES:
        wrapped = vars(cls)["__torch_dispatch__"]
        stack.enter_context(patched(cls, "__torch_dispatch__", getattr(wrapped, "__wrapped__", wrapped)))
    return stack


def _formulas_constant() -> Any:
    constant = OpCost(0, 0)
    stack = contextlib.ExitStack()
    stack.enter_context(patched(flops_module, "cost_of", lambda formula, op: constant))
    stack.enter_context(patched(predicted_module, "cost_of", lambda formula, op: constant))
    return stack


def _analytic_modes_removed(dispatcher: bool = False) -> Any:
    """KnownValues, KernelOutputs and Routing not entered (and, with ``dispatcher``, the dispatcher off the stack)."""
    stack = contextlib.ExitStack()
    for name in ("KnownValues", "KernelOutputs", "Routing"):
        stack.enter_context(patched(modes_module, name, _NoMode))
    stack.enter_context(patched(modes_module, "Stacked", _StackedPresent))
    if dispatcher:
        stack.enter_context(_dispatcher_off_stack())
    return stack


def _memo_off() -> Any:
    return patched(Dispatcher, "replayable", property(lambda self: False))


def _blocks_off() -> Any:
    return patched(blocks_module, "repeated_blocks", lambda model: [])


def _leaves_free() -> Any:
    """Every call of a stock leaf module run with the dispatcher off the stack and nothing recorded or replayed:
    the leaf memo as if it cost nothing and knew every call already (its signatures, the first calls it dispatches
    to record them and its replays gone; the figures then miss the leaves' ops). For forward passes without grad
    (the ResNet-50 forward): it does not ask, as the memo does, whether a backward pass or a block's recording is
    under way."""

    def enter(self: LeafMemo, module: torch.nn.Module, args: Any, key: Any) -> None:
        if type(module) in STOCK_LEAVES and self._active is None and self.dispatcher.on_top():
            self.dispatcher.suspend()
            self._active = (module, None, None, key)

    def exit(self: LeafMemo, module: torch.nn.Module) -> None:
        if self._active is not None and self._active[0] is module:
            self._active = None
            self.dispatcher.resume()

    stack = contextlib.ExitStack()
    stack.enter_context(patched(LeafMemo, "enter", enter))
    stack.enter_context(patched(LeafMemo, "exit", exit))
    return stack


# name -> (part, what is done, the context that does it)
ABLATIONS: dict[str, tuple[str, str, Callable[[], Any]]] = {
    "dispatcher pass-through": (
        "dispatch, with every meter",
        "Dispatcher.handle -> pass-through (no meter sees an op)",
        lambda: dispatch_passthrough(Dispatcher),
    ),
    "dispatcher off the stack": (
        "dispatch mode, entered at all",
        "Dispatcher neither on the mode stack nor atop the stacked mode (no meter sees an op)",
        _dispatcher_off_stack,
    ),
    "module tracking pass-through": (
        "module tracking",
        "ModuleTracker._enter/_exit -> only the leaf memo's calls (no stacks, no autograd boundaries, no block memo)",
        _tracker_passthrough,
    ),
    "module tracking removed": (
        "module tracking, hooks at all",
        "no global module hooks (and so no leaf-module memo either)",
        _tracker_removed,
    ),
    "flop meter": ("FLOP meter", "FlopMeter.op not called", lambda: patched(FlopMeter, "op", Meter.op)),
    "formula evaluation": ("formula evaluation", "cost_of -> a constant (FLOP and predicted meters)", _formulas_constant),
    "memory meter": ("memory meter", "MemoryMeter.op not called", lambda: patched(MemoryMeter, "op", Meter.op)),
    "saved-tensor hooks": (
        "saved-tensor hooks",
        "MemoryMeter.saved not called (no saved-tensors hook unless the Python backward needs one)",
        lambda: patched(MemoryMeter, "saved", Meter.saved),
    ),
    "predicted meter": ("predicted-time meter", "PredictedMeter.op not called", lambda: patched(PredictedMeter, "op", Meter.op)),
    "collective meter": ("collective meter", "CollectiveMeter.op not called", lambda: patched(CollectiveMeter, "op", Meter.op)),
    "known values pass-through": (
        "known values",
        "KnownValues.handle -> pass-through",
        lambda: dispatch_passthrough(KnownValues),
    ),
    "known values removed": (
        "known values, the mode at all",
        "KnownValues not entered",
        lambda: _layer_removed("KnownValues"),
    ),
    "kernel outputs pass-through": (
        "kernel outputs",
        "KernelOutputs.handle -> pass-through",
        lambda: dispatch_passthrough(KernelOutputs),
    ),
    "kernel outputs removed": (
        "kernel outputs, the mode at all",
        "KernelOutputs not entered",
        lambda: _layer_removed("KernelOutputs"),
    ),
    "routing pass-through": ("routing", "Routing.handle -> pass-through", lambda: dispatch_passthrough(Routing)),
    "routing removed": ("routing, the mode at all", "Routing not entered", lambda: _layer_removed("Routing")),
    "dynamo-disable wrappers off": (
        "torch._disable_dynamo around the engine's modes",
        "the dispatcher's and the stacked analytic mode's __torch_dispatch__ unwrapped (as _should_skip_dynamo() -> False would)",
        _dynamo_wrappers_off,
    ),
    "memo off": ("leaf-module and block memos (a saving: negative)", "Dispatcher.replayable -> False", _memo_off),
    "block memo off": ("block memo (a saving: negative)", "no repeated block replayed (repeated_blocks -> [])", _blocks_off),
    "leaves free": (
        "stock leaf calls beyond a free memo (signatures, first calls dispatched, replays)",
        "LeafMemo.enter/exit -> the dispatcher off the stack in every stock leaf, nothing recorded or replayed",
        _leaves_free,
    ),
    "analytic modes removed": (
        "the three analytic modes together",
        "KnownValues, KernelOutputs and Routing not entered",
        _analytic_modes_removed,
    ),
    "engine modes removed": (
        "every engine dispatch mode",
        "KnownValues, KernelOutputs, Routing not entered and the Dispatcher off the stack: what is left is setup, "
        "module hooks and the fake step",
        lambda: _analytic_modes_removed(dispatcher=True),
    ),
    "CUDA ops mode pass-through": (
        "CUDA kernel choices: CudaOps",
        "CudaOps.handle -> pass-through",
        lambda: dispatch_passthrough(CudaOps),
    ),
    "CUDA function mode pass-through": (
        "CUDA kernel choices: CudaFunctions",
        "CudaFunctions.__torch_function__ -> pass-through",
        lambda: patched(CudaFunctions, "__torch_function__", _passthrough_function),
    ),
    "markers passed down": (
        "record_function's markers run at the top (a saving: negative)",
        "ops.MARKERS empty: each marker goes down every engine layer to the fake mode",
        lambda: patched(layers_module, "MARKERS", frozenset()),
    ),
    "full collections allowed": (
        "full collections held off (a saving: negative)",
        "the collector's thresholds left as they are during the run",
        lambda: patched(run_module, "_no_full_collections", contextlib.nullcontext),
    ),
    "hook guard pass-through": (
        "Python backward: HookGuard",
        "HookGuard.__torch_function__ -> pass-through",
        lambda: patched(backward_module.HookGuard, "__torch_function__", _passthrough_function),
    ),
}
ANALYTIC_ABLATIONS = [
    "dispatcher pass-through",
    "dispatcher off the stack",
    "module tracking pass-through",
    "known values pass-through",
    "known values removed",
    "kernel outputs pass-through",
    "kernel outputs removed",
    "routing pass-through",
    "routing removed",
    "analytic modes removed",
    "engine modes removed",
    "dynamo-disable wrappers off",
]
REAL_ABLATIONS = [
    "dispatcher pass-through",
    "dispatcher off the stack",
    "module tracking pass-through",
    "dynamo-disable wrappers off",
]
# where no leaf-module memo runs (a run that follows memory), taking the module hooks away changes nothing else
NO_MEMO_ABLATIONS = ["module tracking removed"]


# cProfile attribution ----------------------------------------------------------------------------


def _spans(path: Path, names: set[str]) -> list[tuple[int, int]]:
    """The line spans of the top-level classes and functions ``names`` of ``path``."""
    tree = ast.parse(path.read_text())
    return [(node.lineno, node.end_lineno or node.lineno) for node in tree.body if getattr(node, "name", None) in names]


_SAVED_SPANS = _spans(ENGINE / "analytic" / "backward.py", {"_Holder", "_NestedPack", "SavedTensors"})
_PHASE_SPANS = _spans(ENGINE / "analytic" / "backward.py", {"in_backward", "current_node", "_State"})
_LOOKUP_SPANS = _spans(ENGINE / "formulas" / "registry.py", {"FormulaTable", "formula_for"})
_SAVER_SPANS = [
    (node.lineno, node.end_lineno or node.lineno)
    for node in ast.walk(ast.parse((ENGINE / "observe" / "dispatch.py").read_text()))
    if isinstance(node, ast.FunctionDef) and node.name == "_saver"
]

# (path prefix relative to the engine, row); the first that matches
_ENGINE_ROWS = [
    ("observe/dispatch.py", "dispatch (observe/dispatch.py)"),
    ("observe/stream.py", "dispatch (observe/dispatch.py)"),
    ("observe/modules.py", "module tracking (observe/modules.py)"),
    ("observe/memo.py", "leaf-module memo (observe/memo.py)"),
    ("observe/blocks.py", "block memo (observe/blocks.py, alike.py, rerun.py)"),
    ("observe/alike.py", "block memo (observe/blocks.py, alike.py, rerun.py)"),
    ("observe/rerun.py", "block memo (observe/blocks.py, alike.py, rerun.py)"),
    ("meters/flops.py", "FLOP meter (meters/flops.py)"),
    ("meters/memory.py", "memory meter (meters/memory.py)"),
    ("targets/allocator.py", "memory meter: target's allocator, scratch, cuDNN (targets/)"),
    ("targets/scratch", "memory meter: target's allocator, scratch, cuDNN (targets/)"),
    ("targets/cudnn.py", "memory meter: target's allocator, scratch, cuDNN (targets/)"),
    ("meters/collectives.py", "collective meter (meters/collectives.py)"),
    ("meters/predicted.py", "predicted-time meter (meters/predicted.py, targets/cost.py)"),
    ("targets/cost.py", "predicted-time meter (meters/predicted.py, targets/cost.py)"),
    ("targets/gpus.py", "predicted-time meter (meters/predicted.py, targets/cost.py)"),
    ("targets/catalog.py", "predicted-time meter (meters/predicted.py, targets/cost.py)"),
    ("targets/products.py", "predicted-time meter (meters/predicted.py, targets/cost.py)"),
    ("targets/collectives.py", "predicted-time meter (meters/predicted.py, targets/cost.py)"),
    ("formulas/registry.py", "formula evaluation (cost_of, formulas/*.py)"),
    ("formulas/", "formula evaluation (cost_of, formulas/*.py)"),
    ("ops/", "op registry (ops/)"),
    ("analytic/values.py", "known values (analytic/values.py, paths.py)"),
    ("analytic/paths.py", "known values (analytic/values.py, paths.py)"),
    ("analytic/kernel_outputs.py", "kernel outputs (analytic/kernel_outputs.py)"),
    ("analytic/routing.py", "routing (analytic/routing.py)"),
    ("analytic/cuda/", "CUDA kernel choices (analytic/cuda/)"),
    ("analytic/backward.py", "Python backward (analytic/backward.py)"),
    ("distributed.py", "sharding support (distributed.py)"),
]
SETUP = "setup and assembly (workload.py, run.py, fake.py, modes.py, assemble.py, results)"
CHARGED = "<charged to caller>"


def _within(line: int, spans: list[tuple[int, int]]) -> bool:
    return any(start <= line <= end for start, end in spans)


def row_of(function: tuple[str, int, str]) -> str:
    """The row a function's own time goes to (CHARGED: to its callers')."""
    filename, line, name = function
    if filename == "~":  # built-ins: C++ entered from Python is a row, the rest is its caller's
        return CPP if "torch" in name else CHARGED
    path = Path(filename)
    try:
        relative = path.resolve().relative_to(ENGINE).as_posix()
    except (ValueError, OSError):
        relative = None
    if relative is not None:
        if relative == "analytic/backward.py":
            if _within(line, _SAVED_SPANS):
                return "saved-tensor hooks (dispatch's pack, MemoryMeter.saved, backward.SavedTensors)"
            if _within(line, _PHASE_SPANS):
                return "phase queries (backward.in_backward, current_node)"
        if relative == "observe/dispatch.py" and _within(line, _SAVER_SPANS):
            return "saved-tensor hooks (dispatch's pack, MemoryMeter.saved, backward.SavedTensors)"
        if relative == "meters/memory.py" and name == "saved":
            return "saved-tensor hooks (dispatch's pack, MemoryMeter.saved, backward.SavedTensors)"
        if relative == "formulas/registry.py" and _within(line, _LOOKUP_SPANS):
            return "formula lookup (formulas/registry.py: FormulaTable)"
        for prefix, row in _ENGINE_ROWS:
            if relative.startswith(prefix):
                return row
        return SETUP
    resolved = path.resolve() if filename.startswith("/") else path
    text = resolved.as_posix()
    if text.startswith(PACKAGE.as_posix() + "/"):
        return SETUP
    if text.startswith(TORCH.as_posix() + "/"):
        inner = resolved.relative_to(TORCH).as_posix()
        if inner == "utils/_pytree.py":
            return CHARGED
        if inner.startswith(("_subclasses/", "_guards.py", "fx/experimental/")):
            return "torch: fake tensor mode (FakeTensorMode, its cache, fake impls)"
        if inner.startswith(("_meta_registrations.py", "_decomp/", "_refs/", "_prims/", "_prims_common/")):
            return "torch: Python meta kernels, references and decompositions"
        if inner.startswith(("_ops.py", "utils/_python_dispatch.py", "_library/", "_dynamo/", "_compile.py", "overrides.py")):
            return "torch: dispatch machinery (mode stack, OpOverload calls, dynamo-disable wrappers)"
        if inner.startswith("nn/"):
            return "torch.nn (Module calls and their hook path, functional)"
        if inner.startswith(("autograd/", "utils/hooks.py")):
            return "torch: autograd (Python)"
        if inner.startswith("optim/"):
            return "torch.optim (the optimizer step)"
        if inner.startswith("distributed/"):
            return "torch.distributed (FSDP2, DTensor, the fake process group)"
        return "torch: other Python (Tensor methods, weakrefs, ...)"
    if text.startswith((TORCHVISION.as_posix() + "/", (ROOT / "examples").as_posix() + "/")):
        return "model code (examples/llama.py, torchvision)"
    if text.startswith(Path(__file__).resolve().as_posix()):
        return "benchmark harness"
    if (text.startswith(STDLIB.as_posix() + "/") and "site-packages" not in text) or filename.startswith("<"):
        return CHARGED  # the standard library, and code made at run time (named tuples' __new__)
    return "other"


CPP = "torch C++ (ATen ops and kernels, autograd engine)"


@dataclass
class Attribution:
    """One cProfile run, by row: own time and calls (a charged function's go to its callers' rows)."""

    seconds: dict[str, float]
    calls: dict[str, float]
    total: float  # the instrumented run's time
    functions: dict[tuple[str, int, str], tuple[int, int]]  # each function's (calls, primitive calls)
    lost: float = 0.0  # of the total, the time no function's own time holds


def attribute(stats: pstats.Stats) -> Attribution:
    """The run's own time and calls by row."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    rows: dict[str, float] = defaultdict(float)
    counts: dict[str, float] = defaultdict(float)
    rows_of: dict[Any, str] = {}

    def charge(function: Any, amount: float, calls: float, depth: int) -> None:
        row = rows_of.get(function)
        if row is None:
            row = rows_of[function] = row_of(function)
        if row != CHARGED:
            rows[row] += amount
            counts[row] += calls
            return
        callers = {c: edge for c, edge in raw[function][4].items() if c != function} if function in raw else {}
        weights = {c: edge[2] for c, edge in callers.items()}
        total = sum(weights.values())
        if depth > 12 or not callers:
            rows["other (no caller)"] += amount
            counts["other (no caller)"] += calls
            return
        if total <= 0:  # no time from any caller: by calls
            weights = {c: edge[1] for c, edge in callers.items()}
            total = sum(weights.values()) or 1
        for caller, weight in weights.items():
            if weight:
                charge(caller, amount * weight / total, calls * weight / total, depth + 1)

    own = 0.0
    for function, (_cc, nc, tt, _ct, _callers) in raw.items():
        own += tt
        charge(function, tt, nc, 0)
    functions = {function: (nc, cc) for function, (cc, nc, _tt, _ct, _callers) in raw.items()}
    return Attribution(dict(rows), dict(counts), own, functions)


def profiled(fn: Callable[[], Any]) -> Attribution:
    """``fn`` run under cProfile, by row. cProfile keeps its default clock, wall time: a CPU-time clock is a system
    call on each event, which makes the instrumented run several times slower and weighs on code that makes many
    small calls far more than on the rest (another process's time, on a loaded machine, falls on whatever ran)."""
    gc.collect()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    try:
        fn()
    finally:
        profiler.disable()
    elapsed = time.perf_counter() - start
    attribution = attribute(pstats.Stats(profiler))
    # C++ that calls back into Python (an ATen op beneath a Python dispatch mode) loses cProfile its own time
    # (of the kernel, in a real run): what the run took beyond the functions' own times goes to the C++ row
    attribution.lost = max(0.0, elapsed - attribution.total)
    attribution.seconds[CPP] = attribution.seconds.get(CPP, 0.0) + attribution.lost
    attribution.total += attribution.lost
    return attribution


def _dispatch_code(cls: type) -> tuple[str, int]:
    code = inspect.unwrap(vars(cls)["handle" if issubclass(cls, Layer) else "__torch_dispatch__"]).__code__
    return str(Path(code.co_filename).resolve()), code.co_firstlineno


_MODES = {"Dispatcher": Dispatcher, "KnownValues": KnownValues, "KernelOutputs": KernelOutputs, "Routing": Routing, "CudaOps": CudaOps}


def mode_calls(calls: dict[tuple[str, int, str], tuple[int, int]]) -> dict[str, int]:
    """How many ops reached each dispatch mode's ``__torch_dispatch__`` (a layer's ``handle``; its primitive calls)."""
    where = {_dispatch_code(cls): label for label, cls in {**_MODES, "FakeTensorMode": FakeTensorMode}.items()}
    seen: dict[str, int] = {}
    for (filename, line, _name), (_nc, cc) in calls.items():
        label = where.get((str(Path(filename).resolve()), line)) if filename.startswith("/") else None
        if label is not None:
            seen[label] = cc
    return seen


# measuring ---------------------------------------------------------------------------------------


CLOCK = time.process_time  # --clock: this process's CPU time (the default), or wall time (time.perf_counter)


def seconds(fn: Callable[[], Any]) -> float:
    gc.collect()  # what earlier runs left is not this run's to collect
    start = CLOCK()
    fn()
    return CLOCK() - start


def interleaved(variants: dict[str, Callable[[], Any]], rounds: int) -> tuple[dict[str, list[float]], dict[str, str]]:
    """The times of each variant over ``rounds`` rounds, each round running all of them in a rotated order;
    a variant that raises is dropped (with its error)."""
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    failed: dict[str, str] = {}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            if name in failed:
                continue
            try:
                times[name].append(seconds(variants[name]))
            except Exception as error:  # an ablated run may refuse: it is reported, not timed
                failed[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}"
    return {k: v for k, v in times.items() if k not in failed}, failed


def ablated(run: Callable[[], Any], context: Callable[[], Any]) -> Callable[[], Any]:
    def go() -> Any:
        with context():
            return run()

    return go


@dataclass
class Row:
    part: str
    method: str
    ms: float
    floor_ms: float | None = None
    note: str = ""


@dataclass
class Report:
    workload: Workload
    ops: int
    ops_source: str
    full: float
    floor: float | None
    references: dict[str, float]
    seen: dict[str, int]
    rows: list[Row]
    failed: dict[str, str]
    rounds: int
    attribution: Attribution
    floor_attribution: Attribution | None
    load: str
    spread: float  # the profile's median time less its best: savings below it are not resolved


def measure(workload: Workload, repeats: int) -> Report:
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    warm = seconds(workload.run)  # the first run imports and fills caches
    warm = min(warm, seconds(workload.run))
    if workload.floor is not None:
        workload.floor()
    for reference in workload.references.values():
        reference()
    # at least `repeats` rounds; cheap workloads more, so that each variant runs about 1.5 s in all
    rounds = max(repeats, min(4 * repeats, int(1.5 / max(warm, 1e-3))))
    variants: dict[str, Callable[[], Any]] = {"profile": workload.run}
    if workload.floor is not None:
        variants["floor"] = workload.floor
    variants.update(workload.references)
    for name in workload.ablations:
        variants[name] = ablated(workload.run, ABLATIONS[name][2])
    times, failed = interleaved(variants, rounds)
    best = {name: min(values) for name, values in times.items()}
    full = best["profile"]
    spread = statistics.median(times["profile"]) - full
    floor = best.get("floor")

    # cProfile: the profile, and the floor
    attribution = profiled(workload.run)
    rows = attribution.seconds
    seen = mode_calls(attribution.functions)
    floor_attribution = profiled(workload.floor) if workload.floor is not None else None
    floor_rows = floor_attribution.seconds if floor_attribution is not None else {}
    if workload.count is not None:
        ops, source = workload.count(), "ATen ops of the untracked step (a counting mode above it)"
    else:
        ops, source = seen.get("FakeTensorMode", 0), "ops that reached the fake mode in the profile"
    table = [
        Row(part, "cProfile", value, floor_rows.get(part, 0.0) if floor_rows else None)
        for part, value in sorted(rows.items(), key=lambda item: -item[1])
    ]
    for part in floor_rows:
        if part not in rows:
            table.append(Row(part, "cProfile", 0.0, floor_rows[part]))
    for name in workload.ablations:
        if name in best:
            part, how, _ = ABLATIONS[name]
            table.append(Row(part, "ablation", full - best[name], note=how))
    references = {k: best[k] for k in workload.references if k in best}
    load += " -> " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    return Report(workload, ops, source, full, floor, references, seen, table, failed, rounds, attribution, floor_attribution, load, spread)


# output ------------------------------------------------------------------------------------------


def lines_of(report: Report) -> tuple[list[str], list[str]]:
    """The report as text lines, and as markdown lines."""
    w, ops = report.workload, max(report.ops, 1)
    overhead = report.full - report.floor if report.floor is not None else None
    clock = "CPU time" if CLOCK is time.process_time else "wall time"
    a, fa = report.attribution, report.floor_attribution
    facts = [
        f"profile: {report.full * 1e3:.1f} ms of {clock} (best of {report.rounds}, interleaved with the variants below; "
        f"its median is {report.spread * 1e3:.1f} ms more: an ablation's saving below that is noise)"
    ]
    if report.floor is not None and overhead is not None:
        facts.append(
            f"floor ({w.floor_title}): {report.floor * 1e3:.1f} ms; profile/floor {report.full / report.floor:.2f}x; "
            f"overhead {overhead * 1e3:.1f} ms"
        )
    else:
        facts.append(f"floor: {w.floor_title}")
    for name, value in report.references.items():
        facts.append(f"{name}: {value * 1e3:.1f} ms; profile/{name.split()[-1]} {report.full / value:.2f}x")
    facts.append(
        f"ops: {report.ops} ({report.ops_source}); profile {report.full / ops * 1e6:.1f} us/op"
        + (f", floor {report.floor / ops * 1e6:.1f} us/op, overhead {(overhead or 0) / ops * 1e6:.1f} us/op" if report.floor else "")
    )
    if report.seen:
        facts.append("ops reaching each dispatch mode in the profile: " + ", ".join(f"{k} {v}" for k, v in sorted(report.seen.items())))
    facts.append(
        f"under cProfile the profile took {a.total * 1e3:.0f} ms ({a.total / report.full:.1f}x its plain time, "
        f"{sum(a.calls.values()):.0f} calls; {a.lost * 1e3:.0f} ms in no function's own time, put in the C++ row)"
        + (f", the floor {fa.total * 1e3:.0f} ms ({sum(fa.calls.values()):.0f} calls; {fa.lost * 1e3:.0f} ms)" if fa is not None else "")
    )
    facts.append(f"load average (1, 5, 15 min) at the start and the end of this workload: {report.load}")
    text = [f"== {w.name}: {w.title}", *(f"  {fact}" for fact in facts)]
    md = [f"### {w.name}", "", w.title, "", *(f"- {fact}" for fact in facts), ""]
    header = ("part", "method", "ms", "us/op", "%", "% of overhead", "floor ms")
    text.append(f"  {header[0]:<80} {header[1]:<9} {header[2]:>8} {header[3]:>7} {header[4]:>6} {header[5]:>13} {header[6]:>9}")
    md += [
        "Measured rows: best times (ms, us/op) and their share of the profile's (%). "
        "cProfile rows: own time under cProfile (ms, us/op), its share of the instrumented run (%), the row's extra over "
        "the floor's same row as a share of the instrumented extra (% of overhead), and the floor's row (floor ms). "
        "Ablation rows: the time saved with the part replaced as the note says (ms, us/op), as a share of the run (%) "
        "and of its overhead over the floor.",
        "",
        "| " + " | ".join(header) + " |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    extra = a.total - fa.total if fa is not None else None
    measured = [("the profile", report.full)]
    if report.floor is not None:
        measured.append((f"the untracked step (the floor: {w.floor_title})", report.floor))
    measured += [(f"reference: {name}", value) for name, value in report.references.items()]
    for label, value in measured:
        cells = (f"{value * 1e3:.1f}", f"{value / ops * 1e6:.1f}", f"{value / report.full * 100:.1f}", "", "")
        text.append(f"  {label[:80]:<80} {'measured':<9} {cells[0]:>8} {cells[1]:>7} {cells[2]:>6} {cells[3]:>13} {cells[4]:>9}")
        md.append(f"| {label} | measured | {' | '.join(cells)} |")
    for row in [r for r in report.rows if r.method == "cProfile"] + [r for r in report.rows if r.method == "ablation"]:
        if row.method == "cProfile":
            share = row.ms / a.total * 100
            of_overhead = f"{(row.ms - (row.floor_ms or 0.0)) / extra * 100:.1f}" if extra else ""
        else:
            share = row.ms / report.full * 100
            of_overhead = f"{row.ms / overhead * 100:.1f}" if overhead else ""
        floor_ms = f"{row.floor_ms * 1e3:.1f}" if row.floor_ms is not None else ""
        label = row.part + (f" [{row.note}]" if row.note else "")
        cells = (f"{row.ms * 1e3:.1f}", f"{row.ms / ops * 1e6:.1f}", f"{share:.1f}", of_overhead, floor_ms)
        text.append(f"  {label[:80]:<80} {row.method:<9} {cells[0]:>8} {cells[1]:>7} {cells[2]:>6} {cells[3]:>13} {cells[4]:>9}")
        md.append(f"| {label} | {row.method} | {' | '.join(cells)} |")
    for name, error in report.failed.items():
        text.append(f"  ablation {name!r} could not run: {error}")
        md.append(f"| {ABLATIONS[name][0] if name in ABLATIONS else name} | ablation | failed: {error} | | | | |")
    md.append("")
    return text, md


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), Python {platform.python_version()}; load average before the run "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )


def revision() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        status = ["git", "status", "--porcelain", "pytest_modelprof"]
        dirty = subprocess.run(status, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"
    return f"{head}{' with uncommitted changes to pytest_modelprof/' if dirty else ''}"


def write_markdown(path: Path, body: list[str]) -> None:
    """Replace what lies between the markers of ``path`` with ``body`` (the markers and the rest are kept)."""
    block = "\n".join([MARK_BEGIN, *body, MARK_END])
    text = path.read_text() if path.exists() else ""
    if MARK_BEGIN in text and MARK_END in text:
        before, rest = text.split(MARK_BEGIN, 1)
        after = rest.split(MARK_END, 1)[1]
        text = before + block + after
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + block + "\n"
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the 7B-shaped model (of 32)")
    parser.add_argument("--fsdp-layers", type=int, default=2, help="decoder layers of the 70B-shaped model (of 80)")
    parser.add_argument("--resnet-train-batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of interleaved runs at least (cheap workloads get more)")
    parser.add_argument("--only", metavar="TEXT", help="the workloads whose name contains TEXT")
    parser.add_argument(
        "--all",
        action="store_true",
        help="add the workloads of the parts only a target or a sharded step runs (H100 7B, FSDP2 70B rank: a minute or two more)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch's intra-op threads (1: the real runs' kernels do not wait on a core another process holds)",
    )
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="what is timed: this process's CPU time (steadier on a shared machine) or wall time",
    )
    parser.add_argument("--markdown", type=Path, default=ROOT / "benchmarks" / "profiler_cost.md")
    parser.add_argument("--no-markdown", action="store_true")
    options = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(options.threads)
    global CLOCK
    CLOCK = time.process_time if options.clock == "cpu" else time.perf_counter
    torch.manual_seed(0)
    builders: list[tuple[str, Callable[[], Workload]]] = [
        ("llama7b-flops", lambda: llama_flops(options.layers)),
        ("llama7b-memory-adamw", lambda: llama_memory(options.layers)),
        ("resnet50-forward-flops", resnet_forward),
        ("resnet50-train-memory", lambda: resnet_train(options.resnet_train_batch)),
    ]
    if options.all or (options.only and any(options.only in name for name in ("llama7b-h100-target", "llama70b-fsdp64-h100"))):
        builders += [
            ("llama7b-h100-target", lambda: llama_target(options.layers)),
            ("llama70b-fsdp64-h100", lambda: llama70b_fsdp(options.fsdp_layers)),
        ]
    started = time.perf_counter()
    about = machine()
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    print(f"{when}; {about}; {revision()}", flush=True)
    md = [
        f"Written by `python benchmarks/profiler_cost.py{' ' + ' '.join(sys.argv[1:]) if sys.argv[1:] else ''}` on {when}: "
        f"{about}; code at {revision()}.",
        "",
    ]
    for name, build in builders:
        if options.only and options.only not in name:
            continue
        report = measure(build(), options.repeats)
        text, markdown = lines_of(report)
        print("\n".join(text), flush=True)
        md += markdown
    elapsed = time.perf_counter() - started
    print(f"took {elapsed:.0f} s")
    md.append(f"The script took {elapsed:.0f} s.")
    if not options.no_markdown:
        write_markdown(options.markdown, md)
        print(f"tables written to {options.markdown}")


if __name__ == "__main__":
    main()
