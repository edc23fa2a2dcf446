"""The benchmarks' goals, as issue 40 sets them, and how a script says whether one is met.

Each script prints its figures beside these goals; the goals are issue 40's, not looser ones.
Ratios are measured within one run (the two sides interleaved), so that a shared machine's
load weighs on both.
"""

from __future__ import annotations

# benchmarks/analytic_llama7b.py: Llama-style 7B forward + backward on fake tensors, FLOPs only
LLAMA7B_VS_FLOP_COUNTER = 0.7  # at most this times FlopCounterMode's time on the same fake step
LLAMA7B_RSS_GB = 1.0  # peak RSS of a process running only the profile: under this
# benchmarks/memory_tracking.py
LLAMA7B_ADAMW_VS_UNTRACKED = 1.5  # with memory and an AdamW step: at most this times the untracked fake step
LLAMA7B_ADAMW_VS_MEM_TRACKER = 10.0  # and at least this many times faster than torch's MemTracker
LLAMA7B_ADAMW_RSS_GB = 1.5  # peak RSS of a process running only the profile: under this
RESNET50_TRAIN_VS_PLAIN = 1.3  # a real CPU training step, FLOPs and memory: at most this times the plain step
# benchmarks/flops_overhead.py: a real CPU forward, FLOPs only
FORWARD_FLOPS_VS_PLAIN = 1.15  # at most this times the plain forward
# benchmarks/llama70b_fsdp.py --target h100: rank 0 of 64 of a Llama-style 70B FSDP2 step, 80 layers
LLAMA70B_FSDP_SECONDS = 15.0  # at most
LLAMA70B_FSDP_RSS_GB = 1.0  # under


def met(ok: bool) -> str:
    """How a script prints whether a goal is met."""
    return "met" if ok else "NOT met"
