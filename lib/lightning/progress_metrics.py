"""``trainer.progress_bar_metrics`` of the Lightning door: which ``self.log`` names were logged with
``prog_bar=True`` (under Lightning's forked names), their values read from ``trainer.callback_metrics``."""

from __future__ import annotations

from typing import Any

from taskfit.callbacks.base import Callback


def prog_bar_keys(results: Any) -> set[str]:
    """The progress-bar names of a ``ResultCollection``'s values, as Lightning forks them: ``name`` for a value
    logged on the step or on the epoch only, ``name_step`` and ``name_epoch`` for one logged on both."""
    keys: set[str] = set()
    # an evaluation's epoch-only names are dropped by its reset before the callbacks' on_validation_end
    for e in [*getattr(results, "values", {}).values(), *getattr(results, "dropped", ())]:
        if e.prog_bar:
            keys |= {e.key("_step"), e.key("_epoch")} if e.on_step and e.on_epoch else {e.key()}
    return keys


class ProgressBarNames(Callback):
    """Collects the ``prog_bar=True`` names the module logs during training and evaluation (after the module's own
    epoch-end hooks: ``monitors_epoch_end``), for :meth:`metrics`."""

    monitors_epoch_end = True  # runs after the module's on_train_epoch_end, so it sees what that logs

    def __init__(self) -> None:
        self.names: set[str] = set()
        # evaluation step values logged with prog_bar=True: Lightning's bar shows them, its callback_metrics not
        self.eval_steps: dict[str, Any] = {}

    def _note_eval_step(self, trainer: Any, module: Any) -> None:
        if getattr(trainer, "sanity_checking", False):
            return
        for e in getattr(getattr(module, "_results", None), "values", {}).values():
            if e.prog_bar and e.on_step and e.last is not None:
                self.eval_steps[e.key("_step" if e.on_epoch else "")] = e.last

    def on_validation_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self._note_eval_step(fit, module)

    def on_test_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        self._note_eval_step(fit, module)

    def _note(self, module: Any) -> None:
        self.names |= prog_bar_keys(getattr(module, "_results", None))

    def on_train_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._note(module)

    def on_train_epoch_end(self, fit: Any, module: Any) -> None:
        self._note(module)

    def on_validation_epoch_end(self, fit: Any, module: Any) -> None:
        self._note(module)

    def on_test_epoch_end(self, fit: Any, module: Any) -> None:
        self._note(module)

    # after the module's own on_*_epoch_end (the callbacks' run first), which may log with prog_bar=True
    def on_validation_end(self, fit: Any, module: Any) -> None:
        self._note(module)

    def on_test_end(self, fit: Any, module: Any) -> None:
        self._note(module)

    def metrics(self, callback_metrics: dict[str, Any]) -> dict[str, Any]:
        """Lightning's ``trainer.progress_bar_metrics``: ``{name: value}`` of the noted names present in
        ``callback_metrics`` (the latest values), as floats (Lightning converts them for the bar)."""
        out = {k: float(v) for k, v in self.eval_steps.items()}
        out.update({k: float(v) for k, v in callback_metrics.items() if k in self.names})
        return out
