"""Lightning's observer hooks (``ModelHooks``, ``DataHooks``, ``CheckpointHooks`` of ``lightning.pytorch.core.hooks``)
as no-op methods of :class:`taskfit.TaskModule`, with Lightning's signatures.

They exist so that code written against ``LightningModule`` finds them: ``super().on_train_start()`` works, and
a test that wraps every public method of the class (Lightning's own hook-order tests do) sees the same names.
The loops call a module hook only when the module overrides it (in its class or on the instance), so the
defaults cost nothing per step. The ``*_dataloader`` defaults return None: the module has no loader of that kind.
"""

from __future__ import annotations

from typing import Any


class ModelHooks:
    """Mixin of :class:`taskfit.TaskModule`: Lightning's ``on_*`` hooks, each doing nothing by default."""

    # -- stage boundaries ---------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        """Called at the very beginning of fit (after ``configure_optimizers``)."""

    def on_fit_end(self) -> None:
        """Called at the very end of fit."""

    def on_train_start(self) -> None:
        """Called at the beginning of training, after the sanity check."""

    def on_train_end(self) -> None:
        """Called at the end of training, before the ``on_fit_end`` hooks."""

    def on_validation_start(self) -> None:
        """Called at the beginning of validation."""

    def on_validation_end(self) -> None:
        """Called at the end of validation."""

    def on_test_start(self) -> None:
        """Called at the beginning of testing."""

    def on_test_end(self) -> None:
        """Called at the end of testing."""

    def on_predict_start(self) -> None:
        """Called at the beginning of predicting."""

    def on_predict_end(self) -> None:
        """Called at the end of predicting."""

    # -- epochs -------------------------------------------------------------------------------------------
    def on_train_epoch_start(self) -> None:
        """Called at the start of every training epoch."""

    def on_train_epoch_end(self) -> None:
        """Called at the end of every training epoch, after its validation (values logged here are epoch-level)."""

    def on_validation_epoch_start(self) -> None:
        """Called at the start of the validation epoch."""

    def on_validation_epoch_end(self) -> None:
        """Called at the end of the validation epoch."""

    def on_test_epoch_start(self) -> None:
        """Called at the start of the test epoch."""

    def on_test_epoch_end(self) -> None:
        """Called at the end of the test epoch."""

    def on_predict_epoch_start(self) -> None:
        """Called at the start of the predict epoch."""

    def on_predict_epoch_end(self) -> None:
        """Called at the end of the predict epoch."""

    # -- batches ------------------------------------------------------------------------------------------
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        """Called before ``training_step``; returning -1 skips the rest of the epoch (Lightning)."""
        return None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Called after ``training_step`` with its outputs (``{"loss": detached loss}``)."""

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before ``validation_step``."""

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called after ``validation_step`` with its outputs."""

    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before ``test_step``."""

    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called after ``test_step`` with its outputs."""

    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before ``predict_step``."""

    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called after ``predict_step`` with its outputs."""

    # -- optimization -------------------------------------------------------------------------------------
    def on_before_zero_grad(self, optimizer: Any) -> None:
        """Called before ``optimizer.zero_grad()`` (after ``training_step``)."""

    def on_before_backward(self, loss: Any) -> None:
        """Called before ``loss.backward()`` (``loss``: the scalar tensor about to be backpropagated)."""

    def on_after_backward(self) -> None:
        """Called after ``loss.backward()``, before the optimizer step (gradients are not unscaled yet)."""

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        """Called before ``optimizer.step()`` (gradients unscaled, not clipped yet)."""

    # -- loaders ------------------------------------------------------------------------------------------
    def train_dataloader(self) -> Any:
        """The module's own training data (a ``DataLoader``); None by default: none, give data to ``fit``."""
        return None

    def val_dataloader(self) -> Any:
        """The module's own validation data; None by default."""
        return None

    def test_dataloader(self) -> Any:
        """The module's own test data; None by default."""
        return None

    def predict_dataloader(self) -> Any:
        """The module's own prediction data; None by default."""
        return None


#: the loader methods above: a module "has" a loader only when it overrides one of them
LOADER_HOOKS = ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader")
