"""Does the latency check hold on a noisy machine? False alarms and misses, measured.

ResNet-18, batch 1, on the CPU. One process records the baseline on the idle machine,
exactly as ``pytest --modelprof-update`` does (the profile's baseline values written to
a budget file). Then, for each condition, 2 x RUNS fresh processes, alternating, each
profile the model with ``latency=True`` and hold it against that budget with the
plugin's own check:

- the unchanged model: every "regressed" is a false alarm (goal: 0 of 20, idle or loaded);
- the same model made 25% slower by added work of known cost: a matrix product,
  sized in the parent so that it takes a quarter of the model's time (its measured
  share is printed): every "regressed" is a catch (goal: at least 19 of 20 on the idle
  machine; under load a slowdown may be "inconclusive", never "ok").

The conditions: ``idle``, and ``loaded`` with ``--load`` CPU-bound processes running
beside every check (default 2: on a 2-core runner, two busy neighbours). Each check's
own cost (counting, timing and checking; not the interpreter start) is printed too.

    python benchmarks/latency_check.py [--runs 20] [--slowdown 0.25] [--load 2] [--only idle|loaded]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torchvision
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pytest_modelprof import Timing, profile, stats  # noqa: E402
from pytest_modelprof.budgets import check, load_budgets, update_files  # noqa: E402

NAME = "resnet18 batch 1"


class Slower(nn.Module):
    """The model, then a matrix product of fixed size: added work of known cost."""

    def __init__(self, model: nn.Module, size: int) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("matrix", torch.randn(size, size), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        return out + torch.mm(self.matrix, self.matrix).mean()


def build(size: int) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = torchvision.models.resnet18()
    return (Slower(model, size) if size else model), torch.randn(1, 3, 224, 224)


def child(budget_dir: Path, size: int, record: bool) -> None:
    model, x = build(size)
    start = time.perf_counter()
    result = profile(model, x, memory=False, latency=True)
    result.name = NAME
    budgets = load_budgets(budget_dir)
    if record:
        update_files(budgets, {NAME: result}, lambda name: budget_dir / "bench.toml")
        verdict_status, finding = "recorded", None
    else:
        verdict = check(result, NAME, budgets.profiles[NAME])
        finding = next(f for f in verdict.findings if f.limit.startswith("baseline.latency_ms"))
        verdict.status = finding.status  # the latency's own verdict
        verdict_status = verdict.status
    cost = time.perf_counter() - start
    latency = result.latency
    assert latency is not None
    print(
        json.dumps(
            {
                "status": verdict_status,
                "raw_ms": latency.median * 1e3,
                "measured_ms": finding.measured if finding else None,
                "interval": finding.interval if finding else None,
                "allowed_ms": finding.allowed if finding else None,
                "calibration_ms": (latency.calibration_seconds or 0) * 1e3,
                "repeats": latency.runs,
                "cpu_wait": latency.cpu_wait or 0.0,
                "cost_s": cost,
            }
        )
    )


def run_child(budget_dir: Path, size: int, record: bool = False) -> dict:
    command = [sys.executable, __file__, "--child", str(budget_dir), "--size", str(size)]
    if record:
        command.append("--record")
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def size_for(slowdown: float) -> tuple[int, float]:
    """The matrix size that makes the model ``slowdown`` slower, and the slowdown measured with it."""
    model, x = build(0)
    model.eval()
    size, share = 512, 0.0
    with torch.no_grad():
        for _ in range(4):  # a product's cost grows as size**3: a few corrections converge
            slow, _ = build(size)
            slow.eval()
            for _ in range(3):
                model(x), slow(x)
            share = stats.median([_time(lambda s=slow: s(x)) / _time(lambda: model(x)) for _ in range(40)]) - 1
            if abs(share - slowdown) < 0.015:
                break
            size = round(size * (slowdown / max(share, 0.01)) ** (1 / 3))
    return size, share


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@contextlib.contextmanager
def busy(processes: int) -> Iterator[None]:
    """``processes`` CPU-bound neighbours, for as long as the block runs."""
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for process in load:
            process.kill()
            process.wait()


def condition(name: str, budget_dir: Path, size: int, runs: int, load: int, base: dict) -> dict[str, list[dict]]:
    print(f"\n{name}: {load} CPU-bound processes beside each check" if load else f"\n{name}: nothing else running")
    results: dict[str, list[dict]] = {"unchanged": [], "slower": []}
    with busy(load):
        for run in range(runs):
            for kind, n in (("unchanged", 0), ("slower", size)):
                outcome = run_child(budget_dir, n)
                results[kind].append(outcome)
                low, high = outcome["interval"]
                print(
                    f"  {kind:9} #{run + 1:2}: raw {outcome['raw_ms']:7.2f} ms -> {outcome['measured_ms']:7.2f} ms "
                    f"[{low:7.2f}, {high:7.2f}] allowed {outcome['allowed_ms']:.2f}, CPU wait {outcome['cpu_wait']:.0%}: "
                    f"{outcome['status']} ({outcome['cost_s']:.1f} s)"
                )
    return results


def table(name: str, results: dict[str, list[dict]], share: float, base: dict) -> list[str]:
    def counts(kind: str) -> str:
        statuses = [r["status"] for r in results[kind]]
        return " | ".join(str(statuses.count(s)) for s in ("regressed", "inconclusive", "ok", "improved"))

    costs = [r["cost_s"] for rs in results.values() for r in rs]
    raw = [r["raw_ms"] for r in results["unchanged"]]
    naive = base["raw_ms"] * 1.10  # a plain "median over baseline + 10%" check of raw times, for comparison
    return [
        f"### {name}",
        "| model | regressed | inconclusive | ok | improved | plain raw-median check: regressed |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| unchanged | {counts('unchanged')} | {sum(r > naive for r in raw)} |",
        f"| slower by {share:.0%} | {counts('slower')} | {sum(r['raw_ms'] > naive for r in results['slower'])} |",
        f"check cost: median {stats.median(costs):.1f} s, max {max(costs):.1f} s; unchanged raw medians "
        f"{min(raw):.1f}-{max(raw):.1f} ms (baseline {base['raw_ms']:.1f} ms)",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--slowdown", type=float, default=0.25)
    parser.add_argument("--load", type=int, default=2, help="CPU-bound processes beside each check in the loaded condition")
    parser.add_argument("--only", choices=("idle", "loaded"))
    parser.add_argument("--child", type=Path)
    parser.add_argument("--size", type=int, default=0)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.size, args.record)
        return
    size, share = size_for(args.slowdown)
    print(f"ResNet-18 batch 1 on the CPU ({torch.get_num_threads()} threads), {Timing().budget:g} s timing budget per check")
    print(f"slower model: + a {size}x{size} matrix product, measured at +{share:.1%} of the model's time")
    tables = []
    with tempfile.TemporaryDirectory() as directory:
        budget_dir = Path(directory)
        base = run_child(budget_dir, 0, record=True)
        print(f"baseline (idle): {base['raw_ms']:.2f} ms, calibration {base['calibration_ms']:.3f} ms ({base['repeats']} repeats)")
        for name, load in (("idle", 0), ("loaded", args.load)):
            if args.only in (None, name):
                results = condition(name, budget_dir, size, args.runs, load, base)
                tables.append(table(f"{name} ({load} busy processes)" if load else name, results, share, base))
    print()
    for lines in tables:
        print("\n".join(lines))
        print()
    print("goals: unchanged never regressed (idle or loaded); slower regressed in at least 19 of 20 idle runs and never ok under load")


if __name__ == "__main__":
    main()
