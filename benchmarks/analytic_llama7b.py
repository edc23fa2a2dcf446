"""Analytic FLOP profiling of a Llama-style 7B training step's forward and backward.

The model (examples/llama.py: hidden 4096, 32 layers, sequence 2048) lives on the
meta device; FLOPs only (``memory=False``). In one process, interleaved, this times ``profile(..., device="meta",
train=True)`` against torch's ``FlopCounterMode`` over the same fake-tensor forward
and backward, and prints the ratio and the peak RSS, each with its goal (issue 40, see
benchmarks/goals.py: at most 0.7x ``FlopCounterMode``'s time; under 1 GB) and whether it is met. Peak RSS is read in a
fresh process running only our profile. Where the time goes, by part: benchmarks/profiler_cost.py.

    python benchmarks/analytic_llama7b.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.goals import LLAMA7B_RSS_GB, LLAMA7B_VS_FLOP_COUNTER, met  # noqa: E402
from benchmarks.rss import peak_rss_gb  # noqa: E402
from examples.llama import Llama, LlamaConfig  # noqa: E402
from pytest_modelprof import profile  # noqa: E402

SEQUENCE = 2048


def build() -> Llama:
    with torch.device("meta"):
        return Llama(LlamaConfig.llama_7b())


def ours(model: Llama, tokens: torch.Tensor) -> int:
    return profile(model, tokens, device="meta", train=True, memory=False).flops


def torch_counter(model: Llama, tokens: torch.Tensor) -> int:
    fake = FakeTensorMode()
    convert = fake.fake_tensor_converter.from_meta_and_device
    state = {n: convert(fake, t.detach(), torch.device("cpu")).requires_grad_(t.requires_grad) for n, t in model.named_parameters()}
    state.update({n: convert(fake, t, torch.device("cpu")) for n, t in model.named_buffers()})
    fake_tokens = fake.from_tensor(tokens)
    with fake, FlopCounterMode(display=False) as counter:
        torch.func.functional_call(model, state, (fake_tokens,)).sum().backward()
    return counter.get_total_flops()


def peak_rss_only_ours() -> float:
    return peak_rss_gb(
        f"import sys, torch; sys.path.insert(0, {str(ROOT)!r})\n"
        "from benchmarks.analytic_llama7b import build, ours, SEQUENCE\n"
        "ours(build(), torch.randint(0, 32000, (1, SEQUENCE)))\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    model = build()
    tokens = torch.randint(0, 32000, (1, SEQUENCE))
    ours(model, tokens)  # warm-up: first calls import and cache kernels
    torch_counter(model, tokens)
    best = {"ours": float("inf"), "torch": float("inf")}
    for _ in range(options.repeats):
        for name, fn in (("ours", ours), ("torch", torch_counter)):
            start = time.perf_counter()
            fn(model, tokens)
            best[name] = min(best[name], time.perf_counter() - start)
    print(f"Llama-style 7B, sequence {SEQUENCE}, forward + backward on fake tensors; best of {options.repeats}")
    print(f"  profile(device='meta'):   {best['ours']:.2f} s")
    print(f"  torch FlopCounterMode:    {best['torch']:.2f} s")
    ratio = best["ours"] / best["torch"]
    print(f"  ratio ours/torch:         {ratio:.2f}x (goal <= {LLAMA7B_VS_FLOP_COUNTER}x: {met(ratio <= LLAMA7B_VS_FLOP_COUNTER)})")
    rss = peak_rss_only_ours()
    print(f"  peak RSS (our run alone): {rss:.2f} GB (goal < {LLAMA7B_RSS_GB:g} GB: {met(rss < LLAMA7B_RSS_GB)})")
    print(f"  this process's peak RSS:  {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
