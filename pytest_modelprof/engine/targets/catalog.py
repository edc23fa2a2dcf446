"""The GPUs a profile can target by name (``target="h100"``): :data:`GPUS`, each figure with its source;
and calibration files (:func:`save_calibration`, ``target="file.json"``).

Every figure is the vendor's datasheet figure (see :class:`~.gpus.GPUSpec` for what each means), or,
where the datasheet gives none, the source named beside it. Peak FLOP/s are dense (the datasheets quote
fp8, int8 and often fp16 and tf32 with 2:4 structured sparsity: these are half that), at the boost clock.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..._files import replace_atomically
from .gpus import Calibration, GPUSpec

MiB = 1 << 20
MB = 1 << 20  # caches: the datasheets' MB are MiB
T = 1e12
G = 1e9
MHZ = 1e6

# peak FLOP/s per dtype (TFLOP/s; int8 in TOPS), dense. "float8" is e4m3 and e5m2 alike, accumulated in float32
# (as cuBLASLt's fp8 products are); a GPU without fp8 tensor cores has no "float8" entry, one without bf16 tensor
# cores (Volta, Turing) no "bfloat16", one without TF32 (before Ampere) no "tf32" (see :func:`.cost.math_peak` for
# what such products are priced at)
# H100 SXM5 (NVIDIA H100 Tensor Core GPU datasheet: fp8 3958, int8 3958 sparse; the H200 datasheet gives the same)
_HOPPER = {"float64": 67, "float32": 67, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4, "float8": 1978.9, "int8": 1978.9}
# A100 SXM4 and PCIe alike (NVIDIA A100 Tensor Core GPU datasheet: int8 624 dense, 1248 sparse)
_AMPERE = {"float64": 19.5, "float32": 19.5, "tf32": 156, "bfloat16": 312, "float16": 312, "int8": 624}


def _teraflops(figures: Mapping[str, float]) -> dict[str, float]:
    return {dtype: flops * T for dtype, flops in figures.items()}


# bytes/s per direction of one 100 Gb/s NIC shared by a node's eight GPUs: the network of a node of PCIe cards
_SHARED_NIC = 100 / 8 / 8 * G
_PCIE3, _PCIE4, _PCIE5 = 16 * G, 32 * G, 64 * G  # x16, per direction (rounded): the interconnect of cards without NVLink

GPUS: Mapping[str, GPUSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            GPUSpec(  # H100 SXM5 80GB, NVLink 4 (900 GB/s both ways), one NDR 400 Gb/s NIC per GPU (DGX H100)
                name="h100",
                memory_bytes=81559 * MiB,
                bandwidth=3.35e12,
                peak_flops=_teraflops(_HOPPER),
                sm_count=132,
                compute_capability=(9, 0),
                interconnect=450 * G,
                network=400 / 8 * G,
                l2_bytes=50 * MB,  # NVIDIA H100 Tensor Core GPU Architecture whitepaper
                boost_clock=1980 * MHZ,  # whitepaper: H100 SXM5 max boost for its peaks
                power=700,
                nvls=True,  # NVSwitch with NVLink SHARP
            ),
            GPUSpec(  # H100 PCIe 80GB (datasheet: fp8 3026, int8 3026 sparse; 350 W)
                name="h100-pcie",
                memory_bytes=81559 * MiB,
                bandwidth=2.0e12,
                peak_flops=_teraflops(
                    {"float64": 51.2, "float32": 51.2, "tf32": 378, "bfloat16": 756, "float16": 756, "float8": 1513, "int8": 1513}
                ),
                sm_count=114,
                compute_capability=(9, 0),
                interconnect=_PCIE5,
                network=_SHARED_NIC,
                l2_bytes=50 * MB,
                boost_clock=1755 * MHZ,  # whitepaper: H100 PCIe max boost
                power=350,
            ),
            GPUSpec(  # H200 SXM 141GB (datasheet: 4.8 TB/s, the H100's math; 700 W)
                name="h200",
                memory_bytes=143771 * MiB,
                bandwidth=4.8e12,
                peak_flops=_teraflops(_HOPPER),
                sm_count=132,
                compute_capability=(9, 0),
                interconnect=450 * G,
                network=400 / 8 * G,
                l2_bytes=60 * MB,  # what CUDA reports on an H200 SXM (l2CacheSize 62914560, data/gpu-truth/h200-l2.json)
                boost_clock=1980 * MHZ,
                power=700,
                nvls=True,  # NVSwitch with NVLink SHARP
            ),
            GPUSpec(  # B200 (HGX B200 datasheet, per GPU of eight: fp16/bf16 36, fp8 72, int8 72, tf32 18 PFLOPS sparse and
                # fp32 600, fp64 296 TFLOPS for eight; 8 TB/s HBM3e; NVLink 5 1.8 TB/s both ways; 1000 W), ConnectX-7 400 Gb/s
                name="b200",
                memory_bytes=183359 * MiB,
                bandwidth=8.0e12,
                peak_flops=_teraflops(
                    {"float64": 37, "float32": 75, "tf32": 1125, "bfloat16": 2250, "float16": 2250, "float8": 4500, "int8": 4500}
                ),
                sm_count=148,
                compute_capability=(10, 0),
                interconnect=900 * G,
                network=400 / 8 * G,
                l2_bytes=126 * MB,  # NVIDIA Blackwell architecture technical brief: 126 MB over the two dies
                boost_clock=1965 * MHZ,
                power=1000,
                nvls=True,  # NVSwitch with NVLink SHARP
            ),
            GPUSpec(  # A100 SXM4 80GB, NVLink 3 (600 GB/s both ways), HDR 200 Gb/s per GPU (DGX A100); 400 W
                name="a100-80gb",
                memory_bytes=81920 * MiB,
                bandwidth=2.039e12,
                peak_flops=_teraflops(_AMPERE),
                sm_count=108,
                compute_capability=(8, 0),
                interconnect=300 * G,
                network=200 / 8 * G,
                l2_bytes=40 * MB,  # NVIDIA A100 Tensor Core GPU Architecture whitepaper
                boost_clock=1410 * MHZ,
                power=400,
            ),
            GPUSpec(  # A100 SXM4 40GB (datasheet: 1555 GB/s; 400 W)
                name="a100-40gb",
                memory_bytes=40960 * MiB,
                bandwidth=1.555e12,
                peak_flops=_teraflops(_AMPERE),
                sm_count=108,
                compute_capability=(8, 0),
                interconnect=300 * G,
                network=200 / 8 * G,
                l2_bytes=40 * MB,
                boost_clock=1410 * MHZ,
                power=400,
            ),
            GPUSpec(  # A100 80GB PCIe (datasheet: 1935 GB/s; 300 W), a node of PCIe cards
                name="a100-pcie-80gb",
                memory_bytes=81920 * MiB,
                bandwidth=1.935e12,
                peak_flops=_teraflops(_AMPERE),
                sm_count=108,
                compute_capability=(8, 0),
                interconnect=_PCIE4,
                network=_SHARED_NIC,
                l2_bytes=40 * MB,
                boost_clock=1410 * MHZ,
                power=300,
            ),
            GPUSpec(  # A100 40GB PCIe (datasheet: 1555 GB/s; 250 W)
                name="a100-pcie-40gb",
                memory_bytes=40960 * MiB,
                bandwidth=1.555e12,
                peak_flops=_teraflops(_AMPERE),
                sm_count=108,
                compute_capability=(8, 0),
                interconnect=_PCIE4,
                network=_SHARED_NIC,
                l2_bytes=40 * MB,
                boost_clock=1410 * MHZ,
                power=250,
            ),
            GPUSpec(  # L40S (datasheet: fp32 91.6; tf32 366, bf16/fp16 733, fp8 1466, int8 1466 sparse; 864 GB/s; 350 W)
                name="l40s",
                memory_bytes=46068 * MiB,
                bandwidth=864e9,
                peak_flops=_teraflops(
                    {"float64": 1.43, "float32": 91.6, "tf32": 183, "bfloat16": 366, "float16": 366, "float8": 733, "int8": 733}
                ),
                sm_count=142,
                compute_capability=(8, 9),
                interconnect=_PCIE4,
                network=_SHARED_NIC,
                l2_bytes=96 * MB,  # NVIDIA Ada GPU architecture whitepaper (AD102)
                boost_clock=2520 * MHZ,
                power=350,
            ),
            GPUSpec(  # L4 (datasheet: fp32 30.3; tf32 120, fp16 242, fp8 485, int8 485 sparse; 300 GB/s; 72 W)
                name="l4",
                memory_bytes=23034 * MiB,
                bandwidth=300e9,
                peak_flops=_teraflops(
                    {"float64": 0.47, "float32": 30.3, "tf32": 60, "bfloat16": 121, "float16": 121, "float8": 242.5, "int8": 242.5}
                ),
                sm_count=58,
                compute_capability=(8, 9),
                interconnect=_PCIE4,
                network=_SHARED_NIC,
                l2_bytes=48 * MB,  # Ada whitepaper (AD104)
                boost_clock=2040 * MHZ,
                power=72,
            ),
            GPUSpec(  # A10G (AWS G5): no fp8; int8 at twice its fp16 rate, as the A10 datasheet's GA102 (125 fp16, 250 int8)
                name="a10g",
                memory_bytes=23028 * MiB,
                bandwidth=600e9,
                peak_flops=_teraflops({"float64": 0.98, "float32": 31.2, "tf32": 35, "bfloat16": 70, "float16": 70, "int8": 140}),
                sm_count=80,
                compute_capability=(8, 6),
                interconnect=_PCIE4,
                network=_SHARED_NIC,
                l2_bytes=6 * MB,  # NVIDIA Ampere GA102 GPU architecture whitepaper
                boost_clock=1710 * MHZ,
            ),
            GPUSpec(  # RTX 4090 (Ada whitepaper: fp8 with fp32 accumulate 330.3, int8 660.6 dense; 450 W)
                name="rtx4090",
                memory_bytes=24564 * MiB,
                bandwidth=1008e9,
                peak_flops=_teraflops(
                    {"float64": 1.29, "float32": 82.6, "tf32": 82.6, "bfloat16": 165.2, "float16": 165.2, "float8": 330.3, "int8": 660.6}
                ),
                sm_count=128,
                compute_capability=(8, 9),
                interconnect=_PCIE4,
                network=_SHARED_NIC,
                l2_bytes=72 * MB,
                boost_clock=2520 * MHZ,
                power=450,
            ),
            GPUSpec(  # V100 SXM2 32GB (datasheet: fp32 15.7, fp64 7.8, tensor 125; 900 GB/s; NVLink 2 300 GB/s both ways; 300 W)
                name="v100",
                memory_bytes=32510 * MiB,
                bandwidth=900e9,
                peak_flops=_teraflops({"float64": 7.8, "float32": 15.7, "float16": 125}),
                sm_count=80,
                compute_capability=(7, 0),
                interconnect=150 * G,
                network=4 * 100 / 8 / 8 * G,  # DGX-1: four 100 Gb/s InfiniBand NICs for eight GPUs
                l2_bytes=6 * MB,  # NVIDIA Tesla V100 GPU architecture whitepaper
                boost_clock=1530 * MHZ,
                power=300,
            ),
            GPUSpec(  # V100 PCIe 32GB (datasheet: fp32 14, fp64 7, tensor 112; 900 GB/s; 250 W)
                name="v100-pcie",
                memory_bytes=32510 * MiB,
                bandwidth=900e9,
                peak_flops=_teraflops({"float64": 7, "float32": 14, "float16": 112}),
                sm_count=80,
                compute_capability=(7, 0),
                interconnect=_PCIE3,
                network=_SHARED_NIC,
                l2_bytes=6 * MB,
                boost_clock=1380 * MHZ,
                power=250,
            ),
            GPUSpec(  # T4 (datasheet: fp32 8.1, fp16 tensor 65, int8 130; 320 GB/s GDDR6; 70 W)
                name="t4",
                memory_bytes=15360 * MiB,
                bandwidth=320e9,
                peak_flops=_teraflops({"float64": 0.25, "float32": 8.1, "float16": 65, "int8": 130}),
                sm_count=40,
                compute_capability=(7, 5),
                interconnect=_PCIE3,
                network=_SHARED_NIC,
                l2_bytes=4 * MB,  # NVIDIA Turing GPU architecture whitepaper (TU104)
                boost_clock=1590 * MHZ,
                power=70,
            ),
            GPUSpec(  # Tesla P100 PCIe 16GB (datasheet: fp32 9.3, fp64 4.7, fp16 18.7 on CUDA cores; 732 GB/s; 250 W)
                name="p100",
                memory_bytes=16280 * MiB,
                bandwidth=732e9,
                peak_flops=_teraflops({"float64": 4.7, "float32": 9.3}),
                sm_count=56,
                compute_capability=(6, 0),
                interconnect=_PCIE3,
                network=_SHARED_NIC,
                l2_bytes=4 * MB,  # NVIDIA Tesla P100 whitepaper
                boost_clock=1303 * MHZ,
                power=250,
            ),
            GPUSpec(  # Tesla P4 (datasheet: fp32 5.5, int8 22; 192 GB/s; 75 W)
                name="p4",
                memory_bytes=7611 * MiB,
                bandwidth=192e9,
                peak_flops=_teraflops({"float64": 0.17, "float32": 5.5, "int8": 22}),
                sm_count=20,
                compute_capability=(6, 1),
                interconnect=_PCIE3,
                network=_SHARED_NIC,
                l2_bytes=2 * MB,  # NVIDIA Tesla P4 datasheet / GP104
                boost_clock=1063 * MHZ,
                power=75,
            ),
        )
    }
)
ALIASES = MappingProxyType(
    {"h100-sxm": "h100", "a100": "a100-80gb", "a100-sxm": "a100-80gb", "4090": "rtx4090", "v100-sxm2": "v100", "b200-sxm": "b200"}
)


def gpu_spec(target: str | os.PathLike[str] | GPUSpec) -> GPUSpec:
    """The spec ``target`` names (case and ``_``/``-`` ignored), or ``target`` itself if it is one; a
    path to a calibration file (``*.json``, see :func:`save_calibration`): its GPU, with that calibration."""
    if isinstance(target, GPUSpec):
        return target
    if isinstance(target, os.PathLike) or (isinstance(target, str) and target.strip().lower().endswith(".json")):
        return load_calibration(target)
    if not isinstance(target, str):
        raise TypeError(f"target must be a GPU name, a calibration file or a GPUSpec, got {type(target).__name__}")
    key = target.strip().lower().replace("_", "-").replace(" ", "-")
    key = ALIASES.get(key, key)
    if key not in GPUS:
        raise ValueError(f"unknown target GPU {target!r}: known are {', '.join(GPUS)} (or pass a GPUSpec)")
    return GPUS[key]


# ------------------------------------------------------------------ calibration files

# 2: kernel_seconds is added to each kernel's work (1: a floor under it), host_seconds is a recorded op's, products
# are priced in tiles (tile_cost, gemm_half's k and k_simt), products on CUDA cores have efficiencies of their own;
# 3: a table of reduction_cycles (a layer norm's cycles a row) and pooling's rates among the efficiencies. A file of
# format 2 still loads: it has neither, and its model prices those kernels by their bytes, as when it was fitted.
# A reduction's launch constants (reduction_cycles' "staging", the efficiencies' "reduction_rate": .reduce_kernel)
# are entries of the same tables: a file written before them prices reductions by their bytes, as when it was
# fitted, a split one's memset (one kernel's fixed time) beside them
CALIBRATION_FORMAT = 3
_STILL_READ = (2, CALIBRATION_FORMAT)  # the formats a file may have
_FIGURES = ("kernel_seconds", "host_seconds", "view_seconds")
# figures a calibration file may leave out: their defaults (simt_issue: none, as a file fitted before it has it)
_OPTIONAL = {"power_exponent": 1.0, "simt_integer": 0.25, "simt_issue": 0.0}
_MAY_BE_ZERO = {"simt_integer", "simt_issue"}  # none of a product's FMAs lost (see gpus.simt_fma_share)
_TABLES = ("efficiency", "gemm_half", "tile_cost", "reduction_bandwidth", "reduction_cycles")


def save_calibration(path: str | os.PathLike[str], gpu: GPUSpec, calibration: Calibration, measured: str = "") -> None:
    """Write ``calibration`` of ``gpu`` (one of :data:`GPUS`) as a JSON file that ``target=path`` loads;
    ``measured``: on what it was measured (the device's name), recorded beside it. The file is
    replaced whole or not at all."""
    if GPUS.get(gpu.name) is None:
        raise ValueError(f"a calibration file names its GPU from the table ({', '.join(GPUS)}), got {gpu.name!r}")
    document: dict[str, Any] = {"format": CALIBRATION_FORMAT, "gpu": gpu.name, "measured_on": measured, "source": calibration.source}
    document.update({name: dict(getattr(calibration, name)) for name in _TABLES})
    document.update({name: getattr(calibration, name) for name in (*_FIGURES, *_OPTIONAL)})
    replace_atomically(Path(path), json.dumps(document, indent=2) + "\n")


def load_calibration(path: str | os.PathLike[str]) -> GPUSpec:
    """The GPU a calibration file (:func:`save_calibration`) names, with its calibration."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"{path}: cannot read the calibration file: {error.strerror or error}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: not JSON: {error.msg}") from None

    def fail(entry: str, expected: str) -> ValueError:
        return ValueError(f"{path}:{_line_of(text, entry)}: {entry!r}: expected {expected}")

    if not isinstance(document, dict):
        raise ValueError(f"{path}:1: expected a JSON object of calibration figures")
    if document.get("format") == 1:
        older = "this file is an older modelprof calibrate's, whose figures the model now reads otherwise; calibrate again"
        raise fail("format", f"{CALIBRATION_FORMAT}: {older}")
    if document.get("format") not in _STILL_READ:
        raise fail("format", f"{CALIBRATION_FORMAT} (a calibration file written by modelprof calibrate)")
    known = {"format", "gpu", "measured_on", "source", *_TABLES, *_FIGURES, *_OPTIONAL}
    for entry in document:
        if entry not in known:
            raise fail(entry, f"one of {', '.join(sorted(known))}")
    name = document.get("gpu")
    if not isinstance(name, str) or name not in GPUS:
        raise fail("gpu", f"a GPU of the table ({', '.join(GPUS)})")
    figures: dict[str, Any] = {}
    for entry in _TABLES:
        table = document.get(entry, {})
        if not isinstance(table, dict) or not all(_positive(v) for v in table.values()):
            raise fail(entry, "an object of positive numbers")
        figures[entry] = {str(k): float(v) for k, v in table.items()}
    if "memory" not in figures["efficiency"]:  # what every kernel of no other kind is priced with
        raise fail("efficiency", "an object of positive numbers with 'memory' (the memory-bound kernels' share of the bandwidth)")
    for entry in _FIGURES:
        if entry not in document or not _positive(document[entry]):
            raise fail(entry, "a positive number of seconds")
        figures[entry] = float(document[entry])
    for entry, default in _OPTIONAL.items():
        value = document.get(entry, default)
        if not (_positive(value) or (entry in _MAY_BE_ZERO and value == 0 and not isinstance(value, bool))):
            raise fail(entry, "zero or a positive number" if entry in _MAY_BE_ZERO else "a positive number")
        figures[entry] = float(value)
    source = f"{path.name}: {document.get('source') or 'calibration file'}"
    calibration = Calibration(**figures, calibrated=True, source=source)
    return dataclasses.replace(GPUS[name], calibration=calibration)


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _line_of(text: str, field: str) -> int:
    """The line of ``"field":`` in a JSON text (1 if it is not there)."""
    at = text.find(f'"{field}"')
    return text.count("\n", 0, at) + 1 if at >= 0 else 1
