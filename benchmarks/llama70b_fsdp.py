"""Rank 0 of a Llama-style 70B training step under FSDP2 over 64 ranks, on this CPU-only machine.

AdamW, bf16 mixed precision (FSDP2's MixedPrecisionPolicy: bf16 parameters in compute, fp32
gradient reduction), sequence 4096, batch 1 per rank; every decoder layer and the root under
``fully_shard`` (examples/llama.py, built on the meta device, sharded there, profiled
analytically). Prints the time and peak RSS of the run with their goals (issue 40,
benchmarks/goals.py: at most 15 s and under 1 GB, for ``--target h100`` at the default 80
layers and 64 ranks) and whether they are met; the rank's memory by category beside the
closed forms (parameters, gradients, AdamW state: 1/64 of the model's fp32 bytes, up to
FSDP's padding) and the collectives' volume per step beside theirs (bf16 all-gathers of
every parameter in forward and, but for the root's own, again in backward; fp32
reduce-scatters of every gradient).

    python benchmarks/llama70b_fsdp.py --target h100 [--layers 80] [--world-size 64]

Where the time goes, by part: benchmarks/profiler_cost.py (its llama70b-fsdp64-h100 workload).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.goals import LLAMA70B_FSDP_RSS_GB, LLAMA70B_FSDP_SECONDS, met  # noqa: E402
from benchmarks.rss import run_with_peak_rss  # noqa: E402

RUN = """
import dataclasses, sys, time, torch
sys.path.insert(0, {root!r})
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from examples.llama import Llama, LlamaConfig
from pytest_modelprof import profile

config = dataclasses.replace(LlamaConfig.llama_70b(), layers={layers})
with torch.device("meta"):
    model = Llama(config)
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

def shard(model, mesh):
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)

start = time.perf_counter()
result = profile(model, torch.randint(0, config.vocab_size, (1, 4096)), train=True, optimizer=torch.optim.AdamW(model.parameters()),
                 world_size={world}, parallelize=shard, device="meta", target={target!r})
seconds = time.perf_counter() - start
P = sum(p.numel() for p in model.parameters())
root = P - sum(p.numel() for p in model.layers.parameters())  # the root's own: embedding, final norm, head
m = result.memory
print("params", P)
print("root", root)
print("seconds", seconds)
print("peak", m.peak_bytes, m.peak_phase)
for key, value in m.peak_breakdown.items():
    print("peak_" + key, value)
for key, value in m.category_max.items():
    print("max_" + key, value)
print("grads", sum(g for _, _, g in m.parameters))
for kind, phase in (("all_gather", "forward"), ("all_gather", "backward"), ("reduce_scatter", "backward")):
    rows = [c for c in result.collectives if c.kind == kind and c.phase == phase]
    print(kind + "_" + phase, sum(c.calls for c in rows), sum(c.bytes for c in rows), sum(c.bus_bytes for c in rows))
print("forward_flops", result.forward_flops, "flops", result.flops)
if result.predicted is not None:
    pr = result.predicted
    print("predicted", pr.seconds, pr.comm_seconds, pr.overlapped_seconds, result.fits)
"""

GB = 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=80)
    parser.add_argument("--world-size", type=int, default=64)
    parser.add_argument(
        "--target", default=None, help="a GPU (h100, ...): the rank's memory in its allocator's blocks and its predicted step time"
    )
    options = parser.parse_args()
    world = options.world_size
    code = RUN.format(root=str(ROOT), layers=options.layers, world=world, target=options.target)
    printed, rss = run_with_peak_rss(code)
    figures = {line.split()[0]: line.split()[1:] for line in printed.splitlines()}
    P = int(figures["params"][0])
    print(f"Llama-style 70B shape, {options.layers} layers ({P / 1e9:.2f} B parameters), FSDP2 over {world} ranks, rank 0")
    seconds = float(figures["seconds"][0])
    as_set = options.layers == 80 and world == 64 and options.target == "h100"
    where = "" if as_set else "; the goals are set for --target h100, 80 layers, 64 ranks: this run differs"
    print(
        f"  analytic run: {seconds:.1f} s (goal <= {LLAMA70B_FSDP_SECONDS:g} s: {met(seconds <= LLAMA70B_FSDP_SECONDS)}), "
        f"peak RSS {rss:.2f} GB (goal < {LLAMA70B_FSDP_RSS_GB:g} GB: {met(rss < LLAMA70B_FSDP_RSS_GB)}){where}"
    )
    peak = int(figures["peak"][0])
    print(f"  peak {peak / GB:.2f} GB in {figures['peak'][1]}:")
    for key in ("parameters", "unsharded_parameters", "gradients", "activations", "temporaries", "optimizer_state", "inputs"):
        print(f"    {key:<22} at the peak {int(figures['peak_' + key][0]) / GB:8.3f} GB, most {int(figures['max_' + key][0]) / GB:8.3f} GB")
    shard = 4 * P / world
    print(
        f"  closed forms (fp32, 1/{world}, before padding): parameters {shard / GB:.3f} GB, gradients {shard / GB:.3f} GB, "
        f"AdamW state {2 * shard / GB:.3f} GB; measured gradients {int(figures['grads'][0]) / GB:.3f} GB"
    )
    root = int(figures["root"][0])
    # bf16 all-gathers of every parameter in forward, and in backward of those resharded after forward (not the
    # root's own, which FSDP2 keeps unsharded from its forward to its backward); fp32 reduce-scatters of every gradient
    closed = {"all_gather_forward": 2 * P, "all_gather_backward": 2 * (P - root), "reduce_scatter_backward": 4 * P}
    for key, expected in closed.items():
        calls, payload, bus = figures[key]
        print(
            f"  {key:<24} {int(calls):4d} calls, {int(payload) / GB:8.3f} GB (closed form {expected / GB:8.3f} GB), "
            f"ring {float(bus) / GB:8.3f} GB"
        )
    if "predicted" in figures:
        seconds, comm, overlapped, fits = figures["predicted"]
        print(
            f"  on {options.target}: predicted step {float(seconds):.2f} s with the collectives after the kernels, "
            f"{float(overlapped):.2f} s with them all hidden (collectives {float(comm):.2f} s); fits: {fits}"
        )


if __name__ == "__main__":
    main()
