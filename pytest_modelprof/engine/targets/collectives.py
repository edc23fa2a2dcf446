"""Predicted time of a sharded step's collectives, as NCCL runs them.

NCCL runs each collective by the algorithm and protocol its tuning model predicts fastest for the message
(``src/graph/tuning.cc``); its prediction is a latency plus the bytes over a bus bandwidth, and so is ours:

- **algorithms**: a *ring* (every collective: ``2(n-1)`` steps for an all-reduce, ``n-1`` for an all-gather
  or a reduce-scatter, each step a hop to the next rank, over NVLink or PCIe within a node and over the
  network between nodes, NCCL's channels spreading the crossings over the NICs of the group's GPUs on a node,
  ``network`` each); a *tree* for an all-reduce across nodes (``log2`` of the nodes in hops over the
  network, up and down); *NVLS* for an all-reduce within a node whose NVSwitches reduce (NVLink SHARP:
  the H100, H200 and B200 SXM boards), at a bus bandwidth above the link's;
- **protocols**: *LL* (8-byte stores with a flag: the least latency, a quarter of the bandwidth, a third
  for an all-gather or reduce-scatter within a node), *LL128* (128-byte lines with a flag: 92% of the
  bandwidth, over NVLink), *Simple* (the full bandwidth, the most latency per hop);
- **latency**: a base per algorithm and protocol and a time per hop per link, NCCL's own figures;
- **bandwidth**: the bus bandwidth NCCL reaches (what ``nccl-tests`` reports as ``busbw``: a ring's bytes
  moved per rank, over time), anchored on published measurements: over H100 NVLink about 370 GB/s for
  an all-gather or reduce-scatter (of 450 GB/s per direction: :data:`RING_EFFICIENCY`), about 480 GB/s for
  an NVLS all-reduce (:data:`NVLS_SPEEDUP`); over a 400 Gb/s InfiniBand NDR NIC 46-49 GB/s
  (:data:`NETWORK_EFFICIENCY`).

A rank's collectives of one kind in one place are summed (:class:`~pytest_modelprof.results.Collective`):
each call is priced at their mean size. Not modelled: collectives overlapping each other or the kernels
(``overlapped_seconds`` bounds that), NCCL's channels and chunking beyond its tuning model, congestion.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from .gpus import GPUSpec

PROTOCOLS = ("LL", "LL128", "Simple")
# the latency of a collective before its hops, in microseconds, by algorithm and protocol (NCCL's tuning model)
BASE_LATENCY: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {
        "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
        "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
        "nvls": {"Simple": 0.0},
    }
)
# the latency of one hop, in microseconds, by link, algorithm and protocol (NCCL's tuning model)
HOP_LATENCY: Mapping[str, Mapping[str, Mapping[str, float]]] = MappingProxyType(
    {
        "nvlink": {
            "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
            "tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
            "nvls": {"Simple": 25.0},
        },
        "pcie": {"ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7}, "tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0}},
        "network": {"ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}, "tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0}},
    }
)
RING_EFFICIENCY = 370 / 450  # an H100 node's all-gather and reduce-scatter: ~370 GB/s of bus bandwidth over 450 GB/s NVLink
NVLS_SPEEDUP = 480 / 450  # its NVLS all-reduce: ~480 GB/s, the switches doing the reduction
NETWORK_EFFICIENCY = 47.5 / 50  # InfiniBand NDR 400 Gb/s: 46-49 GB/s per NIC
TREE_EFFICIENCY = 0.9  # a tree's bus bandwidth over a ring's (NCCL's tuning model)
NVLINK_SPEED = 100e9  # bytes/s per direction above which a GPU's interconnect is NVLink (PCIe 5 x16: 64 GB/s)


def _share(kind: str, protocol: str, nodes: int) -> float:
    """The share of the bandwidth a protocol carries as data."""
    if protocol == "LL":
        return 1 / 4 if nodes > 1 or kind == "all_reduce" else 1 / 3
    return 0.92 if protocol == "LL128" else 1.0


def _steps(kind: str, ranks: int) -> int:
    if kind == "all_reduce":
        return 2 * (ranks - 1)
    if kind in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return ranks - 1
    return 1  # a broadcast, reduce, send or receive: pipelined along the ring, one hop's latency


def call_seconds(gpu: GPUSpec, kind: str, bus_bytes: float, ranks: int, nodes: int) -> float | None:
    """The predicted seconds of one collective of ``kind`` moving ``bus_bytes`` per rank (NCCL's bus bytes)
    among ``ranks`` ranks on ``nodes`` nodes of ``gpu`` (see the module's notes); None where the spec has no
    bandwidth for a link it crosses."""
    if ranks <= 1:
        return 0.0
    intra = "nvlink" if gpu.interconnect > NVLINK_SPEED else "pcie"
    ring = gpu.interconnect * RING_EFFICIENCY
    if nodes > 1:  # the ring's channels cross between nodes through the NICs of the group's GPUs on each node
        per_node = min(max(1, ranks // nodes), gpu.node_gpus)
        ring = min(ring, gpu.network * per_node * NETWORK_EFFICIENCY)
    if ring <= 0:
        return None
    options = [("ring", protocol, ring) for protocol in PROTOCOLS if protocol != "LL128" or intra == "nvlink"]
    if kind == "all_reduce" and nodes > 1:
        options += [("tree", protocol, ring * TREE_EFFICIENCY) for protocol in PROTOCOLS if protocol != "LL128" or intra == "nvlink"]
    if kind == "all_reduce" and nodes == 1 and gpu.nvls:
        options.append(("nvls", "Simple", gpu.interconnect * NVLS_SPEEDUP))
    return min(
        _latency(intra, algorithm, protocol, kind, ranks, nodes) * 1e-6 + bus_bytes / (bandwidth * _share(kind, protocol, nodes))
        for algorithm, protocol, bandwidth in options
    )


def _latency(intra: str, algorithm: str, protocol: str, kind: str, ranks: int, nodes: int) -> float:
    """Microseconds a collective takes before its bytes: the base and its hops (``intra``: the link within a
    node, ``"nvlink"`` or ``"pcie"``)."""
    base = BASE_LATENCY[algorithm][protocol]
    if algorithm == "nvls":
        return base + HOP_LATENCY["nvlink"]["nvls"]["Simple"]
    hop_intra, hop_network = HOP_LATENCY[intra][algorithm][protocol], HOP_LATENCY["network"][algorithm][protocol]
    per_node = max(1, ranks // max(nodes, 1))
    if algorithm == "tree":
        return base + 2 * ((per_node - 1) * hop_intra + math.log2(max(nodes, 1)) * hop_network)
    steps = _steps(kind, ranks)
    crossings = min(steps, _steps(kind, nodes) if nodes > 1 else 0)
    return base + (steps - crossings) * hop_intra + crossings * hop_network


def collective_seconds(gpu: GPUSpec, kind: str, calls: int, bus_bytes: float, ranks: int, nodes: int) -> float | None:
    """Predicted seconds of ``calls`` collectives of ``kind`` moving ``bus_bytes`` per rank in all, each of
    the mean size (see :func:`call_seconds`)."""
    if calls <= 0:
        return 0.0
    one = call_seconds(gpu, kind, bus_bytes / calls, ranks, nodes)
    return None if one is None else calls * one
