"""Token-classification samples shared by the multi-process test jobs: each sample has 1..T labelled tokens (the
rest are -100), so micro-batches hold different numbers of items and only exact item-count weighting across
ranks and micro-batches matches one big batch."""

from __future__ import annotations

import torch

VOCAB, CLASSES, T = 4, 3, 6


def token_samples(n: int, seed: int = 0, with_index: bool = False) -> list[dict[str, torch.Tensor]]:
    """``n`` samples ``{"x": [T, VOCAB] float, "labels": [T] long}`` (plus ``"idx"`` with ``with_index``)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        x = torch.randn(T, VOCAB, generator=g)
        labels = x[:, :CLASSES].argmax(-1)
        labels[int(torch.randint(1, T + 1, (1,), generator=g)):] = -100  # 1..T valid tokens per sample
        out.append({"x": x, "labels": labels, **({"idx": torch.tensor(i)} if with_index else {})})
    return out
