"""The canonical tiny models and data sets of the test suite, one per door a user comes through:

- :class:`Regression`: a ``TaskModule`` regressing ``x.sum(-1)`` with one ``nn.Linear`` (tuple batches);
- :class:`Classifier`: a ``TaskModule`` classifier whose ``validation_step`` returns logits and labels;
- :class:`HFClassifier`: a plain ``nn.Module`` in the Hugging Face convention (``forward(x, labels=None)``
  returns ``{"loss", "logits"}``; the loss only when labels are given), trained on dict rows;
- :class:`LightningStyle`: a Lightning-style module with validation, test and predict steps and its own
  ``configure_optimizers``.

Tests import them as ``from helpers.models import Regression, regression_data`` (tests/ is on ``sys.path``: pytest
puts conftest.py's folder there). A job script that runs as a fresh process puts tests/ on the path first, as
tests/jobs_common.py describes. Use a local class only where the test depends on the module's particular shape.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from taskfit import TaskModule


def _seeded(seed: int | None) -> None:
    # seed=None leaves the global RNG stream alone, for tests whose expected values come from the caller's seed
    if seed is not None:
        torch.manual_seed(seed)


class Regression(TaskModule):
    """``nn.Linear(features, 1)`` (as ``self.layer``) regressing ``y`` with the mean squared error.

    Batches are ``(x, y)`` with ``x`` of shape ``(B, features)`` and ``y`` of shape ``(B,)`` or ``(B, 1)``: the
    prediction is reshaped to ``y``'s shape, so either gives the same loss. ``validation_step`` logs ``val_loss``
    and returns it (so it is also averaged into ``eval_loss``).

    Args:
        features (int): input width.
        seed (int | None): ``torch.manual_seed(seed)`` before the layer is built; None: the current RNG stream.
    """

    def __init__(self, features: int = 3, seed: int | None = 0) -> None:
        super().__init__()
        _seeded(seed)
        self.layer = nn.Linear(features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x).view_as(y), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x).view_as(y), y)
        self.log("val_loss", loss)
        return loss


def regression_data(n: int = 16, features: int = 3, seed: int = 0, keepdim: bool = True) -> TensorDataset:
    """``(x, x.sum(-1))`` with ``x ~ N(0, 1)`` of shape ``(n, features)`` from ``torch.Generator().manual_seed(seed)``;
    the target has shape ``(n, 1)`` (``keepdim=True``) or ``(n,)``."""
    x = torch.randn(n, features, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, x.sum(-1, keepdim=keepdim))


class Classifier(TaskModule):
    """``nn.Linear(features, classes)`` (as ``self.layer``) with the cross-entropy on ``(x, y)`` batches.

    ``validation_step`` logs ``acc`` (the batch accuracy; logged as ``eval_acc``) and returns
    ``{"loss", "logits", "labels"}``, so ``compute_metrics`` sees every prediction. ``predict`` uses ``forward``.

    Args:
        features (int): input width.
        classes (int): number of classes.
        seed (int | None): ``torch.manual_seed(seed)`` before the layer is built; None: the current RNG stream.
    """

    def __init__(self, features: int = 4, classes: int = 3, seed: int | None = 0) -> None:
        super().__init__()
        _seeded(seed)
        self.layer = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("acc", (logits.argmax(-1) == y).float().mean())
        return {"loss": nn.functional.cross_entropy(logits, y), "logits": logits, "labels": y}


def classification_data(n: int = 32, features: int = 4, classes: int = 3, seed: int = 0) -> TensorDataset:
    """``(x, y)``: ``x ~ N(0, 1)`` of shape ``(n, features)`` and ``y = argmax(x[:, :classes])`` (a learnable
    label), from ``torch.Generator().manual_seed(seed)``. Needs ``classes <= features``."""
    x = torch.randn(n, features, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, x[:, :classes].argmax(-1))


class HFClassifier(nn.Module):
    """A plain ``nn.Module`` in the Hugging Face convention: ``forward(x, labels=None)`` returns
    ``{"logits": (B, classes)}`` plus ``"loss"`` (the cross-entropy) when ``labels`` are given, as
    ``transformers`` models do. ``self.linear`` is ``nn.Linear(features, classes)``.

    Args:
        features (int): input width.
        classes (int): number of classes.
        seed (int | None): ``torch.manual_seed(seed)`` before the layer is built; None: the current RNG stream.
    """

    def __init__(self, features: int = 3, classes: int = 2, seed: int | None = 0) -> None:
        super().__init__()
        _seeded(seed)
        self.linear = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.linear(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


def hf_rows(n: int = 32, features: int = 3, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` dict rows ``{"x": (features,), "labels": int64 scalar}`` with ``labels = x[0] > 0``, the shape a
    ``datasets.Dataset`` of features hands to the default collator."""
    x = torch.randn(n, features, generator=torch.Generator().manual_seed(seed))
    return [{"x": x[i], "labels": (x[i, 0] > 0).long()} for i in range(n)]


class LightningStyle(TaskModule):
    """A module written as for Lightning: ``nn.Linear(features, 1)`` (as ``self.layer``) on ``(x, y)`` batches,
    logging ``train_loss`` (``prog_bar=True``), ``val_loss`` and ``test_loss``, predicting ``self(x)``, and choosing
    its own optimizer in ``configure_optimizers`` (``torch.optim.SGD(lr, momentum)``; ``self.lr`` is the attribute
    Lightning's learning-rate finder updates).

    Args:
        features (int): input width.
        lr (float): SGD learning rate.
        momentum (float): SGD momentum.
        seed (int | None): ``torch.manual_seed(seed)`` before the layer is built; None: the current RNG stream.
    """

    def __init__(self, features: int = 3, lr: float = 0.1, momentum: float = 0.0, seed: int | None = 0) -> None:
        super().__init__()
        _seeded(seed)
        self.layer = nn.Linear(features, 1)
        self.lr, self.momentum = lr, momentum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def _loss(self, batch) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x).view_as(y), y)

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch))

    def test_step(self, batch, batch_idx):
        self.log("test_loss", self._loss(batch))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)
