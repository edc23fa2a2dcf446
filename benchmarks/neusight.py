"""NeuSight's measured kernel times (pytest_modelprof/data/kernel-data) as the cost model sees them.

``measurements()`` gives each measured op as a :class:`Measured`: the GPU of the engine's table it ran
on, its kernel class (NeuSight's: ``bmm``, ``linear``, ``elementwise``, ``softmax``, ``layer norm``, and
``conv``), the seconds measured, and the op's :class:`~pytest_modelprof.engine.targets.cost.Work` as the
engine reads it off the same ATen op run on meta tensors (``op_features``, as a profile's predicted-time
meter does). Used by benchmarks/kernel_data.py and the tests of the kernel model.
"""

from __future__ import annotations

import csv
import gzip
import random
from collections import defaultdict
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import torch

from benchmarks.gpu_truth import tf32_flags
from pytest_modelprof.engine.formulas import FormulaTable
from pytest_modelprof.engine.meters import Op
from pytest_modelprof.engine.meters.predicted import op_features
from pytest_modelprof.engine.targets.catalog import GPUS
from pytest_modelprof.engine.targets.cost import Work
from pytest_modelprof.engine.targets.gpus import GPUSpec

DATA = Path(__file__).resolve().parents[1] / "pytest_modelprof" / "data" / "kernel-data"
GPU_NAMES = {  # the devices' names in the data -> the engine's table
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb",
    "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "Tesla V100-PCIE-32GB": "v100-pcie",
    "Tesla T4": "t4",
    "Tesla P100-PCIE-16GB": "p100",
    "Tesla P4": "p4",
}
CLASSES = {
    "bmm": "bmm",
    "linear": "linear",
    "conv": "conv",
    "softmax": "softmax",
    "ln": "layer norm",
    **{op: "elementwise" for op in ("add", "mul", "div", "pow", "gelu", "relu", "tanh", "addu", "mulu", "divu", "powu")},
}
# NeuSight's own out-of-distribution per-op errors (its paper), the anchors to beat
NEUSIGHT = {"bmm": 0.138, "linear": 0.139, "elementwise": 0.193, "softmax": 0.139, "layer norm": 0.567}

aten = torch.ops.aten


class Measured(NamedTuple):
    gpu: GPUSpec
    kind: str  # the kernel class
    op: str  # NeuSight's op name
    seconds: float
    work: Work


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta")


def _call(row: dict[str, str]) -> tuple[Any, tuple[Any, ...]]:
    """The ATen op NeuSight timed for a row, and its arguments (see the data's README for the shapes)."""
    op = row["op"]
    size = {
        k: int(v) for k, v in row.items() if k in ("b", "m", "n", "k", "h", "c_in", "c_out", "kernel", "size", "stride", "padding") and v
    }
    if op == "linear":  # an m x n input, n input and k output features, no bias: x @ w.t()
        return aten.mm.default, (_meta(size["m"], size["n"]), _meta(size["k"], size["n"]).t())
    if op == "bmm":
        return aten.bmm.default, (_meta(size["b"], size["m"], size["n"]), _meta(size["b"], size["n"], size["k"]))
    if op == "conv":
        x = _meta(size["b"], size["c_in"], size["size"], size["size"])
        w = _meta(size["c_out"], size["c_in"], size["kernel"], size["kernel"])
        stride, padding = [size["stride"]] * 2, [size["padding"]] * 2
        return aten.convolution.default, (x, w, None, stride, padding, [1, 1], False, [0, 0], 1)
    x = _meta(size["b"], size["h"])
    if op == "softmax":
        return aten._softmax.default, (x, -1, False)
    if op == "ln":
        return aten.native_layer_norm.default, (x, [size["h"]], _meta(size["h"]), _meta(size["h"]), 1e-5)
    if op in ("gelu", "relu", "tanh"):
        return getattr(aten, op).default, (x,)
    if op.endswith("u"):  # with a scalar
        base = op[:-1]
        return (aten.pow.Tensor_Scalar if base == "pow" else getattr(aten, base).Scalar), (x, 2.0)
    return (aten.pow.Tensor_Tensor if op == "pow" else getattr(aten, op).Tensor), (x, _meta(size["b"], size["h"]))


def work_of(row: dict[str, str], formulas: FormulaTable | None = None) -> Work:
    """The work the engine reads off the op of a row (run on meta tensors), as the data's protocol ran it:
    products in fp32 with TF32 off (set by :func:`measurements` around its calls)."""
    func, args = _call(row)
    return work_of_call(func, args, formulas)


def work_of_call(func: Any, args: tuple[Any, ...], formulas: FormulaTable | None = None) -> Work:
    """The work the engine reads off one ATen op called on ``args`` (meta tensors) in a forward pass, for a CUDA
    target, as a profile's predicted-time meter reads it."""
    out = func(*args)
    name = f"aten.{func._schema.name.split('::')[1]}"
    return op_features(Op(func, name, args, {}, out, "forward", (), None), formulas or FormulaTable(), "cuda")


def rows() -> Iterator[dict[str, str]]:
    """The data's rows, as its CSV holds them."""
    with gzip.open(DATA / "kernels.csv.gz", "rt", newline="") as handle:
        yield from csv.DictReader(handle)


@cache
def measurements(per_file: int | None = None, seed: int = 0) -> tuple[Measured, ...]:
    """Every measurement (``per_file``: at most that many of each op and GPU, drawn with ``seed``), its work
    read as the data's protocol ran it: fp32 products with TF32 off."""
    groups: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for row in rows():
        groups[(row["op"], row["gpu"])].append(row)
    draw = random.Random(seed)
    formulas = FormulaTable()
    out = []
    with tf32_flags(matmul=False, cudnn=False):  # the protocol's: products in fp32
        for (op, device), group in sorted(groups.items()):
            if per_file is not None and len(group) > per_file:
                group = draw.sample(group, per_file)
            gpu = GPUS[GPU_NAMES[device]]
            out.extend(Measured(gpu, CLASSES[op], op, float(row["ms"]) * 1e-3, work_of(row, formulas)) for row in group)
    return tuple(out)


def split(data: tuple[Measured, ...], held_out: str) -> tuple[list[Measured], list[Measured]]:
    """The measurements of the other GPUs, and of ``held_out`` (a name of the engine's table)."""
    return [m for m in data if m.gpu.name != held_out], [m for m in data if m.gpu.name == held_out]


Predict = Callable[[Measured], float]
