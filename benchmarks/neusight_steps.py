"""Predicted whole steps against NeuSight's measured ones: Hugging Face models on V100, T4, P100 and P4.

pytest_modelprof/data/kernel-data/steps holds the step latencies NeuSight measured (fp32, eager attention,
``cudnn.benchmark``; a training step is the forward and ``loss.backward()``, the loss itself untimed and no
optimizer; inference a forward under ``no_grad``) with the configs of the models. Each is built here from its
config on the meta device, as NeuSight's tracer builds it (BERT as ``BertForPreTraining`` to train and
``BertForSequenceClassification`` to infer, the others as causal language models), profiled on the
GPU as a target, and its predicted step time set beside the measured one.

The steps ran on GPUs whose single-op kernel times the shipped calibration is fitted on
(benchmarks/kernel_data.py), but no step time of theirs is: they check that per-kernel predictions add up to
whole steps, host time included. Needs ``transformers`` (not a dependency of the project):

    pip install transformers && python benchmarks/neusight_steps.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.neusight import DATA, GPU_NAMES  # noqa: E402
from pytest_modelprof import profile  # noqa: E402

STEPS = DATA / "steps"


def build(config_name: str, train: bool) -> torch.nn.Module:
    import transformers

    document = json.loads((STEPS / "configs" / f"{config_name}.json").read_text())
    config = transformers.AutoConfig.for_model(**{k: v for k, v in document.items() if k != "architectures"})
    config._attn_implementation = "eager"
    bert = config.model_type == "bert"
    if train:
        family = transformers.AutoModelForPreTraining if bert else transformers.AutoModelForCausalLM
    else:
        family = transformers.AutoModelForSequenceClassification if bert else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = family.from_config(config, attn_implementation="eager", torch_dtype=torch.float32)
    return model.train(train)


def loss(output: object) -> torch.Tensor:
    """The training loss NeuSight computes (untimed there): cross entropy of the logits against the inputs (all
    ones); here a stand-in with the logits' shape, since its few kernels are not in the measured time."""
    logits = getattr(output, "logits", None)
    if logits is None:
        logits = output.prediction_logits  # type: ignore[attr-defined]
    value: torch.Tensor = logits.float().mean()
    return value


def main() -> None:
    rows = []
    start = time.perf_counter()
    for directory in sorted(p for p in STEPS.iterdir() if p.is_dir() and p.name != "configs"):
        gpu = GPU_NAMES[directory.name.replace("_", " ")]  # Tesla_V100-PCIE-32GB: the device's name
        for path in sorted(directory.glob("*.json")):
            model_name, mode, seq, batch = path.stem.rsplit("-", 3)
            train = mode == "train"
            measured = json.loads(path.read_text())["e2e_latency"] / 1e3
            model = build(model_name, train)
            inputs = torch.ones(int(batch), int(seq), dtype=torch.long, device="meta")
            keywords = {"train": True, "loss_fn": loss} if train else {}
            result = profile(model, (inputs,), target=gpu, flops=False, memory=False, **keywords)
            assert result.predicted is not None
            predicted = result.predicted.seconds
            rows.append((gpu, path.stem, measured, predicted, result.predicted.host_seconds))
            error = predicted / measured - 1
            print(f"{gpu:12s} {path.stem:28s} measured {measured * 1e3:9.2f} ms  predicted {predicted * 1e3:9.2f} ms  {error:+7.1%}")
    print()
    for gpu in sorted({r[0] for r in rows}):
        errors = [abs(r[3] / r[2] - 1) for r in rows if r[0] == gpu]
        print(f"{gpu:12s} {len(errors):2d} steps: median |error| {statistics.median(errors):.1%}, max {max(errors):.1%}")
    everything = [abs(r[3] / r[2] - 1) for r in rows]
    print(f"all          {len(everything):2d} steps: median |error| {statistics.median(everything):.1%}, max {max(everything):.1%}")
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
