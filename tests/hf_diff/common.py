"""Shared pieces of the differential suite: tiny in-memory models and datasets in the shape of HF's own trainer
tests (``RegressionModel`` / ``RegressionDataset``), and a runner that executes one scenario under
``transformers`` and under ``taskfit.hf`` with only the import changed."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
import torch
from torch import nn


class RegressionDataset(torch.utils.data.Dataset):
    """y = a * x + b + noise, as HF's ``RegressionDataset`` (items are dicts with ``input_x`` and ``labels``)."""

    def __init__(self, a: float = 2.0, b: float = 3.0, length: int = 64, seed: int = 42,
                 label_name: str = "labels") -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.normal(size=(length,)).astype(np.float32)
        self.y = (a * self.x + b + rng.normal(scale=0.1, size=(length,))).astype(np.float32)
        self.label_name = label_name

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_x": self.x[i], self.label_name: self.y[i]}


class RegressionModel(nn.Module):
    """``y = a * x + b`` returning ``{"loss", "logits"}`` (HF's ``RegressionModel``)."""

    def __init__(self, a: float = 0.0, b: float = 0.0, double_output: bool = False) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(float(a)))
        self.b = nn.Parameter(torch.tensor(float(b)))
        self.double_output = double_output

    def forward(self, input_x: torch.Tensor, labels: torch.Tensor | None = None, **kwargs: Any) -> Any:
        y = input_x * self.a + self.b
        if labels is None:
            return (y, y) if self.double_output else (y,)
        loss = nn.functional.mse_loss(y, labels)
        return (loss, y, y) if self.double_output else (loss, y)


def hf_names(which: str) -> Any:
    """The HF names from ``transformers`` (``which="hf"``) or from ``taskfit.hf`` (``which="tf"``)."""
    if which == "hf":
        import transformers as m
    else:
        import taskfit.hf as m
    return m


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def both(scenario: Callable[[Any, str], Any], tmp_path: Any) -> tuple[Any, Any]:
    """Run ``scenario(module, output_dir)`` under transformers and under taskfit.hf."""
    out = []
    for which in ("hf", "tf"):
        d = os.path.join(str(tmp_path), which)
        out.append(scenario(hf_names(which), d))
    return out[0], out[1]
