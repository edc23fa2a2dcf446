"""CSV exports of the module tree and the operator table (raw numbers, one header row)."""

from __future__ import annotations

import csv
from typing import TextIO

from ..results import Profile

MODULE_FIELDS = (
    "path",
    "type",
    "depth",
    "calls",
    "params",
    "forward_flops",
    "backward_flops",
    "recompute_flops",
    "forward_macs",
    "backward_macs",
    "self_forward_flops",
    "self_backward_flops",
    "share",
    "activation_bytes",
    "forward_peak_bytes",
    "backward_peak_bytes",
    "container",
)
OP_FIELDS = ("op", "phase", "calls", "flops", "macs", "allocated_bytes", "modules")


def write_modules_csv(profile: Profile, out: TextIO) -> None:
    """One row per module path, in tree order (memory columns are 0 when memory was not followed)."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(MODULE_FIELDS)
    for module in profile.modules:
        writer.writerow([getattr(module, name) for name in MODULE_FIELDS])


def write_ops_csv(profile: Profile, out: TextIO) -> None:
    """One row per operator and phase; ``modules`` lists the module paths, ``;``-separated."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(OP_FIELDS)
    for op in profile.ops:
        writer.writerow([op.op, op.phase, op.calls, op.flops, op.macs, op.allocated_bytes, ";".join(op.modules)])
