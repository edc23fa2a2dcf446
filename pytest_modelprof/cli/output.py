"""What ``modelprof profile`` shows and writes: the reports on the terminal, the JSON, CSV,
plot and trace files, and a line on stderr while slow work goes on."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from ..report.export import write_modules_csv, write_ops_csv
from ..report.tables import format_memory_report, format_op_table, format_op_times, format_predicted, format_top, format_tree_table
from ..report.text import format_header
from .usage import CliError


def print_reports(result: Any, options: argparse.Namespace, out: TextIO) -> None:
    """The header, the module tree, the top module types, the operator tables, memory and the predicted step."""
    human = not options.raw
    print(format_header(result), file=out)
    print(file=out)
    print(format_tree_table(result, depth=options.depth, ignore=options.ignore, human=human, ops=options.ops), file=out)
    print(file=out)
    if options.depth >= 1:
        print(format_top(result, k=min(options.top, 5), depths=range(1, options.depth + 1)), file=out)
        print(file=out)
    print(format_op_table(result, top=options.top, human=human), file=out)
    if result.op_times:
        print(file=out)
        print(format_op_times(result, top=options.top, human=human), file=out)
    if result.memory is not None:
        print(file=out)
        print(format_memory_report(result, top_parameters=options.top), file=out)
    if result.predicted is not None:
        print(file=out)
        print(format_predicted(result, top=options.top), file=out)


def write_outputs(result: Any, options: argparse.Namespace, out: TextIO) -> None:
    """The files ``--json``, ``--csv`` and ``--plot`` ask for (``--trace`` was written while timing); a line for each."""
    if options.trace:
        print(f"wrote {options.trace}", file=out)
    if options.json:
        Path(options.json).write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {options.json}", file=out)
    if options.csv:
        modules = Path(options.csv)
        ops = modules.with_name(modules.stem + ".ops.csv")
        with modules.open("w", encoding="utf-8", newline="") as handle:
            write_modules_csv(result, handle)
        with ops.open("w", encoding="utf-8", newline="") as handle:
            write_ops_csv(result, handle)
        print(f"wrote {modules} and {ops}", file=out)
    if options.plot:
        from ..report.plots import plot_memory_timeline, plot_module_flops, plot_roofline

        flops_plot = Path(options.plot)
        written = [flops_plot]
        try:
            plot_module_flops(result, flops_plot, depth=1)
            if result.memory is not None:
                written.append(flops_plot.with_name(flops_plot.stem + ".memory.png"))
                plot_memory_timeline(result, written[-1])
            if result.predicted is not None:  # a --target GPU: the roofline of its predicted step
                written.append(flops_plot.with_name(flops_plot.stem + ".roofline.png"))
                plot_roofline(result, written[-1])
        except ImportError as error:
            raise CliError(str(error)) from None
        print("wrote " + ", ".join(str(path) for path in written), file=out)


@contextmanager
def progress(stage: str, after: float = 1.5, stream: TextIO | None = None) -> Iterator[None]:
    """Say on stderr what is going on, once the work has taken longer than ``after`` seconds."""
    stream = stream or sys.stderr
    done = threading.Event()
    start = time.perf_counter()
    interactive = stream.isatty()

    def report() -> None:
        if done.wait(after):
            return
        while True:
            elapsed = time.perf_counter() - start
            if interactive:
                stream.write(f"\rmodelprof: {stage}... {elapsed:.0f} s")
            else:
                stream.write(f"modelprof: {stage}...\n")
            stream.flush()
            if not interactive or done.wait(0.5):
                return

    thread = threading.Thread(target=report, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if interactive and time.perf_counter() - start > after:
            stream.write("\r\033[K")
            stream.flush()
