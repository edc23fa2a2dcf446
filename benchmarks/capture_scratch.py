"""On a machine with a CUDA GPU: what each op of a ../shared/gpu-truth workload's steady step
allocates inside its kernels, beside what the engine models (``engine/targets/scratch.py``).

For every ATen op of the second step (set up and run as ``capture.py`` runs it, each workload
in a fresh process): its name and inputs (shapes, strides, dtypes), the allocated bytes
before and after it, and the most allocated while it ran (peak statistics reset before each
op). ``scratch = peak - max(before, after)`` is what the op took and gave back inside the
call: cuDNN's convolution and RNN workspaces, a reduction's staging buffer. ``modelled`` is
the engine's figure for the same call. For the reserved-memory model: the caching
allocator's segments at the end of the step, and its trace of every allocation, free and
segment from the model's set-up on (``torch.cuda.memory._record_memory_history``).

    python benchmarks/capture_scratch.py OUT.json [WORKLOAD,...]

prints, per workload, the ops whose scratch the engine misses or overstates by more than 1 MiB.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gpu_truth
from pytest_modelprof.engine.targets.calibrate import training_step
from pytest_modelprof.engine.targets.scratch import reduction_scratch

MiB = 1 << 20


def _described(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "stride": list(value.stride()), "dtype": str(value.dtype).removeprefix("torch.")}
    return None


class PerOp(TorchDispatchMode):
    """Allocated bytes before, after and at most during each op; the engine's scratch beside them."""

    def __init__(self) -> None:
        super().__init__()
        properties = torch.cuda.get_device_properties(0)
        self.gpu = (properties.multi_processor_count, (properties.major, properties.minor))
        self.rows: list[dict[str, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = func(*args, **kwargs)
        peak, after = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
        name = f"aten.{func.overloadpacket.__name__}"
        modelled = sum(reduction_scratch(name, func, args, kwargs, out, *self.gpu))
        self.rows.append(
            {
                "op": str(func),
                "inputs": [_described(a) for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)],
                "before": before,
                "after": after,
                "peak": peak,
                "scratch": peak - max(before, after),
                "modelled": modelled,
            }
        )
        return out


def run_one(name: str) -> dict[str, Any]:
    module = gpu_truth.capture()
    build, make_x, train, dtype, autocast, opt_name = module.SHARED[name]
    torch.manual_seed(0)
    # every allocation and free from here on, the set-up included (no stack traces: cheap)
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python")
    model = build().to("cuda")
    if dtype is not None:
        model = model.to(dtype)
    x = make_x("cuda", dtype or torch.float32)
    step = training_step(model, x, train, gpu_truth.OPTIMIZERS[opt_name](model.parameters()), autocast, module.loss_of, "cuda")
    step()  # the first step: optimizer state, workspaces, cuDNN plans
    torch.cuda.synchronize()
    recorder = PerOp()
    with recorder:
        step()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    segments = [{"size": s["total_size"], "pool": s["segment_type"]} for s in snapshot["segments"]]
    # the caching allocator's own trace, for its model (targets/allocator.py): alloc, free_completed,
    # segment_alloc, segment_free, ... with address and size, from the set-up to the steady step's end
    trace = [[e["action"], e["addr"], e["size"]] for e in snapshot["device_traces"][0]]
    return {
        "name": name,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "ops": recorder.rows,
        "segments": segments,
        "trace": trace,
    }


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "one":
        print(json.dumps(run_one(sys.argv[2])))
        return
    if not torch.cuda.is_available():
        raise SystemExit("capture_scratch.py measures a real GPU: no CUDA device here")
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-scratch.json")
    names = sorted(gpu_truth.records())
    if len(sys.argv) > 2:
        names = [n for n in names if n in sys.argv[2].split(",")]
    rows = []
    for name in names:
        done = subprocess.run([sys.executable, __file__, "one", name], capture_output=True, text=True, timeout=600)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            rows.append({"name": name, "error": done.stderr[-2000:]})
            print(name, "failed:", done.stderr[-300:], flush=True)
            continue
        row = json.loads(lines[-1])
        rows.append(row)
        off = [op for op in row["ops"] if abs(op["scratch"] - op["modelled"]) > MiB]
        print(f"{name}: {len(row['ops'])} ops, {len(off)} whose scratch the model is more than 1 MiB off", flush=True)
        for op in sorted(off, key=lambda op: -abs(op["scratch"] - op["modelled"]))[:8]:
            shapes = [i["shape"] for i in op["inputs"] if i][:3]
            print(f"    {op['op']} {shapes}: measured {op['scratch'] / MiB:.1f} MiB, modelled {op['modelled'] / MiB:.1f} MiB")
    out.write_text(json.dumps(rows, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
