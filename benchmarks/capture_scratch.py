"""On a machine with a CUDA GPU: what each op of a gpu-truth workload (pytest_modelprof/data/gpu-truth)'s steady step
allocates inside its kernels, beside what the engine models (``engine/targets/scratch/``).

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
Beside the gpu-truth workloads, ``PROBES``: small steps that each exercise one kind of kernel
scratch over several shapes (cuDNN's RNN workspace by hidden size, sequence, batch, layers and
cell; cuDNN convolution workspaces; memory-efficient and cuDNN attention; embedding and layer-norm
backward passes), so that one GPU session measures what the engine's models need.
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
from pytest_modelprof.engine.probes import training_step
from pytest_modelprof.engine.targets.scratch import kernel_scratch

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
        modelled = sum(kernel_scratch(name, func, args, kwargs, out, *self.gpu))
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


class _Recurrent(torch.nn.Module):
    def __init__(self, cell: str, inputs: int, hidden: int, layers: int, bidirectional: bool) -> None:
        super().__init__()
        self.rnn = getattr(torch.nn, cell)(inputs, hidden, layers, batch_first=True, bidirectional=bidirectional)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.rnn(x)[0]
        return out


class _Attention(torch.nn.Module):
    def __init__(self, width: int, heads: int, masked: bool) -> None:
        super().__init__()
        self.qkv, self.heads, self.masked = torch.nn.Linear(width, 3 * width, bias=False), heads, masked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril() if self.masked else None
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(b, t, c)


def _spec(build: Any, shape: tuple[int, ...], autocast: torch.dtype | None = None, optimizer: str = "adamw") -> tuple[Any, ...]:
    """capture.py's spec of a training step on a random fp32 input of ``shape``."""
    return (build, lambda dev, dt: torch.randn(*shape, device=dev), True, None, autocast, optimizer)


def _recurrent(cell: str, hidden: int, layers: int, sequence: int, batch: int, bidirectional: bool = False) -> tuple[Any, ...]:
    return _spec(lambda: _Recurrent(cell, 512, hidden, layers, bidirectional), (batch, sequence, 512), optimizer="adam")


def _convolutions() -> torch.nn.Module:
    return torch.nn.Sequential(
        *(torch.nn.Conv2d(c, d, k, padding=k // 2) for c, d, k in [(3, 64, 7), (64, 64, 3), (64, 128, 1), (128, 128, 3)])
    )


# name: capture.py's spec (builder, inputs, train, model dtype, autocast dtype, optimizer)
PROBES: dict[str, tuple[Any, ...]] = {
    **{
        f"probe-{cell.lower()}{layers}x{hidden}-s{sequence}-b{batch}{'-bi' if bi else ''}": _recurrent(
            cell, hidden, layers, sequence, batch, bi
        )
        for cell, hidden, layers, sequence, batch, bi in [
            ("LSTM", 1024, 2, 256, 32, False),  # the gpu-truth LSTM's shapes, alone
            ("LSTM", 1024, 1, 256, 32, False),
            ("LSTM", 1024, 3, 256, 32, False),
            ("LSTM", 1024, 2, 128, 32, False),
            ("LSTM", 1024, 2, 256, 16, False),
            ("LSTM", 512, 2, 256, 32, False),
            ("LSTM", 256, 2, 256, 32, False),
            ("LSTM", 1024, 2, 256, 32, True),
            ("GRU", 1024, 2, 256, 32, False),
            ("RNN", 1024, 2, 256, 32, False),
        ]
    },
    "probe-conv-b64-fp32-sgdm": _spec(_convolutions, (64, 3, 56, 56), optimizer="sgdm"),
    "probe-attention-fp32": _spec(lambda: _Attention(512, 8, False), (4, 1000, 512)),
    "probe-attention-masked-autocast_bf16": _spec(lambda: _Attention(512, 8, True), (4, 1000, 512), torch.bfloat16),
    "probe-attention-head128-fp32": _spec(lambda: _Attention(1024, 8, False), (2, 777, 1024)),
    # bf16 without a mask: cuDNN attention on an H100 (its backward's plan workspace, beyond the frontend's)
    "probe-attention-autocast_bf16": _spec(lambda: _Attention(512, 8, False), (4, 1000, 512), torch.bfloat16),
    "probe-attention-head128-autocast_bf16": _spec(lambda: _Attention(1024, 8, False), (2, 777, 1024), torch.bfloat16),
    "probe-embedding-8192": (
        lambda: torch.nn.Embedding(50000, 768),
        lambda dev, dt: torch.randint(0, 50000, (16, 512), device=dev),
        True,
        None,
        None,
        "adamw",
    ),
    "probe-layernorm-70000x512": _spec(lambda: torch.nn.LayerNorm(512), (70000, 512)),
}


def run_one(name: str) -> dict[str, Any]:
    module = gpu_truth.capture()
    build, make_x, train, dtype, autocast, opt_name = {**module.WORKLOADS, **PROBES}[name]
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
    names = sorted(gpu_truth.records()) + list(PROBES)
    if len(sys.argv) > 2:  # any workload of capture.py (the held-out ones too) or probe of this file, by name
        names = [n for n in [*gpu_truth.capture().WORKLOADS, *PROBES] if n in sys.argv[2].split(",")]
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
        out.write_text(json.dumps(rows, indent=1))  # after each workload: a run cut short keeps what it measured
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
