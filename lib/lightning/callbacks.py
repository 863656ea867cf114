"""Lightning's built-in callbacks under Lightning's names (``lightning.pytorch.callbacks``): swap
``from lightning.pytorch.callbacks import X`` for ``from taskfit.lightning.callbacks import X``."""

import math
from typing import Any

from taskfit.callbacks import (
    DeviceStatsMonitor,
    EMAWeightAveraging,
    GradientAccumulationScheduler,
    ModelSummary,
    ProgressBar,
    RichProgressBar,
    StochasticWeightAveraging,
    ThroughputMonitor,
    Timer,
    WeightAveraging,
)
from taskfit.callbacks.base import LightningCallback as Callback
from taskfit.callbacks.early_stopping import EarlyStopping as _EarlyStopping
from taskfit.callbacks.early_stopping import EarlyStoppingReason
from taskfit.callbacks.finetuning import BackboneFinetuning, BaseFinetuning
from taskfit.callbacks.lambda_callback import LambdaCallback
from taskfit.callbacks.lr_monitor import LearningRateMonitor as _LearningRateMonitor
from taskfit.callbacks.prediction_writer import BasePredictionWriter
from taskfit.callbacks.progress import TQDMProgressBar
from taskfit.errors import configuration_error
from taskfit.lightning.model_checkpoint import ModelCheckpoint
from taskfit.tuner.finders import BatchSizeFinder, LearningRateFinder


class EarlyStopping(_EarlyStopping):
    """``lightning.pytorch.callbacks.EarlyStopping``: Lightning's argument order and defaults (``mode="min"``
    whatever the name, ``min_delta``, ``patience=0`` allowed) over :class:`taskfit.callbacks.EarlyStopping`, with
    Lightning's ``wait_count``, ``best_score`` (a tensor, +-inf before the first check; settable, as a restored
    state sets it), ``stopped_epoch`` (the 0-based epoch it stopped in, 0 when it did not), ``stopping_reason`` (an
    :class:`EarlyStoppingReason`), ``stopping_reason_message``, ``state_key`` and Lightning's ``state_dict`` keys.

    Args:
        monitor (str): the logged name to watch (``self.log`` name, e.g. ``"val_loss"``).
        min_delta (float): the least change that counts as an improvement (its absolute value).
        patience (int): checks without improvement before stopping (>= 0).
        verbose, strict, check_finite, stopping_threshold, divergence_threshold, check_on_train_epoch_end,
            log_rank_zero_only: as :class:`taskfit.callbacks.EarlyStopping`.
        mode (str): ``"min"`` or ``"max"``.

    Raises:
        ValueError: ``patience`` < 0, or ``mode`` not ``"min"``/``"max"``.
    """

    def __init__(self, monitor: str, min_delta: float = 0.0, patience: int = 3, verbose: bool = False,
                 mode: str = "min", strict: bool = True, check_finite: bool = True,
                 stopping_threshold: float | None = None, divergence_threshold: float | None = None,
                 check_on_train_epoch_end: bool | None = None, log_rank_zero_only: bool = False) -> None:
        if not isinstance(patience, int) or patience < 0:
            raise ValueError(f"EarlyStopping patience={patience!r} must be an int >= 0.")
        if mode not in ("min", "max"):
            raise configuration_error(f"`mode` can be min, max, got {mode}")  # Lightning's message
        super().__init__(monitor=monitor, patience=max(patience, 1), mode=mode, check_finite=check_finite,
                         min_delta=min_delta, verbose=verbose, strict=strict, stopping_threshold=stopping_threshold,
                         divergence_threshold=divergence_threshold, check_on_train_epoch_end=check_on_train_epoch_end,
                         log_rank_zero_only=log_rank_zero_only)
        self.patience = patience  # 0: stop at the first check without improvement (Lightning)
        self.stopped_epoch = 0

    @property
    def state_key(self) -> str:
        """``EarlyStopping{'monitor': ..., 'mode': ...}`` (Lightning's key of its checkpoint state)."""
        return f"EarlyStopping{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}}}"

    @property
    def wait_count(self) -> int:
        """Checks without improvement since the best value."""
        return self.wait

    @wait_count.setter
    def wait_count(self, value: int) -> None:
        self.wait = value

    @property
    def best_score(self) -> Any:
        """The best value so far as a 0-dim tensor (``inf`` for ``"min"``, ``-inf`` for ``"max"`` before any)."""
        import torch

        return torch.tensor(self.best if self.best is not None else (math.inf if self.mode == "min" else -math.inf))

    @best_score.setter
    def best_score(self, value: Any) -> None:
        best = float(value)
        self.best = None if best == (math.inf if self.mode == "min" else -math.inf) else best  # the unset value

    def state_dict(self) -> dict[str, Any]:
        """Lightning's keys (``best_score`` a 0-dim tensor, ``stopping_reason`` the enum's value), plus
        ``stopped_step``."""
        return {"wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch, "best_score": self.best_score,
                "patience": self.patience, "stopping_reason": self.stopping_reason.value,
                "stopping_reason_message": self.stopping_reason_message, "stopped_step": self.stopped_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s keys (a state without the reason, as Lightning's before 2.6: not stopped;
        one saved by :class:`taskfit.callbacks.EarlyStopping`: its keys)."""
        if "wait_count" not in state_dict:
            super().load_state_dict(state_dict)
            return
        self.wait_count, self.stopped_epoch = state_dict["wait_count"], state_dict["stopped_epoch"]
        self.best_score, self.patience = state_dict["best_score"], state_dict["patience"]
        self.stopping_reason = EarlyStoppingReason(state_dict.get("stopping_reason",
                                                                  EarlyStoppingReason.NOT_STOPPED.value))
        self.stopping_reason_message = state_dict.get("stopping_reason_message")
        self._restored = True  # the next on_train_start keeps it
        self.stopped_step = state_dict.get("stopped_step")

    def _reset(self) -> None:
        super()._reset()
        self.stopped_epoch = 0  # Lightning's value when it did not stop

    def on_train_start(self, fit: Any, module: Any) -> None:
        super().on_train_start(fit, module)
        if self._check_on_train_epoch_end is None and hasattr(fit, "check_val_every_n_epoch"):
            # Lightning's rule: at the train epoch's end (after its validation) unless validation runs several
            # times per epoch or not every epoch
            self.check_on_train_epoch_end = fit.val_check_interval == 1.0 and fit.check_val_every_n_epoch == 1

    def _check(self, args: Any, state: Any, control: Any, metrics: dict[str, Any]) -> Any:
        before = self.stopped_step
        out = super()._check(args, state, control, metrics)
        if self.stopped_step is not None and self.stopped_step != before:
            self.stopped_epoch = int(state.current_epoch)  # Lightning: the epoch it stopped in, not a fraction
        return out


class LearningRateMonitor(_LearningRateMonitor):
    """``lightning.pytorch.callbacks.LearningRateMonitor``: :class:`taskfit.callbacks.LearningRateMonitor` (the same
    names, values and steps), which under Lightning's ``Trainer`` also needs a logger.

    Raises:
        ValueError: at the start of training, a trainer without a logger (``logger=False``; Lightning's message,
            Lightning raises its ``MisconfigurationException``); as :class:`taskfit.callbacks.LearningRateMonitor`.
    """

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.loggers:
            raise configuration_error("Cannot use `LearningRateMonitor` callback with `Trainer` that has no logger.")
        super().on_train_start(trainer, pl_module)


__all__ = [
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "BatchSizeFinder",
    "Callback",
    "DeviceStatsMonitor",
    "EMAWeightAveraging",
    "EarlyStopping",
    "EarlyStoppingReason",
    "GradientAccumulationScheduler",
    "LambdaCallback",
    "LearningRateFinder",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelSummary",
    "ProgressBar",
    "RichProgressBar",
    "StochasticWeightAveraging",
    "TQDMProgressBar",
    "ThroughputMonitor",
    "Timer",
    "WeightAveraging",
]
