"""Elementwise kernels by the layout of their operands, and reductions by the dimensions they reduce.

Each case's input is written (``fill_``) just before each call, as a step's previous kernel writes what the next
reads; the kernel time is the profiler's, median and least of ``REPEATS`` calls. The cases:

- ``strided``: an elementwise op with every operand laid out as its output (the vector path) against the same op
  with one operand broadcast (a per-channel scale over NCHW, ``(N, C, 1, 1)`` and ``(C, 1, 1)``), transposed (a
  3-d activation permuted as attention's heads are), or expanded with stride 0 (a mean's gradient), and copies
  into another layout (``contiguous()`` of a transpose); float32, float16 and bfloat16, 1 to 64 M elements;
- ``reduction``: ``sum`` over the rows of an ``(R, C)`` matrix (dim 0, keeping C columns: a bias's gradient),
  over its columns (dim 1, keeping R rows), and of NCHW over ``(0, 2, 3)`` (a per-channel scale's gradient),
  for kept sizes from 96 to 3072 and 1 to 64 M elements; float32 and bfloat16.

    python layout_probes.py OUT.json [--quick]
"""

from __future__ import annotations

import statistics
import sys

import torch

sys.path.insert(0, __file__.rpartition("/")[0] or ".")
from l2_probes import DEVICE, _sync, write  # noqa: E402
REPEATS = 10
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _kernel_us(prof, names):
    """Each call's kernel microseconds, in call order, of the ops named in ``names`` (innermost with kernels)."""
    calls = []
    for event in prof.events():
        launched = getattr(event, "kernels", None) or []
        if event.name in names and launched:
            calls.append((event.time_range.start, sum(k.duration for k in launched), [k.name[:120] for k in launched]))
    calls.sort(key=lambda c: c[0])
    return calls


def _t(*shape, dtype):
    return torch.randn(*shape, device=DEVICE, dtype=dtype)


def strided_cases(elements):
    """(name, aten op names, tensors to write before each call, the call) for ``elements`` output elements."""
    n, c = 32, 96
    hw = max(elements // (n * c), 1)
    h = w = max(int(round(hw**0.5)), 1)
    tokens = max(elements // (8 * 768), 1)
    for dtype in DTYPES:
        x = _t(n, c, h, w, dtype=dtype)
        same = _t(n, c, h, w, dtype=dtype)
        scale_nc = _t(n, c, 1, 1, dtype=dtype)
        scale_c = _t(c, 1, 1, dtype=dtype)
        a = _t(8, tokens, 768, dtype=dtype)
        b = _t(tokens, 8, 768, dtype=dtype).transpose(0, 1)  # (8, tokens, 768), laid out as (tokens, 8, 768)
        g = _t(n, c, 1, 1, dtype=dtype)
        meta = {"dtype": str(dtype).removeprefix("torch."), "shape": [n, c, h, w]}
        yield ("mul_same", {"aten::mul"}, [x], lambda x=x, y=same: x * y, meta)
        yield ("mul_scale_nc11", {"aten::mul"}, [x], lambda x=x, y=scale_nc: x * y, meta)
        yield ("mul_scale_c11", {"aten::mul"}, [x], lambda x=x, y=scale_c: x * y, meta)
        yield ("div_expanded", {"aten::div"}, [g], lambda g=g, s=(n, c, h, w): g.expand(s) / float(h * w), meta)
        yield ("copy_nchw_to_nhwc", {"aten::copy_"}, [x], lambda x=x: x.contiguous(memory_format=torch.channels_last), meta)
        meta_t = {"dtype": meta["dtype"], "shape": [8, tokens, 768]}
        yield ("add_same_3d", {"aten::add"}, [a], lambda a=a, y=a.clone(): a + y, meta_t)
        yield ("add_transposed_3d", {"aten::add"}, [a], lambda a=a, b=b: a + b, meta_t)
        yield ("copy_transposed_3d", {"aten::copy_"}, [a], lambda b=b: b.contiguous(), meta_t)


def reduction_cases(elements):
    for dtype in (torch.float32, torch.bfloat16):
        for kept in (96, 192, 384, 768, 1536, 3072):
            rows = max(elements // kept, 1)
            m = _t(rows, kept, dtype=dtype)
            meta = {"dtype": str(dtype).removeprefix("torch."), "shape": [rows, kept], "kept": kept}
            yield (f"sum_dim0_keep{kept}", {"aten::sum"}, [m], lambda m=m: m.sum(0), meta)
            t = _t(kept, rows, dtype=dtype)
            yield (f"sum_dim1_keep{kept}", {"aten::sum"}, [t], lambda t=t: t.sum(1), {**meta, "shape": [kept, rows]})
            n = 32
            hw = max(elements // (n * kept), 1)
            x = _t(n, kept, hw, 1, dtype=dtype)
            yield (f"sum_nchw_keep{kept}", {"aten::sum"}, [x], lambda x=x: x.sum((0, 2, 3)), {**meta, "shape": [n, kept, hw, 1]})


def probe(sizes, repeats):
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    rows = []
    for family, cases in (("strided", strided_cases), ("reduction", reduction_cases)):
        for elements in sizes:
            plan = []
            made = list(cases(elements))  # the tensors, before the profiler starts
            with profile(activities=activities) as prof:
                for name, ops, written, call, meta in made:
                    plan.append((name, ops, meta))
                    for _ in range(repeats + 1):  # the first: a warm-up, dropped
                        for t in written:
                            t.fill_(0.5)
                        call()
                    _sync()
            del made
            names = set().union(*(ops for _, ops, _ in plan))
            calls = _kernel_us(prof, names)
            # the fills are aten::fill_, never one of the probed names; each case has repeats + 1 calls, in order
            for i, (name, ops, meta) in enumerate(plan):
                mine = calls[i * (repeats + 1) + 1 : (i + 1) * (repeats + 1)]
                times = [us for _, us, _ in mine]
                rows.append({
                    "family": family, "case": name, "elements": elements, **meta, "calls": len(times),
                    "kernel_us_median": round(statistics.median(times), 3) if times else None,
                    "kernel_us_min": round(min(times), 3) if times else None,
                    "kernels": mine[0][2] if mine else [],
                })
                print(rows[-1]["case"], rows[-1]["dtype"], elements, rows[-1]["kernel_us_median"], flush=True)
    return rows


def main():
    quick = "--quick" in sys.argv
    sizes = (1 << 20, 1 << 22) if quick else (1 << 20, 1 << 22, 1 << 23, 1 << 24, 1 << 25, 1 << 26)
    write(sys.argv[1], probe(sizes, 3 if quick else REPEATS), REPEATS)


if __name__ == "__main__":
    main()
