"""Every figure (no timings) of 27 sharded profiles, as JSON: a change to the engine's sharded path must not
change one. The companion of ``figures_snapshot.py``, for ``world_size=``.

FSDP2 over 8 ranks of a three-layer Llama-style model (bf16 mixed precision) with seven optimizers (AdamW,
Adam with AMSGrad and weight decay, SGD with momentum, with gradients zeroed in place too, Adagrad, RMSprop,
NAdam, AdamW's for-loop), analytic on the CPU's terms and on an H100 target; inference with and without
grad, a step without an optimizer, layers that keep their parameters after forward; FSDP2 on real tensors;
a tensor-parallel MLP and DDP (real tensors) over 4. Run it on the code before and after a change and compare
the files (``cmp``)::

    python benchmarks/sharded_snapshot.py before.json
    git stash; python benchmarks/sharded_snapshot.py after.json; git stash pop
"""

import dataclasses
import json
import sys
from pathlib import Path

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.llama import Llama, LlamaConfig
from pytest_modelprof import profile

CONFIG = dataclasses.replace(LlamaConfig.tiny(), layers=3)
POLICY = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
IDS = torch.randint(0, 100, (1, 32), generator=torch.Generator().manual_seed(0))
OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p),
    "adam-amsgrad": lambda p: torch.optim.Adam(p, amsgrad=True, weight_decay=0.1),
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adagrad": lambda p: torch.optim.Adagrad(p),
    "rmsprop": lambda p: torch.optim.RMSprop(p, momentum=0.5),
    "nadam": lambda p: torch.optim.NAdam(p),
    "adamw-for-loop": lambda p: torch.optim.AdamW(p, foreach=False),
}


def llama(device: str = "meta") -> Llama:
    torch.manual_seed(0)
    with torch.device(device):
        return Llama(CONFIG)


def fsdp(model: nn.Module, mesh, reshard_layers: bool = True) -> None:
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=POLICY, reshard_after_forward=reshard_layers)
    fully_shard(model, mesh=mesh, mp_policy=POLICY)


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))


def cases():
    for target in (None, "h100"):
        on = {"world_size": 8, "parallelize": fsdp, "device": "meta", "target": target}
        for name, make in OPTIMIZERS.items():
            m = llama()
            yield f"fsdp-{name}-{target}", lambda m=m, make=make, on=on: profile(m, IDS, train=True, optimizer=make(m.parameters()), **on)
        m = llama()
        yield (
            f"fsdp-sgd-zeroed-in-place-{target}",
            lambda m=m, on=on: profile(
                m, IDS, train=True, optimizer=torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), set_to_none=False, **on
            ),
        )
        yield f"fsdp-inference-{target}", lambda on=on: profile(llama(), IDS, **on)
        yield f"fsdp-inference-with-grad-{target}", lambda on=on: profile(llama(), IDS, no_grad=False, **on)
        yield f"fsdp-no-optimizer-{target}", lambda on=on: profile(llama(), IDS, train=True, **on)
        kept = {**on, "parallelize": lambda model, mesh: fsdp(model, mesh, reshard_layers=False)}
        m = llama()
        yield (
            f"fsdp-layers-kept-{target}",
            lambda m=m, kept=kept: profile(m, IDS, train=True, optimizer=torch.optim.AdamW(m.parameters()), **kept),
        )
    m = llama("cpu")
    yield (
        "fsdp-real-adamw",
        lambda: profile(m, IDS, train=True, optimizer=torch.optim.AdamW(m.parameters()), world_size=4, parallelize=fsdp),
    )
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    yield "tensor-parallel-adamw", lambda: mlp_step(lambda model, mesh: parallelize_module(model, mesh, plan), device="meta")
    yield "ddp-adamw", lambda: mlp_step(lambda model, mesh: DistributedDataParallel(model, bucket_cap_mb=0.01))


def mlp_step(parallelize, **options):
    """An AdamW step of the MLP over 4 ranks, sharded by ``parallelize``."""
    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters())
    return profile(model, torch.randn(4, 64), train=True, optimizer=optimizer, world_size=4, parallelize=parallelize, **options)


def figures(value):
    """A profile's dictionary without its timings."""
    if isinstance(value, dict):
        return {k: figures(v) for k, v in value.items() if not k.startswith(("latency", "time")) and "elapsed" not in k}
    if isinstance(value, list):
        return [figures(v) for v in value]
    return value


def main() -> None:
    out = {}
    for name, run in cases():
        out[name] = figures(run().to_dict())
        print(name, flush=True)
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1, sort_keys=True, default=str))
    print(f"{len(out)} profiles -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
