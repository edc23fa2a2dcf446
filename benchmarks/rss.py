"""Peak RSS of a fresh Python process, for the benchmarks."""

from __future__ import annotations

import subprocess
import sys


def peak_rss_gb(code: str) -> float:
    """Run ``code`` in a new interpreter and return its peak resident set size in GB.

    The figure is the child's VmHWM, which belongs to its own address space:
    ``ru_maxrss`` would carry the parent's peak over fork and exec.
    """
    return run_with_peak_rss(code)[1]


def run_with_peak_rss(code: str) -> tuple[str, float]:
    """Run ``code`` in a new interpreter: what it printed, and its peak resident set size in GB."""
    report = "\nprint(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')))\n"
    output = subprocess.run([sys.executable, "-c", code + report], check=True, capture_output=True, text=True).stdout
    *printed, rss = output.rstrip("\n").split("\n")
    return "\n".join(printed), int(rss.split()[-1]) * 1024 / 1e9
