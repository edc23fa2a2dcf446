"""Every op in PyTorch's OpInfo database, forward and backward: the bytes of the storages its real
CPU kernels make against those its fake kernels make in an analytic run (with the engine's own
corrections, :class:`~pytest_modelprof.engine.analytic.kernel_outputs.KernelOutputs`).

An analytic run's memory is only as exact as the fake kernels' outputs: a meta kernel that makes a
smaller storage than its real kernel (an output made for one shape and resized to another, a
library's workspace) makes analytic peaks low. This sweep lists each op whose samples' storages add
up differently, with the dispatched ops that differ. Dispatched ops that create no storage (views,
and the scalar constants a fake mode lifts) are left out of the sums.

Needs PyTorch's test utilities: ``pip install expecttest hypothesis``.

    python benchmarks/opinfo_storage.py [--dtype bfloat16] [--samples 4] [OP ...]
"""

from __future__ import annotations

import argparse
import collections
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from pytest_modelprof.engine.analytic.kernel_outputs import KernelOutputs

IGNORED = frozenset({"aten.lift_fresh"})  # a fake mode's copy of a scalar constant


class _Storages(TorchDispatchMode):
    """Bytes of the storages each dispatched op makes (outputs sharing no input's storage), by op."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket)
        if name in IGNORED:
            return out
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if _strided(t)}
        for t in tree_flatten(out)[0]:
            if _strided(t) and t.untyped_storage()._cdata not in inputs:
                self.bytes[name] += t.untyped_storage().nbytes()
        return out


def _strided(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.layout == torch.strided


def _step(op: Any, sample: Any, fake_mode: FakeTensorMode | None) -> collections.Counter[str]:
    """The op on the sample, then the backward pass of its differentiable outputs."""

    def convert(t: Any) -> Any:
        if fake_mode is None or not isinstance(t, torch.Tensor):
            return t
        return fake_mode.from_tensor(t.detach()).requires_grad_(t.requires_grad)

    args, kwargs = tree_map(convert, ((sample.input, *sample.args), sample.kwargs))
    storages = _Storages()
    with storages:
        out = op.op(*args, **kwargs)
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]
        if outputs:
            torch.autograd.backward(outputs, [torch.ones_like(t) for t in outputs])
    return storages.bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ops", nargs="*", help="OpInfo names (all by default)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--samples", type=int, default=4, help="samples per op")
    options = parser.parse_args()
    warnings.filterwarnings("ignore")
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as error:
        raise SystemExit(f"{error}: pip install expecttest hypothesis") from error
    dtype = getattr(torch, options.dtype)
    checked = differing = 0
    for op in op_db:
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if (options.ops and name not in options.ops) or dtype not in op.supported_dtypes("cpu"):
            continue
        try:
            samples = list(op.sample_inputs("cpu", dtype, requires_grad=op.supports_autograd))[: options.samples]
        except Exception:  # an op whose samples cannot be made here
            continue
        for sample in samples:
            try:
                real = _step(op, sample, None)
                with FakeTensorMode(allow_non_fake_inputs=True) as fake_mode, KernelOutputs():
                    fake = _step(op, sample, fake_mode)
            except Exception:  # a sample either kernel refuses, or one fake tensors cannot run (values read)
                continue
            checked += 1
            if sum(real.values()) != sum(fake.values()):
                differing += 1
                ops = {k: (real[k], fake[k]) for k in sorted(set(real) | set(fake)) if real[k] != fake[k]}
                print(f"{name}: real {sum(real.values())} B, analytic {sum(fake.values())} B  {ops}", flush=True)
                break
    print(f"{checked} samples run both ways, {differing} ops with storages that differ ({options.dtype})")


if __name__ == "__main__":
    main()
