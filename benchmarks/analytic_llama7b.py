"""Analytic FLOP profiling of a Llama-style 7B training step's forward and backward.

The model (examples/llama.py: hidden 4096, 32 layers, sequence 2048) lives on the
meta device; FLOPs only (``memory=False``). In one process, interleaved, this times ``profile(..., device="meta",
train=True)`` against torch's ``FlopCounterMode`` over the same fake-tensor forward
and backward, and prints the ratio (goal: at most 1.5x) and the peak RSS (goal:
under 1 GB). Peak RSS is read in a fresh process running only our profile.

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
    print(f"  ratio ours/torch:         {best['ours'] / best['torch']:.2f}x (goal <= 1.5x)")
    print(f"  peak RSS (our run alone): {peak_rss_only_ours():.2f} GB (goal < 1 GB)")
    print(f"  this process's peak RSS:  {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
