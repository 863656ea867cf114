"""The small regression module and data the logger and plot tests train (F-OBS-2, F-OBS-3)."""

from __future__ import annotations

import torch
from taskfit import TaskModule
from torch import nn
from torch.utils.data import TensorDataset


class Regression(TaskModule):
    """Linear regression of ``x.sum()``; validation logs ``mae`` and returns the MSE."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x).squeeze(-1), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("mae", (self.layer(x).squeeze(-1) - y).abs().mean())
        return nn.functional.mse_loss(self.layer(x).squeeze(-1), y)


def regression_data(n: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, x.sum(-1))
