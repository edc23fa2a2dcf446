"""The measured H100 records (pytest_modelprof/data/gpu-truth): each workload of capture.py built for an analytic run.

``workload(name)`` gives the model (on the meta device), its inputs and the keyword
arguments of :func:`pytest_modelprof.profile` that make the step ``capture.py`` measured;
``records()`` the measured records by name. Used by tests/test_targets.py and the
predicted-time benchmark.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from pytest_modelprof.engine.calibrate import Observed, observe
from pytest_modelprof.engine.targets import cudnn
from pytest_modelprof.engine.targets.cost import Work
from pytest_modelprof.engine.targets.gpus import GPUSpec

TRUTH = Path(__file__).resolve().parents[1] / "pytest_modelprof" / "data" / "gpu-truth"
# the cuDNN the records ran (torch 2.11.0+cu130 pins nvidia-cudnn-cu13==9.19.0.56): cuDNN's
# convolution workspaces are those of the cuDNN that answers, so the records' reserved bytes
# are reproduced with this one (benchmarks/memory_vs_h100.py --cudnn)
CUDNN = 91900


# capture.py's optimizers, by the name its SHARED table gives them
OPTIMIZERS: dict[str | None, Callable[[Any], torch.optim.Optimizer | None]] = {
    "sgdm": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
    "adamw": torch.optim.AdamW,
    "adam": torch.optim.Adam,
    None: lambda p: None,
}


def same_cudnn() -> bool:
    """Whether the cuDNN loaded here is the records' (major and minor version)."""
    library = cudnn.library()
    return library is not None and library.version // 100 == CUDNN // 100


def available() -> bool:
    return (TRUTH / "h100.json").exists() and (TRUTH / "capture.py").exists()


@cache
def capture() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_truth_capture", TRUTH / "capture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def records(gpu: str = "h100") -> dict[str, dict[str, Any]]:
    """The records of one file of the gpu-truth folder, by workload name: ``h100`` (the shared workloads the
    shipped calibration is fitted on), ``h200`` (those and the held-out ones, on an H200), ``h200-probes``
    (one-layer steps, for their kernel times), ``h200-repeat`` (five captured again); ``h200-b``, ``h200-b-repeat``,
    ``h200-tf32``, ``h200-probes-b``, ``h200-probes-c``: a second capture, with each step's host time; ``h100-heldout``,
    ``h100-heldout-repeat``, ``h100-shared-b``: the held-out and shared workloads on another H100 machine (see the
    folder's README)."""
    path = TRUTH / f"{gpu}.json"
    return {r["name"]: r for r in json.loads(path.read_text()) if "error" not in r} if available() and path.exists() else {}


def heldout(name: str) -> bool:
    """Whether ``name`` is one of capture.py's held-out workloads (kept out of every fit)."""
    return name in capture().HELDOUT


def observed(gpu: GPUSpec, records: dict[str, dict[str, Any]]) -> list[Observed]:
    """Each record's workload run analytically on ``gpu`` and matched to it (``calibrate.observe``), with the
    TF32 flags the record ran with (``allow_tf32``; where it has none, torch's defaults)."""
    out = []
    for name, record in records.items():
        model, inputs, keywords = workload(name)
        with tf32_flags(**record.get("allow_tf32", {})):
            out.append(observe(gpu, model, inputs, record, **keywords))
    return out


@contextmanager
def tf32_flags(matmul: bool = False, cudnn: bool = True) -> Iterator[None]:
    """torch's TF32 flags for matrix products and for cuDNN set as a record's run had them, then restored."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def workload(name: str) -> tuple[torch.nn.Module, torch.Tensor, dict[str, Any]]:
    """The model, its inputs and profile()'s keywords (train, optimizer, autocast, loss_fn) for ``name``."""
    module = capture()
    build, make_x, train, dtype, autocast, opt_name = module.WORKLOADS[name]
    with torch.device("meta"):
        model = build()
    if dtype is not None:
        model = model.to(dtype)
    keywords = {"train": train, "optimizer": OPTIMIZERS[opt_name](model.parameters()), "autocast": autocast, "loss_fn": module.loss_of}
    return model, make_x("meta", dtype or torch.float32), keywords


def layout_kernels(gpu: GPUSpec) -> list[tuple[GPUSpec, list[Work], float]]:
    """The kernels of ``layout_probes.py`` measured on ``gpu`` (``{gpu.name}-layout.json``): each its op's work as a
    profile reads it (elementwise on the vector and the strided path alike, and the sums down rows, along rows and
    over an NCHW tensor's batch and pixels) and its median kernel seconds, as ``calibrate.fit`` takes operators.
    Empty where the file is not here."""
    from benchmarks.neusight import work_of_call  # (which imports this module)

    path = TRUTH / f"{gpu.name}-layout.json"
    if not available() or not path.exists():
        return []
    out = []
    for row in json.loads(path.read_text())["rows"]:
        if row["family"] in ("strided", "reduction") and row["kernel_us_median"]:
            func, args = _layout_call(row["case"], row["shape"], getattr(torch, row["dtype"]))
            out.append((gpu, [work_of_call(func, args)], row["kernel_us_median"] * 1e-6))
    return out


def _layout_call(case: str, shape: list[int], dtype: torch.dtype) -> tuple[Any, tuple[Any, ...]]:
    """The ATen op and meta arguments of a ``layout_probes.py`` case."""
    aten = torch.ops.aten

    def meta(*size: int) -> torch.Tensor:
        return torch.empty(*size, device="meta", dtype=dtype)

    n, c, *rest = shape
    if case in ("mul_same", "add_same_3d"):
        return (aten.mul.Tensor if case == "mul_same" else aten.add.Tensor), (meta(*shape), meta(*shape))
    if case == "mul_scale_nc11":
        return aten.mul.Tensor, (meta(*shape), meta(n, c, 1, 1))
    if case == "mul_scale_c11":
        return aten.mul.Tensor, (meta(*shape), meta(c, 1, 1))
    if case == "div_expanded":
        return aten.div.Scalar, (meta(n, c, 1, 1).expand(*shape), float(rest[0] * rest[1]))
    if case == "copy_nchw_to_nhwc":
        source = meta(*shape)
        return aten.copy_.default, (torch.empty_like(source, memory_format=torch.channels_last), source)
    if case in ("add_transposed_3d", "copy_transposed_3d"):
        transposed = meta(c, n, *rest).transpose(0, 1)
        return (aten.add.Tensor if case.startswith("add") else aten.copy_.default), (meta(*shape), transposed)
    reduced = {"sum_dim0": [0], "sum_dim1": [1], "sum_nchw": [0, 2, 3]}.get(case.rsplit("_keep", 1)[0])
    if reduced is not None:
        return aten.sum.dim_IntList, (meta(*shape), reduced)
    raise ValueError(f"unknown layout_probes.py case {case!r}")
