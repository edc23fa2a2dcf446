"""The predicted collectives against the published bus bandwidths (what nccl-tests reports as busbw).

For each GPU and layout, the predicted time of one collective by message size, as bus bandwidth (bus bytes
over time) and the algorithm's latency at small sizes. The anchors the model is built on: an H100 node's
NVLink ~370 GB/s for all-gather and reduce-scatter, ~480 GB/s for its NVLS all-reduce; 46-49 GB/s per
InfiniBand NDR 400 Gb/s NIC.

    python benchmarks/collectives.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pytest_modelprof import GPUS  # noqa: E402
from pytest_modelprof.engine.targets.collectives import call_seconds  # noqa: E402

LAYOUTS = (  # gpu, collective, ranks, nodes
    ("h100", "all_gather", 8, 1),
    ("h100", "all_reduce", 8, 1),
    ("h100", "all_reduce", 16, 2),
    ("h100", "reduce_scatter", 512, 64),
    ("h100", "all_reduce", 2, 2),
    ("a100-80gb", "all_reduce", 8, 1),
    ("l4", "all_gather", 8, 1),
)
SIZES = [2**p for p in range(10, 34, 3)]  # 1 KiB to 8 GiB of bus bytes


def main() -> None:
    print(f"{'gpu':10s} {'collective':15s} {'ranks':>5s} {'nodes':>5s}  " + " ".join(f"{size / 2**20:>9.3g}M" for size in SIZES))
    for name, kind, ranks, nodes in LAYOUTS:
        gpu = GPUS[name]
        cells = []
        for size in SIZES:
            seconds = call_seconds(gpu, kind, size, ranks, nodes)
            cells.append(f"{size / seconds / 1e9:>9.1f}G" if seconds else f"{'-':>10s}")
        latency = call_seconds(gpu, kind, 0.0, ranks, nodes)
        print(f"{name:10s} {kind:15s} {ranks:>5d} {nodes:>5d}  " + " ".join(cells) + f"   latency {latency * 1e6:.1f} us")
    print("\nbus bandwidth in GB/s by bus bytes per rank; the last column is the time of an empty call")


if __name__ == "__main__":
    main()
