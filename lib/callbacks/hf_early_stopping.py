"""HF's ``EarlyStoppingCallback`` (F-HF-1): the signature, attributes and checks of
``transformers.EarlyStoppingCallback``, for scripts written against ``transformers.Trainer``. taskfit's own
Lightning-style :class:`~taskfit.callbacks.early_stopping.EarlyStopping` (a ``monitor``, ``mode``, thresholds) is
a different class under its own name."""

from __future__ import annotations

import logging
from typing import Any

from taskfit.callbacks.base import Callback
from taskfit.metrics import metric_key

log = logging.getLogger("taskfit")


class EarlyStoppingCallback(Callback):
    """Stop training when ``metric_for_best_model`` has not improved for ``early_stopping_patience`` evaluations
    (mirrors ``transformers.EarlyStoppingCallback``, an ``ExportableState``: its ``state()`` is written to
    ``trainer_state.json`` ``stateful_callbacks`` and restored with ``restore_callback_states_from_checkpoint``).

    The comparison is HF's: with ``state.best_metric`` (the best value before this evaluation, recorded by the
    run after ``on_evaluate`` when ``metric_for_best_model`` is set) and ``args.greater_is_better``; an
    evaluation improves when it is better by more than ``early_stopping_threshold`` (absolute).

    Args:
        early_stopping_patience (int): evaluations without improvement before stopping.
        early_stopping_threshold (float | None): minimum absolute improvement (default 0.0).

    Attributes:
        early_stopping_patience_counter (int): evaluations in a row without improvement.

    Raises (at the start of training, as HF's assertions):
        AssertionError: ``metric_for_best_model`` is None, or ``eval_strategy`` is ``"no"``.
    """

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float | None = 0.0) -> None:
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = early_stopping_threshold
        self.early_stopping_patience_counter = 0

    def check_metric_value(self, args: Any, state: Any, control: Any, metric_value: float) -> None:
        """Reset the counter when ``metric_value`` beats ``state.best_metric`` by more than the threshold (or there
        is no best yet), else count one more evaluation without improvement (HF's method of this name)."""
        best = state.best_metric
        better = best is not None and (metric_value > best if args.greater_is_better else metric_value < best)
        if best is None or (better and abs(metric_value - best) > (self.early_stopping_threshold or 0.0)):
            self.early_stopping_patience_counter = 0
        else:
            self.early_stopping_patience_counter += 1

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not args.load_best_model_at_end:
            log.warning("Using EarlyStoppingCallback without load_best_model_at_end=True. "
                        "Once training is finished, the best model will not be loaded automatically.")
        assert args.metric_for_best_model is not None, (
            "EarlyStoppingCallback requires metric_for_best_model to be defined")
        assert str(args.eval_strategy) != "no", "EarlyStoppingCallback requires IntervalStrategy of steps or epoch"

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None,
                    **kwargs: Any) -> None:
        if args.metric_for_best_model is None:  # a standalone evaluate(): nothing to watch
            return
        key = metric_key(args.metric_for_best_model, "eval")  # HF's eval_ prefix; the key the best metric uses
        value = (metrics or {}).get(key)
        if value is None:
            log.warning("early stopping required metric_for_best_model, but did not find %s so early stopping "
                        "is disabled", key)
            return
        self.check_metric_value(args, state, control, value)
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True

    def state(self) -> dict[str, Any]:
        """HF ``ExportableState.state()``: the constructor's ``args`` and the ``attributes`` to restore."""
        return {"args": {"early_stopping_patience": self.early_stopping_patience,
                         "early_stopping_threshold": self.early_stopping_threshold},
                "attributes": {"early_stopping_patience_counter": self.early_stopping_patience_counter}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "EarlyStoppingCallback":
        """A callback built from :meth:`state` output (HF ``ExportableState.from_state``)."""
        instance = cls(**state["args"])
        for k, v in state.get("attributes", {}).items():
            setattr(instance, k, v)
        return instance
