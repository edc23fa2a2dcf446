"""A Llama-style 7B training step on target GPUs, profiled on this CPU-only machine.

AdamW, bf16 autocast, sequence 2048, batch 1 (examples/llama.py, built on the meta
device). For each target it prints the allocated peak, its breakdown, the reserved
estimate, whether it fits, and the seconds the analytic run took (goal: under 30 s
for the H100; it must not fit: 7B fp32 weights, gradients and AdamW state alone are
16 bytes per parameter, 108 GB).

    python benchmarks/llama7b_target.py [--targets h100,h200,a100-80gb]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from examples.llama import Llama, LlamaConfig  # noqa: E402
from pytest_modelprof import profile  # noqa: E402

SEQUENCE = 2048
GiB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="h100,h200")
    options = parser.parse_args()
    with torch.device("meta"):
        model = Llama(LlamaConfig.llama_7b())
    tokens = torch.randint(0, 32000, (1, SEQUENCE))
    print(
        f"Llama-style 7B ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters), AdamW, bf16 autocast, sequence {SEQUENCE}"
    )
    for target in options.targets.split(","):
        start = time.perf_counter()
        result = profile(model, tokens, train=True, autocast=torch.bfloat16, optimizer=torch.optim.AdamW(model.parameters()), target=target)
        seconds = time.perf_counter() - start
        memory = result.memory
        parts = ", ".join(f"{k} {v / GiB:.1f}" for k, v in memory.peak_breakdown.items() if v)
        print(
            f"  {target:<10} peak {memory.peak_bytes / GiB:6.1f} GiB in {memory.peak_phase} ({parts}); reserved "
            f"{memory.estimates['reserved_bytes'] / GiB:6.1f} GiB of {result.target_memory_bytes / GiB:.1f}; "
            f"fits: {result.fits}; {seconds:.1f} s"
        )


if __name__ == "__main__":
    main()
