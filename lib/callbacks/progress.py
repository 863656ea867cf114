"""Progress bar (F-OBS-1) over ``tqdm``: epoch, step, loss, learning rate, ``prog_bar=True`` values and the
latest evaluation's values; off with ``disable_tqdm``. :class:`ProgressBar` also holds what every bar shows
(``metrics``); :class:`taskfit.callbacks.rich_progress.RichProgressBar` draws the same values with ``rich``."""

from __future__ import annotations

import os
from typing import Any

from taskfit.callbacks.base import Callback

_SPEED = ("_runtime", "_per_second", "_model_preparation_time")


def _fmt(value: Any) -> Any:
    return f"{value:.4g}" if isinstance(value, float) else value


class ProgressBar(Callback):
    """A ``tqdm`` bar over optimizer steps during ``fit`` (described ``Epoch N``) and over batches during
    evaluation/prediction.

    The bar advances once per optimizer step; its postfix (``step``, ``loss``, ``learning_rate``, values logged
    with ``prog_bar=True`` and every evaluation's values) is refreshed on logging steps only, so it adds no host
    sync to other steps. Every evaluation's metrics are also written as one line above the bar. Only rank zero
    draws. Mirrors HF's ``ProgressCallback`` / Lightning's ``TQDMProgressBar``; :attr:`metrics` is what the bar
    shows (Lightning's ``get_metrics``). Giving a progress bar in ``callbacks`` replaces the default one.
    """

    def __init__(self) -> None:
        self._results = None
        self.train_bar: Any = None
        self.eval_bar: Any = None
        self._postfix: dict[str, Any] = {}
        self._epoch = 0

    @property
    def metrics(self) -> dict[str, Any]:
        """What the bar shows after its description: ``step``, then loss, learning rate, ``prog_bar`` values and
        the latest evaluation values (formatted to 4 significant digits)."""
        return dict(self._postfix)

    @property
    def trainer(self) -> Any:
        """The trainer (``Fit``) running this bar since its ``on_train_start`` (Lightning's ``ProgressBar.trainer``).

        Raises:
            TypeError: the bar is not attached to a run yet (Lightning's message).
        """
        trainer = getattr(self, "_trainer", None)
        if trainer is None:
            raise TypeError(f"The `{type(self).__name__}._trainer` reference has not been set yet.")
        return trainer

    @property
    def total_val_batches(self) -> int | float:
        """Lightning's ``ProgressBar.total_val_batches``: the validation batches of the current training epoch
        (the sum over loaders of the trainer's ``num_val_batches``), 0 in an epoch that does not validate
        (``check_val_every_n_epoch``) or before training starts."""
        trainer = getattr(self, "_trainer", None)
        counts = getattr(trainer, "num_val_batches", None)
        if not counts:
            return 0
        every = getattr(trainer, "check_val_every_n_epoch", 1)
        if every and (trainer.current_epoch + 1) % every:
            return 0
        return sum(counts)

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        """Lightning's ``ProgressBar.get_metrics``: the trainer's ``progress_bar_metrics`` (its ``prog_bar=True``
        values) with ``v_num``, the logger's version, first when there is one; :attr:`metrics` under a ``Fit``."""
        pbar = getattr(trainer, "progress_bar_metrics", None)
        if pbar is None:
            return self.metrics
        loggers = getattr(trainer, "loggers", None) or []
        # Lightning's _version: one logger's version, or the distinct versions of several joined by "_"
        version = loggers[0].version if len(loggers) == 1 else "_".join(
            dict.fromkeys(str(lg.version) for lg in loggers)) if loggers else None
        standard = {} if version in ("", None) else {"v_num": version[-4:] if isinstance(version, str) else version}
        return {**standard, **pbar}

    # drawing (RichProgressBar overrides these) ------------------------------------------------------------------
    def _open_train(self, total: int, initial: int) -> None:
        from tqdm.auto import tqdm

        self.train_bar = tqdm(total=total, initial=initial, desc=f"Epoch {self._epoch}", dynamic_ncols=True,
                              unit="step")

    def _describe_epoch(self) -> None:
        self.train_bar.set_description(f"Epoch {self._epoch}", refresh=False)

    def _advance_train(self) -> None:
        self.train_bar.set_postfix(self._postfix, refresh=False)
        self.train_bar.update(1)

    def _show(self) -> None:
        self.train_bar.set_postfix(self._postfix, refresh=False)

    def _close_train(self) -> None:
        self.train_bar.set_postfix(self._postfix, refresh=False)
        self.train_bar.close()

    def _write(self, line: str) -> None:
        from tqdm.auto import tqdm

        tqdm.write(line)

    def _open_eval(self, total: int, desc: str) -> None:
        from tqdm.auto import tqdm

        self.eval_bar = tqdm(total=total, desc=desc, leave=self.train_bar is None, dynamic_ncols=True,
                             unit="batch")

    def _advance_eval(self) -> None:
        self.eval_bar.update(1)

    def _close_eval(self) -> None:
        self.eval_bar.close()

    # hooks ----------------------------------------------------------------------------------------------------
    def on_train_start(self, fit: Any, module: Any) -> None:
        self._trainer = fit  # for total_val_batches (Lightning's bar reads its trainer)
        ProgressBar._end_train(self)  # a bar left from an earlier run (not a subclass's on_train_end hook)
        if fit.is_global_zero:
            self._results = module._results
            self._postfix = {"step": fit.state.global_step}
            self._epoch = fit.state.current_epoch
            self._open_train(fit.state.max_steps, fit.state.global_step)

    def on_train_epoch_start(self, fit: Any, module: Any) -> None:
        if self.train_bar is not None and fit.state.current_epoch != self._epoch:
            self._epoch = fit.state.current_epoch
            self._describe_epoch()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.train_bar is not None:
            self._postfix["step"] = state.global_step  # a host int: no sync
            self._advance_train()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if not logs or not state.is_world_process_zero:
            return
        # an evaluation's dict carries its <prefix>_runtime (names such as val_acc keep no eval_ prefix)
        evaluation = [k for k in logs if not k.endswith(_SPEED) and k != "epoch"] if any(
            k.endswith("_runtime") and k != "train_runtime" for k in logs) else []
        if evaluation:  # every evaluation: one line above the bar (or on its own), its values in the postfix
            from taskfit.callbacks.console import format_logs

            self._write(format_logs(logs))
            if self.train_bar is not None:
                self._postfix.update({k: _fmt(logs[k]) for k in evaluation if isinstance(logs[k], float)})
                self._show()
        elif self.train_bar is not None and "loss" in logs:
            names = {"loss", "learning_rate"} | (self._results.prog_bar_names() if self._results else set())
            self._postfix.update({k: _fmt(v) for k, v in logs.items()
                                  if k in names or k.rsplit("_", 1)[0] in names})
            self._show()

    def on_train_end(self, fit: Any, module: Any) -> None:
        self._end_train()

    def _end_train(self) -> None:
        if self.train_bar is not None:
            self._close_train()
            self.train_bar = None

    def on_exception(self, fit: Any, module: Any, exception: BaseException) -> None:
        """Close the bars a failed run leaves open."""
        self._eval_end()
        ProgressBar._end_train(self)

    def _eval_start(self, fit: Any, module: Any, total: Any, desc: str) -> None:
        if fit.is_global_zero and total:
            self._open_eval(total, desc)

    def _eval_step(self, *args: Any) -> None:
        if self.eval_bar is not None:
            self._advance_eval()

    def _eval_end(self, *args: Any) -> None:
        if self.eval_bar is not None:
            self._close_eval()
            self.eval_bar = None

    def on_validation_epoch_start(self, fit: Any, module: Any) -> None:
        self._eval_start(fit, module, fit.num_eval_batches, "Validation")

    def on_test_epoch_start(self, fit: Any, module: Any) -> None:
        self._eval_start(fit, module, fit.num_eval_batches, "Testing")

    def on_predict_epoch_start(self, fit: Any, module: Any) -> None:
        self._eval_start(fit, module, fit.num_eval_batches, "Predicting")

    on_validation_batch_end = on_test_batch_end = on_predict_batch_end = _eval_step  # type: ignore[assignment]
    on_validation_epoch_end = on_test_epoch_end = on_predict_epoch_end = _eval_end  # type: ignore[assignment]


class TQDMProgressBar(ProgressBar):
    """:class:`ProgressBar` with Lightning's ``TQDMProgressBar`` constructor.

    Args:
        refresh_rate (int): 0 draws no bar (Lightning: disabled); any other value draws it (the bar refreshes on
            logging steps, so no value adds host syncs). As Lightning's, at least ``TQDM_MINITERS`` when that
            environment variable is set, and 20 in place of 1 on Google Colab (``COLAB_GPU`` set).
        process_position (int): the bar's line (``tqdm(position=...)``), for several bars at once.
        leave (bool): keep the finished epoch's bar on screen.

    Raises:
        ValueError: a negative ``refresh_rate`` or ``process_position``.
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False) -> None:
        for name, value in (("refresh_rate", refresh_rate), ("process_position", process_position)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"TQDMProgressBar({name}={value!r}): expected an int >= 0.")
        super().__init__()
        self.refresh_rate = _resolve_refresh_rate(refresh_rate)
        self.process_position, self.leave = process_position, leave

    @property
    def is_disabled(self) -> bool:
        """True with ``refresh_rate=0`` (Lightning's ``is_disabled``)."""
        return self.refresh_rate == 0

    def _open_train(self, total: int, initial: int) -> None:
        from tqdm.auto import tqdm

        self.train_bar = tqdm(total=total, initial=initial, desc=f"Epoch {self._epoch}", dynamic_ncols=True,
                              unit="step", position=self.process_position, leave=self.leave,
                              disable=self.is_disabled)

    def _open_eval(self, total: int, desc: str) -> None:
        from tqdm.auto import tqdm

        self.eval_bar = tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True,
                             position=self.process_position + 1, disable=self.is_disabled)


def _resolve_refresh_rate(refresh_rate: int) -> int:
    """Lightning's ``TQDMProgressBar._resolve_refresh_rate``: 20 for the default 1 on Google Colab (``COLAB_GPU``
    set: faster refreshes crash there), at least ``TQDM_MINITERS`` when that environment variable is set."""
    if os.getenv("COLAB_GPU") and refresh_rate == 1:
        return 20
    if "TQDM_MINITERS" in os.environ:
        return max(int(os.environ["TQDM_MINITERS"]), refresh_rate)
    return refresh_rate
