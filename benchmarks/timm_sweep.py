"""One model of each timm family (its smallest by parameters), profiled on real CPU tensors and
analytically: where FLOPs or peaks differ, what is left uncounted, what fails in one run only.

A regression sweep for the analytic engine on models it was not written against. Needs timm
(``pip install timm``; no weights are downloaded: every model is built from its config).

    python benchmarks/timm_sweep.py [--target GPU] [FAMILY ...]

``--target GPU`` (``h100``, any name of the package's table) runs each model instead as that GPU
would, analytically: inference, and a bf16-autocast AdamW training step; it reports what fails and
what is left uncounted (there is no GPU here to compare with).
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.sweeps import Timeout, compare, on_target, option, time_limit, verdict

LARGEST_SIDE = 288  # inputs at the model's own size up to this; larger ones at 224


def smallest(family: str) -> str | None:
    """The family's model with the fewest parameters (counted on the meta device)."""
    import timm

    sizes = {}
    for name in timm.list_models(module=family):
        try:
            with torch.device("meta"):
                model = timm.create_model(name, pretrained=False, num_classes=10)
        except Exception:  # a config that does not build on its own
            continue
        sizes[name] = sum(p.numel() for p in model.parameters())
    return min(sizes, key=sizes.__getitem__) if sizes else None


def build(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    import timm

    model = timm.create_model(name, pretrained=False, num_classes=10)
    channels, height, width = model.pretrained_cfg.get("input_size", (3, 224, 224))
    if max(height, width) > LARGEST_SIDE and _runs_at(name, channels, 224):  # a model fixed to its size keeps it
        height, width = 224, 224
    return model, torch.randn(2, channels, height, width)  # 2: batch norm over pooled features needs more than one


def _runs_at(name: str, channels: int, side: int) -> bool:
    """Whether the model takes inputs of ``side`` x ``side`` (a forward pass on the meta device)."""
    import timm

    try:
        with torch.device("meta"), torch.no_grad():
            timm.create_model(name, pretrained=False, num_classes=10).eval()(torch.empty(2, channels, side, side))
    except Exception:
        return False
    return True


def main(families: list[str], target: str | None) -> None:
    import timm

    warnings.filterwarnings("ignore")
    counts = {"good": 0, "bad": 0, "skipped": 0}
    for family in families or timm.list_modules():
        start = time.perf_counter()
        name = "-"
        try:
            with time_limit(300):
                name = smallest(family) or "-"
                if name == "-":
                    rows = {"eval": "no model builds", "train": ""}
                else:
                    torch.manual_seed(0)
                    model, x = build(name)
                    rows = {
                        mode: on_target(model, x, train, target) if target else compare(model, x, train)
                        for mode, train in (("eval", False), ("train", True))
                    }
        except Timeout:
            rows = {"eval": "over 300 s", "train": ""}
        except Exception as error:
            rows = {"eval": f"does not build ({type(error).__name__})", "train": ""}
        counts[verdict(rows)] += 1
        elapsed = time.perf_counter() - start
        print(f"{family:16s} {name:40s} {elapsed:5.1f} s | eval: {rows['eval']} | train: {rows['train']}", flush=True)
    done = f"run on {target}, nothing uncounted" if target else "equal"
    print(
        f"{counts['good']} families {done}, {counts['bad']} differ or fail analytically, {counts['skipped']} not built or failing for real"
    )


if __name__ == "__main__":
    arguments = sys.argv[1:]
    target = option(arguments, "--target")
    main(arguments, target)
