"""Every causal language model type of Hugging Face transformers, built from a small config, profiled
on real CPU tensors and analytically: where the two differ (FLOPs, peak memory), what is left
uncounted, and what fails in one run only.

A regression sweep for the analytic engine on models it was not written against. Needs transformers
(``pip install transformers``; no weights are downloaded). Types whose small config does not build
or whose real run fails are reported as such: those are the config's, not the engine's.

    python benchmarks/hf_causal_sweep.py [TYPE ...]
"""

from __future__ import annotations

import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from pytest_modelprof import profile

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


def build(kind: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    config = small_config(kind)
    try:
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    except ValueError as error:  # a model without an SDPA path
        if "attention implementation" not in str(error):
            raise
        return AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def compare(model: torch.nn.Module, train: bool) -> str:
    inputs = {"input_ids": torch.randint(0, 500, (2, 16))}

    def loss(output: Any) -> torch.Tensor:
        return output.logits.float().sum()

    try:  # analytic first: a model that records state as it runs (RWKV's rescaling) then runs the same path twice
        analytic = profile(model, inputs, train=train, device="meta", loss_fn=loss)
    except Exception as error:
        analytic = error
    try:
        real = profile(model, inputs, train=train, loss_fn=loss)
    except Exception as error:
        return f"real run fails ({type(error).__name__})"
    if isinstance(analytic, Exception):
        return f"ANALYTIC RUN FAILS {type(analytic).__name__}: {str(analytic)[:200]}"
    found = []
    if analytic.flops != real.flops:
        found.append(f"FLOPs {analytic.flops / real.flops:.4f}")
    if analytic.peak_memory_bytes != real.peak_memory_bytes:
        found.append(f"peak {analytic.peak_memory_bytes / real.peak_memory_bytes:.4f}")
    if real.uncounted or analytic.uncounted:
        found.append(f"uncounted {sorted({**real.uncounted, **analytic.uncounted})}")
    return ", ".join(found) or "equal"


class _Timeout(Exception):
    pass


def _alarm(*_: Any) -> None:
    raise _Timeout


def main(kinds: list[str]) -> None:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    signal.signal(signal.SIGALRM, _alarm)
    counts = {"equal": 0, "differ": 0, "skipped": 0}
    for kind in kinds or list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        start = time.perf_counter()
        signal.alarm(120)
        try:
            torch.manual_seed(0)
            model = build(kind)
            rows = {mode: compare(model, train) for mode, train in (("eval", False), ("train", True))}
        except _Timeout:
            rows = {"eval": "over 120 s", "train": ""}
        except Exception as error:
            rows = {"eval": f"small config does not build ({type(error).__name__})", "train": ""}
        finally:
            signal.alarm(0)
        verdicts = set(rows.values()) - {""}
        key = (
            "equal"
            if verdicts == {"equal"}
            else "skipped"
            if all("fails (" in v or "build" in v or "120" in v for v in verdicts)
            else "differ"
        )
        counts[key] += 1
        print(f"{kind:28s} {time.perf_counter() - start:5.1f} s | eval: {rows['eval']} | train: {rows['train']}", flush=True)
    print(f"{counts['equal']} equal, {counts['differ']} differ or fail analytically, {counts['skipped']} not built or failing for real")


if __name__ == "__main__":
    main(sys.argv[1:])
