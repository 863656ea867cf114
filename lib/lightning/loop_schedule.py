"""The door's validation schedule and epoch limit, as a callback placed first (:class:`LightningLoop`):
Lightning's ``val_check_interval`` (batches, a fraction of an epoch, or wall time), ``check_val_every_n_epoch`` and
``max_epochs`` with ``max_steps`` (whichever first)."""

from __future__ import annotations

import time
from typing import Any

from taskfit.callbacks.base import Callback
from taskfit.lightning.flags import time_interval_seconds


class LightningLoop(Callback):
    """The loop semantics the Lightning door keeps (placed first among the callbacks): ``max_epochs`` also stops a
    run that has ``max_steps`` (whichever comes first), after training ``current_epoch`` counts the finished
    epochs (Lightning increments it when an epoch ends), and a validation schedule other than once at the end of
    every epoch (``val_check_interval``, ``check_val_every_n_epoch``) asks for validation after the batches
    Lightning validates after (the run's own evaluation schedule is off then: see ``Trainer._eval_plan``).
    During one trainer method with a datamodule it also carries that datamodule's checkpoint part
    (``datamodule_state``, a :class:`~taskfit.lightning.trainer_state.DataModuleState`): Lightning's
    ``trainer.callbacks`` has no entry for it, and this callback is always there."""

    def __init__(self, max_epochs: int | None, val_check_interval: Any = None, every_n_epochs: int | None = 1) -> None:
        self.max_epochs = max_epochs
        self.trained = self.epoch_ended = False
        self.vci, self.every = val_check_interval, every_n_epochs
        self.scheduled = False  # set by the Trainer per fit: validation data and a non-default schedule
        self.val_check_batch = 0
        self.total_batches = 0
        # a time interval: seconds of wall time (time.monotonic) between validations, counted from the start of
        # training (after the sanity check) and from the end of each validation (Lightning 2.6's rule)
        self.seconds = time_interval_seconds(val_check_interval)
        self.last_val = 0.0
        self.datamodule_state: Any = None  # set by the Trainer around one trainer method with a datamodule

    @property
    def default_schedule(self) -> bool:
        """Once at the end of every epoch (the run's own ``eval_strategy="epoch"`` does that)."""
        # an int 1 counts batches (validate after every batch), only the float 1.0 is once per epoch
        return (self.vci is None or isinstance(self.vci, float) and self.vci == 1.0) and self.every == 1 and \
            self.seconds is None

    def on_train_start(self, fit: Any, module: Any) -> None:
        """Resolve the validation interval in batches (Lightning's ``val_check_batch``).

        Raises:
            ValueError: an int ``val_check_interval`` above the batches of an epoch (with
                ``check_val_every_n_epoch`` set), as Lightning.
        """
        self.trained = self.epoch_ended = False
        self.total_batches = 0
        n = fit.state.batches_per_epoch
        if self.seconds is not None:  # no batch schedule: wall time decides (on_train_batch_end)
            self.last_val = time.monotonic()
            return
        if isinstance(self.vci, float) or self.vci is None:
            if n is None and self.vci not in (None, 1.0):
                raise ValueError(f"Trainer(val_check_interval={self.vci}) is a fraction of an epoch, but the train "
                                 "data has no length; give an int number of batches.")
            self.val_check_batch = max(1, int((n or 0) * (1.0 if self.vci is None else self.vci))) if n else 0
        else:
            if self.every is not None and n is not None and self.vci > n:
                raise ValueError(f"`val_check_interval` ({self.vci}) must be less than or equal to the number of the "
                                 f"training batches ({n}). If you want to disable validation set `limit_val_batches` "
                                 "to 0.0 instead. If you want to validate based on the total training batches, set "
                                 "`check_val_every_n_epoch=None`.")  # Lightning's message
            self.val_check_batch = self.vci

    def on_save_checkpoint(self, fit: Any, module: Any, checkpoint: dict[str, Any]) -> None:
        if self.datamodule_state is not None:
            self.datamodule_state.save(checkpoint)

    def on_load_checkpoint(self, fit: Any, module: Any, checkpoint: dict[str, Any]) -> None:
        if self.datamodule_state is not None:
            self.datamodule_state.load(checkpoint)

    def on_train_batch_start(self, fit: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self.total_batches += 1  # a batch skipped by -1 counts too (Lightning's total_batch_idx)

    def on_train_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self.scheduled or not self.val_check_batch and self.seconds is None:
            return
        if self.every is not None and (fit.state.current_epoch + 1) % self.every:
            return
        if self.seconds is not None:
            if time.monotonic() - self.last_val >= self.seconds:
                fit.control.should_evaluate = True
            return
        done = batch_idx + 1 if self.every is not None else self.total_batches  # per epoch, or over the run
        if done % self.val_check_batch == 0:
            fit.control.should_evaluate = True  # validated after this batch's optimizer step

    def on_validation_end(self, fit: Any, module: Any) -> None:
        if self.seconds is not None and not getattr(fit, "sanity_checking", False):
            self.last_val = time.monotonic()  # the next interval counts from the end of this validation

    def on_train_epoch_end(self, fit: Any, module: Any) -> None:
        self.epoch_ended = True
        if self.max_epochs is not None and fit.state.current_epoch + 1 >= self.max_epochs:
            fit.should_stop = True

    def on_train_end(self, fit: Any, module: Any) -> None:
        # no epoch ran (max_epochs=0, a stop requested before the first, e.g. a spent Timer): current_epoch stays
        self.trained = self.epoch_ended and fit.loop_policy.max_epochs != 0
