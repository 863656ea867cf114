"""Early stopping on an evaluation metric (F-LOOP-6)."""

from __future__ import annotations

import logging
import math
from enum import Enum
from typing import Any

from taskfit.callbacks.base import Callback

log = logging.getLogger("taskfit")


class EarlyStoppingReason(Enum):
    """Why :class:`EarlyStopping` stopped training; the names and values of Lightning's
    ``lightning.pytorch.callbacks.early_stopping.EarlyStoppingReason`` (the value is what checkpoints keep)."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(Callback):
    """Stop training when ``monitor`` has not improved for ``patience`` evaluations.

    Mirrors Lightning's ``EarlyStopping`` (its arguments and the order of its checks: non-finite, stopping
    threshold, divergence threshold, improvement, patience) and HF's ``EarlyStoppingCallback`` (whose argument
    names ``early_stopping_patience``/``early_stopping_threshold`` are accepted too).

    Args:
        monitor (str | None): metric name as returned by evaluation (``"eval_loss"``); None takes
            ``FitArguments.metric_for_best_model`` (prefixed ``eval_`` when needed), else ``"eval_loss"``.
        patience (int): evaluations without improvement before stopping (>= 1).
        threshold (float): minimum absolute change that counts as an improvement (>= 0).
        mode (str | None): ``"min"`` or ``"max"``; None takes ``greater_is_better`` (default ``"min"`` for
            names ending in ``loss``, else ``"max"``).
        check_finite (bool): stop at once when the metric becomes NaN or infinite.
        min_delta (float | None): Lightning's name for ``threshold`` (its absolute value is used).
        verbose (bool): log why training stopped.
        strict (bool): a missing monitored metric raises; False skips the check (as Lightning).
        stopping_threshold (float | None): stop as soon as the metric is better than this value.
        divergence_threshold (float | None): stop as soon as the metric is worse than this value.
        check_on_train_epoch_end (bool | None): check at the end of each training epoch on the logged values
            (``fit.callback_metrics``, the epoch's aggregates included) instead of after each evaluation; None:
            after evaluation, or at the end of each training epoch when the run evaluates nothing.
        log_rank_zero_only (bool): with several processes, only rank 0 logs the ``verbose`` messages (Lightning's
            argument; each message is prefixed with its rank otherwise).

    Raises:
        ValueError: bad ``patience``, ``threshold`` or ``mode``.
    """

    #: runs its on_train_epoch_end after the module's (Lightning's monitoring callbacks)
    monitors_epoch_end = True

    def __init__(self, monitor: str | None = None, patience: int = 3, threshold: float = 0.0,
                 mode: str | None = None, check_finite: bool = True, *, early_stopping_patience: int | None = None,
                 early_stopping_threshold: float | None = None, min_delta: float | None = None,
                 verbose: bool = False, strict: bool = True, stopping_threshold: float | None = None,
                 divergence_threshold: float | None = None, check_on_train_epoch_end: bool | None = None,
                 log_rank_zero_only: bool = False) -> None:
        threshold = abs(min_delta) if min_delta is not None else threshold
        patience = early_stopping_patience if early_stopping_patience is not None else patience
        threshold = early_stopping_threshold if early_stopping_threshold is not None else threshold
        if not isinstance(patience, int) or patience < 1:
            raise ValueError(f"EarlyStopping patience={patience!r} must be an int >= 1.")
        if threshold < 0:
            raise ValueError(f"EarlyStopping threshold={threshold!r} must be >= 0.")
        if mode not in (None, "min", "max"):
            raise ValueError(f"EarlyStopping mode={mode!r} is not valid; choose 'min' or 'max'.")
        self.monitor, self.patience, self.threshold, self.mode = monitor, patience, threshold, mode
        self.check_finite, self.verbose, self.strict = check_finite, verbose, strict
        self.stopping_threshold, self.divergence_threshold = stopping_threshold, divergence_threshold
        self._check_on_train_epoch_end = check_on_train_epoch_end
        self.check_on_train_epoch_end = bool(check_on_train_epoch_end)
        self.log_rank_zero_only = log_rank_zero_only
        self._rank: int | None = None  # set at train start when several processes run
        self._monitor, self._mode = monitor or "", mode or "min"  # resolved at each check
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None  # Lightning's message of the stop (None: not stopped)
        self.best: float | None = None
        self.wait = 0
        self.stopped_epoch: float | None = None
        self.stopped_step: int | None = None
        self._training = False

    def on_train_start(self, fit: Any, module: Any) -> None:
        """A new run starts with no best value and no patience used; a resumed run keeps the state its checkpoint
        restored (Lightning's ``EarlyStopping`` continues its count)."""
        if not self.__dict__.pop("_restored", False):
            self._reset()
        self._training = True
        if self._check_on_train_epoch_end is None:  # nothing evaluates: check on the epoch's logged values
            self.check_on_train_epoch_end = getattr(fit.args, "eval_strategy", "no") == "no"
        world = getattr(fit, "world_size", 1)
        self._rank = getattr(fit, "global_rank", 0) if world > 1 else None

    def on_train_end(self, fit: Any, module: Any) -> None:
        self._training = False

    def _resolve(self, args: Any) -> tuple[str, str]:
        monitor = self.monitor or getattr(args, "metric_for_best_model", None) or "eval_loss"
        if not monitor.startswith(("eval_", "val_", "test_")) and self.monitor is None:
            monitor = f"eval_{monitor}"
        mode = self.mode
        if mode is None:
            gib = getattr(args, "greater_is_better", None)
            mode = ("max" if gib else "min") if gib is not None else ("min" if monitor.endswith("loss") else "max")
        return monitor, mode

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None,
                    **kwargs: Any) -> Any:
        """Compare the new value with the best; set ``control.should_training_stop`` when patience runs out.

        Raises:
            KeyError: the monitored metric is not among the evaluation metrics (names the ones present), with
                ``strict``.
        """
        if not self._training or self.check_on_train_epoch_end:
            return control  # a standalone validate() neither counts against patience nor needs the metric
        return self._check(args, state, control, metrics or {})

    def on_train_epoch_end(self, fit: Any, module: Any) -> None:
        if self.check_on_train_epoch_end:
            self._check(fit.args, fit.state, fit.control, dict(fit.callback_metrics))

    def _check(self, args: Any, state: Any, control: Any, metrics: dict[str, Any]) -> Any:
        if getattr(args, "fast_dev_run", False):  # Lightning's _should_skip_check: no checks in a debug pass
            return control
        monitor, mode = self._resolve(args)
        if monitor not in metrics and f"eval_{monitor}" in metrics:  # a self.log name of validation_step
            monitor = f"eval_{monitor}"
        if monitor not in metrics:
            if not self.strict:
                return control
            raise KeyError(f"EarlyStopping monitors {monitor!r}, which evaluation did not return; "
                           f"available: {sorted(metrics)}.")
        self._monitor, self._mode = monitor, mode
        stop, reason = self._evaluate_stopping_criteria(float(metrics[monitor]))
        if stop:  # record only stops this callback causes (not max_steps, not other callbacks)
            control.should_training_stop = True
            self.stopped_epoch, self.stopped_step = state.epoch, state.global_step
            self.stopping_reason_message = reason
        if reason and self.verbose and (self._rank is None or not self.log_rank_zero_only or self._rank == 0):
            log.info("%s%s", f"[rank: {self._rank}] " if self._rank is not None else "", reason)  # Lightning's
        return control

    def _evaluate_stopping_criteria(self, value: float) -> tuple[bool, str | None]:
        """``(stop, message)`` for the monitored ``value``, in Lightning's order and words (its
        ``_evaluate_stopping_criteria``); sets ``stopping_reason``, the best value and the patience used."""
        monitor, mode, best = self._monitor, self._mode, self.best
        better = (lambda a, b: a < b) if mode == "min" else (lambda a, b: a > b)
        sign = "<" if mode == "min" else ">"
        best_text = f"{best if best is not None else (math.inf if mode == 'min' else -math.inf):.3f}"
        if self.check_finite and not math.isfinite(value):
            self.stopping_reason = EarlyStoppingReason.NON_FINITE_METRIC
            return True, (f"Monitored metric {monitor} = {value} is not finite. Previous best value was {best_text}. "
                          "Signaling Trainer to stop.")
        if self.stopping_threshold is not None and better(value, self.stopping_threshold):
            self.stopping_reason = EarlyStoppingReason.STOPPING_THRESHOLD
            return True, (f"Stopping threshold reached: {monitor} = {value} {sign} {self.stopping_threshold}. "
                          "Signaling Trainer to stop.")
        if self.divergence_threshold is not None and better(-value, -self.divergence_threshold):
            self.stopping_reason = EarlyStoppingReason.DIVERGENCE_THRESHOLD
            return True, (f"Divergence threshold reached: {monitor} = {value} {sign} {self.divergence_threshold}. "
                          "Signaling Trainer to stop.")
        if best is None or (value < best - self.threshold if mode == "min" else value > best + self.threshold):
            self.best, self.wait = value, 0
            if best is None or not math.isfinite(best):
                return False, f"Metric {monitor} improved. New best score: {value:.3f}"
            return False, (f"Metric {monitor} improved by {abs(best - value):.3f} >= min_delta = {self.threshold}. "
                           f"New best score: {value:.3f}")
        self.wait += 1
        if self.wait >= self.patience:
            self.stopping_reason = EarlyStoppingReason.PATIENCE_EXHAUSTED
            return True, (f"Monitored metric {monitor} did not improve in the last {self.wait} records. "
                          f"Best score: {best_text}. Signaling Trainer to stop.")
        return False, None

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait, "stopped_epoch": self.stopped_epoch,
                "stopped_step": self.stopped_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for k, v in state_dict.items():
            setattr(self, k, v)
        self._restored = True  # the next on_train_start keeps it

    def _reset(self) -> None:
        """No best value, no patience used, not stopped."""
        self.best, self.wait, self.stopped_epoch, self.stopped_step = None, 0, None, None
        self.stopping_reason, self.stopping_reason_message = EarlyStoppingReason.NOT_STOPPED, None

