"""Memory-bound kernels' times by their bytes against the L2 cache, and by where their input was before them.

For each op (an in-place ReLU, a residual ``add_``, an out-of-place ``add``, ReLU's backward, a copy, a sum, a
GELU), dtype (float32, bfloat16) and size (each tensor's bytes, from 1 MB to 512 MB), the op's kernel time as
the profiler reports it, median and least of ``REPEATS`` calls, in three settings:

- ``cold``: a 512 MB scratch buffer is written before each call, so that none of the op's tensors is in the L2;
- ``produced``: the op's first input is written (``fill_``) just before each call, as a step's previous kernel
  writes the tensor the next one reads;
- ``repeat``: the op is called back to back on the same tensors (the protocol of published per-kernel data).

    python l2_probes.py OUT.json [--quick]
"""

from __future__ import annotations

import json
import statistics
import sys

import torch
import torch.nn.functional as F

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REPEATS = 10
MB = 1 << 20
SIZES_MB = (1, 2, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 256, 512)
FLUSH_BYTES = 512 * MB


def _ops():
    """(name, aten op the profiler shows, number of tensors, the call on those tensors)."""
    return (
        ("relu_", "aten::relu_", 1, lambda x: x.relu_()),
        ("add_", "aten::add_", 2, lambda x, y: x.add_(y)),
        ("add", "aten::add", 2, lambda x, y: torch.add(x, y)),
        ("threshold_backward", "aten::threshold_backward", 2, lambda g, x: torch.ops.aten.threshold_backward(g, x, 0.0)),
        ("clone", "aten::copy_", 1, lambda x: x.clone()),
        ("sum", "aten::sum", 1, lambda x: x.sum()),
        ("gelu", "aten::gelu", 1, lambda x: F.gelu(x)),
    )


def _kernel_us(prof, aten_name):
    """Each call's kernel microseconds of the op named ``aten_name``, in call order."""
    calls = []
    for event in prof.events():
        launched = getattr(event, "kernels", None) or []
        if event.name == aten_name and launched:
            calls.append((event.time_range.start, sum(k.duration for k in launched)))
    return [us for _, us in sorted(calls)]


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def probe(sizes, repeats):
    """One profiled run per op and dtype: each size and setting in turn, a warm-up call then ``repeats`` calls."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    flush = torch.empty(FLUSH_BYTES // 4, device=DEVICE)
    rows = []
    for name, aten_name, count, call in _ops():
        for dtype in (torch.float32, torch.bfloat16):
            plan = []
            with profile(activities=activities) as prof:
                for size in sizes:
                    elements = size * MB // torch.empty((), dtype=dtype).element_size()
                    tensors = [torch.randn(elements, device=DEVICE, dtype=dtype) for _ in range(count)]
                    if name == "relu_":  # positive after the first call anyway: the same work each time
                        tensors[0].abs_()
                    for scenario in ("cold", "produced", "repeat"):
                        plan.append((size, scenario))
                        for _ in range(repeats + 1):  # the first: a warm-up, dropped
                            if scenario == "cold":
                                flush.fill_(1.0)
                            elif scenario == "produced":
                                tensors[0].fill_(0.5)
                            call(*tensors)
                    _sync()
                    del tensors
            times = _kernel_us(prof, aten_name)
            if name == "clone":  # clone's own copies (the warm-up's too); fills are not copies
                times = times[-len(plan) * (repeats + 1):]
            for i, (size, scenario) in enumerate(plan):
                mine = times[i * (repeats + 1) + 1 : (i + 1) * (repeats + 1)]
                rows.append({
                    "op": name, "dtype": str(dtype).removeprefix("torch."), "tensor_bytes": size * MB,
                    "tensors": count, "scenario": scenario, "calls": len(mine),
                    "kernel_us_median": round(statistics.median(mine), 3) if mine else None,
                    "kernel_us_min": round(min(mine), 3) if mine else None,
                })
                print(rows[-1], flush=True)
    return rows


def write(out, rows, repeats):
    """``rows`` into the JSON file ``out``, after the device's name, L2 and SMs, torch's version and ``repeats``."""
    props = torch.cuda.get_device_properties(0) if DEVICE == "cuda" else None
    result = {
        "device": props.name if props else "cpu",
        "l2_bytes": getattr(props, "L2_cache_size", None) if props else None,
        "sm_count": props.multi_processor_count if props else None,
        "torch": torch.__version__,
        "repeats": repeats,
        "rows": rows,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


def main():
    quick = "--quick" in sys.argv
    sizes = SIZES_MB[:3] if quick else SIZES_MB
    write(sys.argv[1], probe(sizes, 3 if quick else REPEATS), REPEATS)


if __name__ == "__main__":
    main()
