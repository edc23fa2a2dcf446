"""Every torchvision model, analytically, as inference and as a training step, on the CPU's terms and
on an H100 target with bf16 autocast: what fails, what is left uncounted, and how long each took.

A regression sweep for the engine's coverage (the models that users profile are built from code, not
downloaded: no weights are needed). Detection models are run on real tensors only, since how many
boxes pass their thresholds is data; the others are built on the meta device.

    python benchmarks/zoo_sweep.py [classification|segmentation|video|optical_flow|detection ...] [--only NAME ...]
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torchvision

from pytest_modelprof import profile

KINDS = ("classification", "segmentation", "video", "optical_flow", "detection")
_PACKAGES = {kind: getattr(torchvision.models, kind) for kind in KINDS if kind != "classification"}


def _names(kind: str) -> list[str]:
    if kind != "classification":
        return sorted(torchvision.models.list_models(module=_PACKAGES[kind]))
    others = {n for package in _PACKAGES.values() for n in torchvision.models.list_models(module=package)}
    others |= set(torchvision.models.list_models(module=torchvision.models.quantization))
    return sorted(n for n in torchvision.models.list_models(module=torchvision.models) if n not in others)


def _inputs(kind: str, name: str) -> Any:
    if kind == "video":
        side = 224 if name.startswith(("s3d", "mvit", "swin3d")) else 112
        return torch.randn(2, 3, 16, side, side)
    if kind == "optical_flow":
        return (torch.randn(1, 3, 128, 128), torch.randn(1, 3, 128, 128))
    if kind == "detection":
        return ([torch.rand(3, 320, 320)],)
    side = 299 if name == "inception_v3" else 224
    return torch.randn(2, 3, side, side)


def _build(kind: str, name: str) -> torch.nn.Module:
    options: dict[str, Any] = {"weights": None}
    if kind in ("segmentation", "detection"):
        options["weights_backbone"] = None
    if name in ("inception_v3", "googlenet"):
        options["init_weights"] = False
    if kind == "detection":
        return torchvision.models.get_model(name, **options).eval()
    with torch.device("meta"):
        return torchvision.models.get_model(name, **options)


def _loss(kind: str) -> Any:
    if kind == "segmentation":
        return lambda out: out["out"].float().square().mean()
    if kind == "optical_flow":
        return lambda out: out[-1].float().square().mean()
    return None


def sweep(kind: str, only: set[str]) -> tuple[int, int]:
    runs = failures = 0
    settings = [("cpu-terms", {"device": "meta"}), ("h100-bf16", {"device": "meta", "target": "h100", "autocast": torch.bfloat16})]
    if kind == "detection":
        settings = [("real-cpu", {})]
    for name in _names(kind):
        if only and name not in only:
            continue
        try:
            model = _build(kind, name)
        except NotImplementedError:  # an initialisation that reads values (RegNet's): built for real
            model = torchvision.models.get_model(name, weights=None)
        cells = []
        for train in (False,) if kind == "detection" else (False, True):
            for label, options in settings:
                runs += 1
                start = time.perf_counter()
                try:
                    result = profile(model, _inputs(kind, name), train=train, loss_fn=_loss(kind) if train else None, **options)
                except Exception as error:
                    failures += 1
                    cells.append(f"{'train' if train else 'eval'} {label}: FAILED {type(error).__name__}: {str(error)[:160]}")
                    continue
                uncounted = f" uncounted {result.uncounted}" if result.uncounted else ""
                cells.append(f"{'train' if train else 'eval'} {label}: {time.perf_counter() - start:.1f} s{uncounted}")
        print(f"{kind:14s} {name:36s} " + " | ".join(cells), flush=True)
    return runs, failures


def main() -> None:
    warnings.filterwarnings("ignore")
    arguments = sys.argv[1:]
    only = set(arguments[arguments.index("--only") + 1 :]) if "--only" in arguments else set()
    kinds = [a for a in arguments if a in KINDS] or list(KINDS)
    totals = [sweep(kind, only) for kind in kinds]
    runs, failures = (sum(column) for column in zip(*totals))
    print(f"{runs} runs, {failures} failed")


if __name__ == "__main__":
    main()
