"""Profile the example models and print their figures.

    python examples/profile_examples.py

Real runs on the CPU for the small models; the Llama-style 7B model is profiled
analytically (fake tensors: nothing is allocated).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.gpt2 import GPT2, GPT2Config
from examples.llama import Llama, LlamaConfig
from pytest_modelprof import profile
from pytest_modelprof.report import format_profile


def main() -> None:
    torch.manual_seed(0)
    runs = [
        ("resnet18", torchvision.models.resnet18(), torch.randn(1, 3, 224, 224), {}),
        ("mobilenet_v3_small training step", torchvision.models.mobilenet_v3_small(), torch.randn(8, 3, 224, 224), {"train": True}),
        ("gpt2-tiny training step", GPT2(GPT2Config.tiny()), torch.randint(0, 256, (4, 64)), {"train": True}),
        ("lstm", torch.nn.LSTM(64, 128, num_layers=2, batch_first=True), torch.randn(4, 32, 64), {}),
    ]
    with torch.device("meta"):
        llama = Llama(LlamaConfig.llama_7b())
    runs.append(("llama-7b training step, sequence 2048", llama, torch.randint(0, 32000, (1, 2048)), {"train": True, "device": "meta"}))
    for name, model, inputs, options in runs:
        result = profile(model, inputs, **options)
        result.name = name
        print(format_profile(result, depth=1, top_ops=5))
        print()


if __name__ == "__main__":
    main()
