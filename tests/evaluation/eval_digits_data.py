"""Real data for the evaluation tests: scikit-learn's bundled digits (1,797 8x8 images, 10 classes)."""

from __future__ import annotations

import torch
from taskfit import TaskModule
from torch import nn


def digits(n_train: int = 1400) -> tuple[list[dict], list[dict]]:
    """``(train, eval)`` lists of ``{"pixels": (64,) float, "digit": int}`` samples, pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    y = torch.tensor(y)
    samples = [{"pixels": x[i], "digit": y[i]} for i in range(len(y))]
    return samples[:n_train], samples[n_train:]


# kept local: dict batches with labels under ``digit`` and an optional torchmetrics object
class DigitClassifier(TaskModule):
    """A linear classifier on dict batches whose labels live under ``digit`` (``label_names=["digit"]``)."""

    def __init__(self, metric_factory=None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(64, 10)
        self.label_names = ["digit"]
        self.metric = metric_factory() if metric_factory is not None else None

    def forward(self, pixels):
        return self.layer(pixels)

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self(batch["pixels"]), batch["digit"])

    def validation_step(self, batch, batch_idx):
        logits = self(batch["pixels"])
        out = {"loss": nn.functional.cross_entropy(logits, batch["digit"]), "logits": logits}
        if self.metric is not None:
            self.metric.update(logits, batch["digit"])
            out["tm_accuracy"] = self.metric  # a returned torchmetrics object: computed and reset per evaluation
        return out

    def predict_step(self, batch, batch_idx):
        return self(batch["pixels"])
