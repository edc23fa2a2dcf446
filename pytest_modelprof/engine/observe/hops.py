"""Higher-order operators (``torch.cond``, ``while_loop``, ``scan``, ``map``, ``invoke_subgraph``,
``flex_attention``, ...) as a run's meters see them.

A higher-order operator takes functions as well as tensors. PyTorch hands one to a dispatch mode
only when the mode says it can take them (``supports_higher_order_operators``); every mode of
the engine does, and all but the dispatcher pass them on untouched. The dispatcher
does one of three things with each (:func:`one_op`, :func:`run_eagerly`):

- **a kernel of its own**: an operator the target runs as one fused kernel (``flex_attention`` and
  its backward on a CUDA device) is one op, counted by its formula like an ATen op, its outputs the
  kernel's (the attention output and its log-sum-exp, not the scores);
- **its eager meaning**: an operator PyTorch runs in eager mode through a Python kernel
  (``flex_attention`` on a CPU, its dense path, scores and all) runs that kernel with the meters
  seeing every op it issues, under the module that called it;
- **anything else**: a one-line :class:`~..errors.ProfileError` that names the operator and says how
  to count it.

The control-flow operators (``cond``, ``while_loop``, ``scan``, ``map``, ``invoke_subgraph``) never reach
the dispatcher: for the run (:func:`eager_higher_order`), each runs its eager meaning where autograd
meets it, before any dispatch mode: ``cond`` the branch its predicate takes, ``while_loop`` its body
until the condition fails, ``scan`` and ``map`` their function once per slice, ``invoke_subgraph`` its
subgraph. Their ops then run as the model's own, through autograd and every mode, under the module
that called them: each iteration is counted, the backward of what ran too, and gradients reach the
parameters a body closes over (PyTorch's own eager kernels rely on ``torch.compile`` to lift those, which
a dispatch mode keeps from compiling).

A predicate or loop condition an analytic run cannot read (it is computed from values the run
does not have) stops the run with a one-line error that says so: the engine does not guess a branch.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch._C import DispatchKey
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten

from ..errors import ProfileError

# the module (torch._higher_order_ops exports its operator under the same name)
_flex_hop = importlib.import_module("torch._higher_order_ops.flex_attention")

# operators that are one fused kernel on a CUDA device (elsewhere they run their eager Python kernel)
FUSED_ON_CUDA = frozenset({"flex_attention", "flex_attention_backward"})

# operators whose eager kernel reads a value to decide what runs: what the error names
_DECIDING = {"cond": "its predicate", "while_loop": "its loop condition", "while_loop_stack_output": "its loop condition"}
_LOOPS = frozenset({"while_loop", "while_loop_stack_output"})  # torch's kernels read their condition within


def is_hop(func: Any) -> bool:
    """Whether ``func`` is a higher-order operator (a dispatch mode gets these with no types)."""
    return isinstance(func, HigherOrderOperator)


def hop_name(hop: HigherOrderOperator) -> str:
    """The name a higher-order operator is reported by: ``"higher_order.cond"``."""
    return f"higher_order.{hop._name}"


def one_op(hop: HigherOrderOperator, args: Any, kwargs: dict[str, Any], has_formula: bool) -> bool:
    """Whether this call of ``hop`` is counted as one op (see the module's notes): a fused kernel on a CUDA
    device, or an operator the run has a formula for (``has_formula``) that has no fused kernel."""
    if hop._name not in FUSED_ON_CUDA:
        return has_formula
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    return bool(tensors) and tensors[0].device.type == "cuda"


@contextlib.contextmanager
def eager_higher_order() -> Iterator[None]:
    """For the run, higher-order operators called outside ``torch.compile`` run as eager PyTorch means them.

    ``flex_attention`` calls its operator directly, as PyTorch's own debug switch makes it (otherwise it
    compiles a wrapper with ``fullgraph=True``, which a dispatch mode makes fail; the switch also keeps
    back its warning that eager flex attention is unfused: the run counts what runs). ``torch.cond`` runs
    the branch its predicate takes, in Python: torch's eager ``cond`` relies on ``torch.compile`` to make
    the parameters a branch closes over its inputs, and under a dispatch mode it does not compile, so
    gradients would not reach them."""
    flex = sys.modules.get("torch.nn.attention.flex_attention")
    before = (getattr(flex, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", None), torch.cond, _flex_hop.create_fw_bw_graph)
    if before[0] is not None:
        flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True  # type: ignore[union-attr]
    torch.cond = _cond
    _flex_hop.create_fw_bw_graph = _traced_on_the_cpu(before[2])  # type: ignore[attr-defined]
    control = {hop: hop.py_kernels.get(DispatchKey.Autograd) for hop in _control_flow()}
    for hop in control:
        hop.py_kernels[DispatchKey.Autograd] = _eagerly(hop)
        hop._dispatch_cache.clear()
    try:
        yield
    finally:
        for hop, kernel in control.items():
            if kernel is None:
                hop.py_kernels.pop(DispatchKey.Autograd, None)
            else:
                hop.py_kernels[DispatchKey.Autograd] = kernel
            hop._dispatch_cache.clear()
        if before[0] is not None:
            flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = before[0]  # type: ignore[union-attr]
        torch.cond = before[1]
        _flex_hop.create_fw_bw_graph = before[2]  # type: ignore[attr-defined]


def _traced_on_the_cpu(create_fw_bw_graph: Any) -> Any:
    """Flex attention's autograd traces ``score_mod``'s forward and backward graphs by running autograd on
    single values of the query's device. On a CUDA target (fake CUDA tensors, maybe no GPU) those values are
    made on the CPU instead, in a fake mode of their own: the graphs hold the same ops on any device. A
    ``score_mod`` that reads tensors of the run it closes over (eager mode lifts none into ``other_buffers``)
    cannot be traced there; the fused backward kernel's count and outputs do not need its graph, which is
    then left out."""

    def create(score_mod: Any, index_values: Any, other_buffers: Any) -> Any:
        values = [*index_values, *other_buffers]
        if not any(isinstance(t, FakeTensor) and t.device.type == "cuda" for t in values):
            return create_fw_bw_graph(score_mod, index_values, other_buffers)
        try:
            with _disable_current_modes(), torch._C.DisableTorchFunction(), FakeTensorMode():
                on_cpu = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).requires_grad_(t.requires_grad) for t in values]
                return create_fw_bw_graph(score_mod, tuple(on_cpu[: len(index_values)]), tuple(on_cpu[len(index_values) :]))
        except Exception:
            if other_buffers:
                raise
            return score_mod, None

    # never traced by dynamo: a model that compiles flex attention (Hugging Face's) has dynamo tracing frames
    # beneath it once the run's modes are off, and it would trace these values as its own
    return torch.compiler.disable(create)  # type: ignore[no-untyped-call]


def _undecided(name: str) -> str:
    return (
        f"torch.{name}: {_DECIDING[name]} is computed from values an analytic run does not have, so the run cannot "
        f"tell what runs; profile on real tensors (device='cpu'), or make the value follow from the inputs"
    )


def _control_flow() -> list[HigherOrderOperator]:
    """The control-flow operators this torch has (see the module's notes)."""
    hops = (getattr(torch.ops.higher_order, name, None) for name in (*_OWN, *(_TORCH_KERNELS - FUSED_ON_CUDA)))
    return [hop for hop in hops if hop is not None]


def _eagerly(hop: HigherOrderOperator) -> Any:
    """``hop``'s eager meaning (see the module's notes), or None where the engine has none: a loop whose condition
    the run cannot read is a one-line error."""
    torch_kernel = hop.py_kernels.get(DispatchKey.CompositeExplicitAutograd) if hop._name in _TORCH_KERNELS else None
    kernel: Any = _OWN.get(hop._name) or torch_kernel
    if kernel is None or hop._name not in _LOOPS:
        return kernel  # (cond reads its predicate itself: an error in a branch is the branch's)

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return kernel(*args, **kwargs)
        except DataDependentOutputException as error:
            raise ProfileError(_undecided(hop._name)) from error

    return run


def run_eagerly(dispatcher: contextlib.AbstractContextManager[Any], hop: HigherOrderOperator, args: Any, kwargs: dict[str, Any]) -> Any:
    """``hop``'s eager meaning, its ops dispatched through the dispatcher (``dispatcher``: it entered again;
    see the module's notes)."""
    kernel = _eagerly(hop)
    if kernel is None:
        raise ProfileError(
            f"the engine has no rule for the higher-order operator torch.ops.{hop_name(hop)}; count it as one op with "
            f"profile(..., formulas={{torch.ops.{hop_name(hop)}: formula}}) or register_flop_formula"
        )
    with dispatcher:
        return kernel(*args, **kwargs)


def _cond(pred: Any, true_fn: Any, false_fn: Any, operands: Any = ()) -> Any:
    """``cond`` as eager mode means it (``torch.cond``'s signature): the branch the predicate takes."""
    try:
        taken = bool(pred)
    except DataDependentOutputException as error:  # the predicate only: an error in the branch is the branch's
        raise ProfileError(_undecided("cond")) from error
    return true_fn(*operands) if taken else false_fn(*operands)


def _invoke_subgraph(subgraph: Any, identifier: Any, *operands: Any) -> Any:
    return subgraph(list(operands)) if getattr(subgraph, "_boxed_call", False) else subgraph(*operands)


def _scan(combine_fn: Any, init: Any, xs: Any, additional_inputs: Any = (), *_: Any, **__: Any) -> Any:
    """``scan``'s operator, once per slice of the leading dimension (the operator has moved the scanned
    dimension there and reversed a reverse scan): ``combine_fn(*carry, *slices, *additional)`` returns the
    next carry and this step's outputs; the result is the last carry and the outputs stacked."""
    carry, outputs = list(init), []
    for step in range(xs[0].shape[0] if xs else 0):
        made = combine_fn(*carry, *(x[step] for x in xs), *additional_inputs)
        carry, out = list(made[: len(carry)]), made[len(carry) :]
        outputs.append(out)
    stacked = [torch.stack([out[i] for out in outputs]) for i in range(len(outputs[0]))] if outputs else []
    return [*carry, *stacked]


# eager meanings written here: PyTorch's own eager kernels of these refuse to run under a dispatch mode
_OWN = {"cond": _cond, "invoke_subgraph": _invoke_subgraph, "scan": _scan}
# operators whose eager kernel (PyTorch's) runs under a dispatch mode, every op it issues dispatched
_TORCH_KERNELS = frozenset({"while_loop", "while_loop_stack_output", "map_impl", "flex_attention", "flex_attention_backward"})
