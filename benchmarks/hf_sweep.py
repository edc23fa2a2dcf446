"""Every model type of a Hugging Face transformers task, built from a small config, profiled on real CPU
tensors and analytically: where the two differ (FLOPs, peak memory), what is left uncounted, and what
fails in one run only.

A regression sweep for the analytic engine on models it was not written against. Needs transformers
(``pip install transformers``; no weights are downloaded). Types whose small config does not build
or whose real run fails are reported as such: those are the config's, not the engine's.

    python benchmarks/hf_sweep.py [--task TASK] [--target GPU] [TYPE ...]

``--target GPU`` (``h100``, any name of the package's table) runs each model instead as a CUDA step
on that GPU would run, analytically: inference and a bf16-autocast AdamW training step. Nothing is
compared (there is no GPU to compare with): the sweep reports what fails and what is left uncounted.

Tasks: causal (the default), masked, seq2seq, sequence-classification, question-answering,
pretraining, audio-classification, ctc, object-detection, semantic-segmentation,
universal-segmentation, video-classification, depth-estimation, backbone, masked-image-modeling,
zero-shot-image-classification.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.sweeps import Timeout, compare, on_target, option, time_limit, verdict

SMALL = {
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers"), 2),
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "n_embed"), 64),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "n_inner", "encoder_ffn_dim", "decoder_ffn_dim"), 128),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "encoder_attention_heads", "decoder_attention_heads"), 4),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), 4),
    **dict.fromkeys(("layerdrop", "encoder_layerdrop", "decoder_layerdrop", "attention_dropout", "hidden_dropout", "dropout"), 0.0),
    **dict.fromkeys(("attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout_prob", "attention_probs_dropout_prob"), 0.0),
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "head_dim": 16,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "use_cache": False,
}


TASKS = {  # task: (the auto mapping of transformers.models.auto.modeling_auto, the auto class)
    "causal": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    "masked": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM"),
    "seq2seq": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
    "sequence-classification": ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForSequenceClassification"),
    "question-answering": ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "AutoModelForQuestionAnswering"),
    "pretraining": ("MODEL_FOR_PRETRAINING_MAPPING_NAMES", "AutoModelForPreTraining"),
    "audio-classification": ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "AutoModelForAudioClassification"),
    "ctc": ("MODEL_FOR_CTC_MAPPING_NAMES", "AutoModelForCTC"),
    "object-detection": ("MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES", "AutoModelForObjectDetection"),
    "semantic-segmentation": ("MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES", "AutoModelForSemanticSegmentation"),
    "universal-segmentation": ("MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES", "AutoModelForUniversalSegmentation"),
    "video-classification": ("MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES", "AutoModelForVideoClassification"),
    "depth-estimation": ("MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES", "AutoModelForDepthEstimation"),
    "backbone": ("MODEL_FOR_BACKBONE_MAPPING_NAMES", "AutoBackbone"),
    "masked-image-modeling": ("MODEL_FOR_MASKED_IMAGE_MODELING_MAPPING_NAMES", "AutoModelForMaskedImageModeling"),
    "zero-shot-image-classification": ("MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForZeroShotImageClassification"),
}
# the output each loss sums: the first a model's output has
OUTPUTS = ("logits_per_image", "class_queries_logits", "prediction_logits", "start_logits", "logits", "predicted_depth")
OUTPUTS += ("reconstruction", "pred_boxes", "last_hidden_state")


def small_config(kind: str) -> Any:
    from transformers import AutoConfig

    config = AutoConfig.for_model(kind)
    parts = [config] + [
        getattr(config, name)
        for name in ("text_config", "decoder", "encoder")
        if not isinstance(getattr(config, name, None), (dict, type(None)))
    ]
    for part in parts:
        for key, value in SMALL.items():
            if getattr(part, key, None) is not None and not isinstance(getattr(part, key), (list, dict)):
                try:
                    setattr(part, key, value)
                except Exception:  # a derived or validated field: left as it is
                    pass
        for key in ("pad_token_id", "padding_idx"):
            if isinstance(getattr(part, key, None), int) and getattr(part, key) >= SMALL["vocab_size"]:
                setattr(part, key, 0)
    return config


LARGEST = 1_000_000_000  # parameters: a small config that keeps a part at full size (ColQwen2: 72 B) is skipped


class TooLarge(Exception):
    """The small config still builds a model too large to sweep on this machine."""


def build(kind: str, task: str = "causal") -> torch.nn.Module:
    import transformers

    auto = getattr(transformers, TASKS[task][1])

    def made(device: str) -> torch.nn.Module:
        with torch.device(device):
            try:
                return auto.from_config(small_config(kind), attn_implementation="sdpa")
            except ValueError as error:  # a model without an SDPA path (the config, tried, is built anew)
                if "attention implementation" not in str(error):
                    raise
                return auto.from_config(small_config(kind), attn_implementation="eager")

    size = sum(p.numel() for p in made("meta").parameters())
    if size > LARGEST:
        raise TooLarge(f"{size / 1e6:.0f} M parameters")
    return made("cpu")


def inputs_for(model: torch.nn.Module, task: str = "causal") -> dict[str, torch.Tensor]:
    """Small inputs of the model's main kind: 2 sequences of 16 tokens, 1 second of 16 kHz audio, an image
    (a clip) at the config's size up to 224."""
    config = model.config
    name = model.main_input_name
    if task == "zero-shot-image-classification" or name == "pixel_values":
        vision = getattr(config, "vision_config", config)
        size = getattr(vision, "image_size", 64)
        size = min(int((size[0] if isinstance(size, (list, tuple)) else size) or 64), 224)
        channels = getattr(vision, "num_channels", 3) or 3
        if task == "video-classification":
            return {"pixel_values": torch.randn(1, getattr(config, "num_frames", 8), channels, size, size)}
        images = {"pixel_values": torch.randn(2 if task == "zero-shot-image-classification" else 1, channels, size, size)}
        return {"input_ids": torch.randint(3, 500, (2, 8)), **images} if task == "zero-shot-image-classification" else images
    if name == "input_values":
        return {"input_values": torch.randn(2, 16000)}
    if name == "input_features":
        bins = getattr(config, "num_mel_bins", None) or getattr(config, "feature_size", 80) or 80
        return {"input_features": torch.randn(2, 200, bins)}
    inputs = {"input_ids": torch.randint(3, 500, (2, 16))}
    if task == "seq2seq":
        inputs["decoder_input_ids"] = torch.randint(3, 500, (2, 8))
    return inputs


def loss(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output.float().sum()
    for key in OUTPUTS:
        value = getattr(output, key, None)
        if isinstance(value, torch.Tensor):
            return value.float().sum()
    maps = getattr(output, "feature_maps", None)
    if maps:
        return sum((m.float().sum() for m in maps), torch.zeros(()))
    raise RuntimeError(f"no output to sum among {OUTPUTS}")


def main(kinds: list[str], task: str = "causal", target: str | None = None) -> None:
    import transformers
    from transformers.models.auto import modeling_auto

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    counts = {"good": 0, "bad": 0, "skipped": 0}
    for kind in kinds or list(getattr(modeling_auto, TASKS[task][0])):
        start = time.perf_counter()
        try:
            with time_limit(120):
                torch.manual_seed(0)
                model = build(kind, task)
                inputs = inputs_for(model, task)
                rows = {
                    mode: on_target(model, inputs, train, target, loss) if target else compare(model, inputs, train, loss)
                    for mode, train in (("eval", False), ("train", True))
                }
        except Timeout:
            rows = {"eval": "over 120 s", "train": ""}
        except TooLarge as error:
            rows = {"eval": f"small config does not build (too large: {error})", "train": ""}
        except Exception as error:
            rows = {"eval": f"small config does not build ({type(error).__name__})", "train": ""}
        counts[verdict(rows)] += 1
        print(f"{kind:28s} {time.perf_counter() - start:5.1f} s | eval: {rows['eval']} | train: {rows['train']}", flush=True)
    done = f"run on {target}, nothing uncounted" if target else "equal (in the modes that run for real)"
    print(f"{counts['good']} {done}, {counts['bad']} differ or fail analytically, {counts['skipped']} not built or failing for real")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    task = option(arguments, "--task") or "causal"
    if task not in TASKS:
        raise SystemExit(f"unknown task {task!r}: one of {', '.join(TASKS)}")
    target = option(arguments, "--target")
    main(arguments, task, target)
