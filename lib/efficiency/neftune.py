"""NEFTune (F-LOOP-7): HF ``neftune_noise_alpha``, noise on the input embeddings during training only.

Mirrors ``transformers.trainer_utils.neftune_post_forward_hook`` and the NEFTune paper (Jain et al., 2023,
"NEFTune: Noisy Embeddings Improve Instruction Finetuning"): in training mode the embedding output of shape
``(batch, seq_len, hidden)`` gets uniform noise in ``[-m, m]`` with ``m = alpha / sqrt(seq_len * hidden)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from taskfit.efficiency.checkpointing import hf_models

_HANDLE = "_taskfit_neftune_handle"


def neftune_post_forward_hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    """Forward hook: ``output + U(-m, m)`` with ``m = module.neftune_noise_alpha / sqrt(seq_len * hidden)`` when
    ``module.training``; the output unchanged in eval mode. ``output`` has shape ``(batch, seq_len, hidden)``."""
    if module.training:  # the bound in float32, as HF computes it (the same noise draws, bit for bit)
        mag = float(module.neftune_noise_alpha / torch.sqrt(torch.tensor(output.size(1) * output.size(2))))
        output = output + torch.zeros_like(output).uniform_(-mag, mag)
    return output


def input_embeddings(module: nn.Module) -> nn.Module:
    """The input-embedding layer of ``module``: ``get_input_embeddings()`` of the module or of its HF model
    (an ``nn.Module`` holding one), else its only ``nn.Embedding``.

    Raises:
        ValueError: none or several ``nn.Embedding`` layers and no ``get_input_embeddings`` method.
    """
    for m in (module, *hf_models(module)):
        getter = getattr(m, "get_input_embeddings", None)
        if callable(getter):
            emb = getter()
            if isinstance(emb, nn.Module):
                return emb
    found = [(n, m) for n, m in module.named_modules() if isinstance(m, nn.Embedding)]
    if len(found) != 1:
        raise ValueError(f"neftune_noise_alpha needs the input embedding layer of {type(module).__name__}, which has "
                         f"{len(found)} nn.Embedding layers ({[n for n, _ in found]}); define "
                         "get_input_embeddings() on the TaskModule to name it.")
    return found[0][1]


def activate_neftune(module: nn.Module, alpha: float) -> nn.Module:
    """Register :func:`neftune_post_forward_hook` on the input embeddings of ``module``; returns the layer.

    Args:
        module (nn.Module): the TaskModule or model.
        alpha (float): the noise scale (> 0; the paper uses 5 to 15).

    Raises:
        ValueError: ``alpha`` <= 0, or the embedding layer cannot be found (see :func:`input_embeddings`).
    """
    if not alpha > 0:
        raise ValueError(f"neftune_noise_alpha must be > 0 (or None to disable), got {alpha!r}.")
    emb = input_embeddings(module)
    deactivate_neftune(emb)
    emb.neftune_noise_alpha = float(alpha)
    setattr(emb, _HANDLE, emb.register_forward_hook(neftune_post_forward_hook))
    return emb


def deactivate_neftune(embedding: nn.Module | None) -> None:
    """Remove the hook and the ``neftune_noise_alpha`` attribute again (the layer is as before)."""
    handle = getattr(embedding, _HANDLE, None) if embedding is not None else None
    if handle is not None:
        handle.remove()
        delattr(embedding, _HANDLE)
        del embedding.neftune_noise_alpha
