"""Write ``kernels.csv.gz`` from NeuSight's per-op training set (``OP__GPU.csv.gz``: see README.md).

Each source row becomes one row here: the op class, the GPU, the measured latency, the op's shape
(named as below), the main kernel's name without its template arguments, and its launch grid and
block; NeuSight's other columns (torch, cuDNN and CUDA versions, occupancy, the list of every kernel
the op ran) are left out. Rows are kept in the source's order, file by file (sorted by name).

    python compact.py SOURCE_DIR    # writes kernels.csv.gz beside this script
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import sys
from pathlib import Path

SHAPES = {  # the source's shape columns, per op, and the names they are given here
    "conv": {"B": "b", "Input_Channel": "c_in", "Output_Channel": "c_out", "Kernel_Szie": "kernel", "Input_Size": "size",
             "Stride": "stride", "Padding": "padding"},
    "linear": {"B": "b", "M": "m", "N": "n", "K": "k"},
    "bmm": {"B": "b", "M": "m", "N": "n", "K": "k"},
}
ROWS = {"B": "b", "H": "h"}  # elementwise, softmax and layer norm: a B x H tensor
COLUMNS = ("op", "gpu", "ms", "b", "m", "n", "k", "h", "c_in", "c_out", "kernel", "size", "stride", "padding",
           "kernel_name", "grid", "block")


def kernel_name(name: str) -> str:
    """``void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, ...)`` ->
    ``vectorized_layer_norm_kernel``."""
    name = name.replace("(anonymous namespace)::", "").removeprefix("void ")
    return re.sub(r"[<(].*", "", name).rsplit("::", 1)[-1]


def main(source: Path) -> None:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for path in sorted(source.glob("*__*.csv.gz")):
        with gzip.open(path, "rt", newline="") as handle:
            for row in csv.DictReader(handle):
                op = row["OPName"]
                shape = {name: row[column] for column, name in SHAPES.get(op, ROWS).items()}
                grid = "x".join(row[f"Grid {axis}"] for axis in "xyz")
                block = "x".join(row[f"Block {axis}"] for axis in "xyz")
                values = {"op": op, "gpu": row["Device"], "ms": f"{float(row['Latency']):.6g}", **shape,
                          "kernel_name": kernel_name(row["Kernel Name"]), "grid": grid, "block": block}
                writer.writerow([values.get(column, "") for column in COLUMNS])
    target = Path(__file__).with_name("kernels.csv.gz")
    target.write_bytes(gzip.compress(out.getvalue().encode(), mtime=0))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
