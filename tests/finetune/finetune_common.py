"""Shared pieces of the fine-tuning differential tests: a tiny Llama built from a config (no download), token
rows of different lengths, and a runner that executes one scenario under ``transformers`` (+ PEFT) and under
``taskfit.hf`` with only the import changed (the peer is the oracle)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

VOCAB = 64


def tiny_llama(seed: int = 0, **sizes: int) -> Any:
    """A 2-layer Llama with hidden size 32 and a 64-token vocabulary, seeded (fp32, CPU); ``sizes`` override
    ``LlamaConfig`` fields (e.g. ``hidden_size``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    options = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config = LlamaConfig(**{**options, **sizes})
    return LlamaForCausalLM(config)


def token_rows(n: int = 16, seed: int = 1) -> list[dict[str, list[int]]]:
    """``n`` pre-tokenised rows of 5..12 tokens (``input_ids`` and ``labels`` as Python lists, as a tokenised
    ``datasets.Dataset`` yields them)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(5, 13, (1,), generator=g))
        ids = torch.randint(0, VOCAB, (length,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": list(ids)})
    return rows


def hf_names(which: str) -> Any:
    """The HF names from ``transformers`` (``which="hf"``) or from ``taskfit.hf`` (``which="tf"``)."""
    if which == "hf":
        import transformers as m
    else:
        import taskfit.hf as m
    return m


def both(scenario: Callable[[Any, str], Any], tmp_path: Any) -> tuple[Any, Any]:
    """Run ``scenario(module, output_dir)`` under transformers and under taskfit.hf."""
    return tuple(scenario(hf_names(which), os.path.join(str(tmp_path), which)) for which in ("hf", "tf"))


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


VOLATILE = ("_runtime", "_per_second", "total_flos", "_model_preparation_time")


def stable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Log rows without the wall-clock keys (and ``total_flos``, a documented difference)."""
    return [{k: v for k, v in row.items() if not k.endswith(VOLATILE)} for row in rows]


def lora_model(seed: int = 0, sizes: dict[str, int] | None = None, **config: Any) -> Any:
    """:func:`tiny_llama` (with ``sizes``) with LoRA adapters (rank 4) on ``q_proj``/``v_proj``, no dropout; the
    adapters' initialisation is seeded too, so two calls build the same model."""
    from peft import LoraConfig, get_peft_model

    base = tiny_llama(seed, **(sizes or {}))
    torch.manual_seed(seed + 1)
    options = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return get_peft_model(base, LoraConfig(**{**options, **config}))


def equal_rows(n: int = 16, length: int = 5) -> list[dict[str, list[int]]]:
    """:func:`token_rows` cut to the same ``length`` (a pre-tokenised dataset the default collator can stack)."""
    return [{k: v[:length] for k, v in row.items()} for row in token_rows(n)]


def adapter_weights(model: Any) -> dict[str, torch.Tensor]:
    """The trainable (adapter) tensors of a PEFT model, by name."""
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
