"""Progress bar (F-OBS-1) over ``tqdm``: loss, learning rate, speed and ETA; off with ``disable_tqdm``."""

from __future__ import annotations

from typing import Any

from taskfit.callbacks.base import Callback

_SPEED = ("_runtime", "_per_second")


class ProgressBar(Callback):
    """A ``tqdm`` bar over optimizer steps during ``fit`` and over batches during evaluation/prediction.

    The bar advances once per optimizer step; its postfix (loss, learning rate and values logged with
    ``prog_bar=True``) is refreshed on logging steps only, so it adds no host sync to other steps. Every
    evaluation's metrics join the postfix and are written as one line above the bar.
    Only rank zero draws. Mirrors HF's ``ProgressCallback`` / Lightning's ``TQDMProgressBar``.
    """

    def __init__(self) -> None:
        self._results = None
        self.train_bar = None
        self.eval_bar = None
        self._postfix: dict[str, Any] = {}

    def on_train_start(self, fit: Any, module: Any) -> None:
        self.on_train_end(fit, module)  # a bar left from an earlier run
        if fit.is_global_zero:
            from tqdm.auto import tqdm

            self._results = module._results
            self._postfix = {}
            self.train_bar = tqdm(total=fit.state.max_steps, initial=fit.state.global_step, desc="fit",
                                  dynamic_ncols=True, unit="step")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.train_bar is not None:
            self.train_bar.update(1)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if not logs or not state.is_world_process_zero:
            return
        # an evaluation's dict carries its <prefix>_runtime (names such as val_acc keep no eval_ prefix)
        evaluation = [k for k in logs if not k.endswith(_SPEED) and k != "epoch"] if any(
            k.endswith("_runtime") and k != "train_runtime" for k in logs) else []
        if evaluation:  # every evaluation: one line above the bar (or on its own), its values in the postfix
            from tqdm.auto import tqdm

            from taskfit.console import format_logs

            tqdm.write(format_logs(logs))
            if self.train_bar is not None:
                self._postfix.update({k: f"{logs[k]:.4g}" for k in evaluation if isinstance(logs[k], float)})
                self.train_bar.set_postfix(self._postfix, refresh=False)
        elif self.train_bar is not None and "loss" in logs:
            names = {"loss", "learning_rate"} | (self._results.prog_bar_names() if self._results else set())
            self._postfix.update({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in logs.items()
                                  if k in names or k.rsplit("_", 1)[0] in names})
            self.train_bar.set_postfix(self._postfix, refresh=False)

    def on_train_end(self, fit: Any, module: Any) -> None:
        if self.train_bar is not None:
            self.train_bar.close()
            self.train_bar = None

    def on_exception(self, fit: Any, module: Any, exception: BaseException) -> None:
        """Close the bars a failed run leaves open."""
        self._eval_end()
        self.on_train_end(fit, module)

    def _eval_start(self, fit: Any, module: Any, total: Any, desc: str) -> None:
        if fit.is_global_zero and total:
            from tqdm.auto import tqdm

            self.eval_bar = tqdm(total=total, desc=desc, leave=self.train_bar is None, dynamic_ncols=True,
                                 unit="batch")

    def _eval_step(self, *args: Any) -> None:
        if self.eval_bar is not None:
            self.eval_bar.update(1)

    def _eval_end(self, *args: Any) -> None:
        if self.eval_bar is not None:
            self.eval_bar.close()
            self.eval_bar = None

    def on_validation_epoch_start(self, fit: Any, module: Any) -> None:
        self._eval_start(fit, module, fit.num_eval_batches, "validate")

    def on_test_epoch_start(self, fit: Any, module: Any) -> None:
        self._eval_start(fit, module, fit.num_eval_batches, "test")

    def on_predict_epoch_start(self, fit: Any, module: Any) -> None:
        self._eval_start(fit, module, fit.num_eval_batches, "predict")

    on_validation_batch_end = on_test_batch_end = on_predict_batch_end = _eval_step  # type: ignore[assignment]
    on_validation_epoch_end = on_test_epoch_end = on_predict_epoch_end = _eval_end  # type: ignore[assignment]
