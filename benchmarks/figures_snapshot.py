"""Every figure (no timings) of sixteen profiles, as JSON: a refactor of the engine must not change one.

Inference, training steps with and without optimizers, analytic runs, autocast, activation
checkpointing, an LSTM, FLOPs-only runs. Run it on the code before and after a change and
compare the files (``cmp``; a new field shows as a difference to argue for)::

    python benchmarks/figures_snapshot.py before.json
    git stash; python benchmarks/figures_snapshot.py after.json; git stash pop
"""

import json
import sys
from pathlib import Path

import torch
import torchvision
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.gpt2 import GPT2, GPT2Config
from pytest_modelprof import profile


class Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 16)

    def forward(self, x):
        return checkpoint(lambda y: self.b(torch.relu(self.a(y))), x, use_reentrant=False).sum(-1)


def cases():
    r18 = torchvision.models.resnet18()
    x = torch.randn(2, 3, 64, 64)
    cfg = GPT2Config.tiny()
    g = GPT2(cfg)
    ids = torch.randint(0, 256, (2, 16))
    lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
    yield "r18-inf", lambda: profile(r18, x)
    yield "r18-inf-flops", lambda: profile(r18, x, memory=False)
    yield "r18-train", lambda: profile(r18, x, train=True)
    yield "r18-adam", lambda: profile(r18, x, train=True, optimizer=torch.optim.Adam(r18.parameters()))
    yield (
        "r18-sgd-keepgrad",
        lambda: profile(r18, x, train=True, optimizer=torch.optim.SGD(r18.parameters(), lr=0.1, momentum=0.9), set_to_none=False),
    )
    yield "r18-meta-train", lambda: profile(r18, x, train=True, device="meta")
    yield "gpt-inf", lambda: profile(g, ids)
    yield "gpt-train", lambda: profile(g, ids, train=True)
    yield "gpt-bf16", lambda: profile(g, ids, train=True, autocast=torch.bfloat16)
    yield "gpt-meta-adamw", lambda: profile(g, ids, train=True, device="meta", optimizer=torch.optim.AdamW(g.parameters()))
    yield "gpt-flops-only", lambda: profile(g, ids, memory=False)
    yield "gpt-grad", lambda: profile(g, ids, no_grad=False)
    yield "lstm-train", lambda: profile(lstm, torch.randn(2, 5, 8), train=True)
    yield "ckpt-train", lambda: profile(Checkpointed(), torch.randn(4, 16), train=True)
    yield "vit-meta", lambda: profile(torchvision.models.vit_b_16(), torch.randn(1, 3, 224, 224), device="meta", memory=False)
    yield "mnv3-train-meta", lambda: profile(torchvision.models.mobilenet_v3_small(), torch.randn(2, 3, 64, 64), device="meta", train=True)


def main(out: str) -> None:
    result = {}
    for name, run in cases():
        torch.manual_seed(0)
        result[name] = run().to_dict()
    Path(out).write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    print(f"wrote {len(result)} profiles to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "figures.json")
