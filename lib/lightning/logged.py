"""What the Lightning door's ``trainer.logged_metrics``, ``trainer.callback_metrics`` and loggers receive: only what
``self.log`` wrote (the run's own loss, learning rate, speed and summary rows stay out), as tensors, with
``epoch`` added for the loggers only, at Lightning's logger step (``_batches_that_stepped``)."""

from __future__ import annotations

from typing import Any

import torch

from taskfit.callbacks.base import Callback
from taskfit.lightning.progress_metrics import ProgressBarNames

#: the ends of the run's own names (speed and timing rows of an evaluation, the end-of-run summary)
_RUN_SUFFIXES = ("_runtime", "_samples_per_second", "_steps_per_second", "_model_preparation_time")


def as_tensor(value: Any) -> Any:
    """``value`` as Lightning keeps a logged value: a tensor (numbers become float32 0-dim tensors, as Lightning's
    ``ResultCollection`` makes them); anything else as given."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value))
    return value


class MetricDict(dict):
    """A ``dict`` whose values are stored as tensors (:func:`as_tensor`): Lightning's ``callback_metrics`` and
    ``logged_metrics`` hold tensors whoever writes them (the loops write floats after their host sync)."""

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, as_tensor(value))

    def update(self, *args: Any, **kwargs: Any) -> None:
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]


def is_run_value(key: str) -> bool:
    """Whether ``key`` is one of the run's own rows (``_runtime``, ``_samples_per_second``... of an evaluation,
    ``total_flos``; a loader's own under its ``/dataloader_idx_N`` suffix too), which Lightning does not log."""
    key = key.split("/dataloader_idx_", 1)[0]
    return key == "total_flos" or key.endswith(_RUN_SUFFIXES)


def logger_step(trainer: Any) -> int:
    """Lightning's logger step (``fit_loop.epoch_loop._batches_that_stepped``): during ``fit`` the optimizer steps
    before the current one (the row of step 1 is written at step 0, an epoch's row at its last batch's step);
    in ``validate``/``test`` the steps taken so far."""
    step = trainer.global_step
    fn = getattr(trainer.state.fn, "value", trainer.state.fn)
    return max(step - 1, 0) if fn == "fit" else step


def per_loader(metrics: dict[str, Any], n: int, loader_of: dict[str, int]) -> list[dict[str, float]]:
    """Fit's flat evaluation result as Lightning's: one dict per dataloader of the logged values (keys ending in
    ``/dataloader_idx_i`` go to dict ``i``, names a loader logged without the suffix to that loader's: ``loader_of``,
    the others to every dict), without the run's timing rows and ``epoch``."""
    # the empty metric_key_prefix still joins with "_": strip it (Lightning returns names as logged)
    logged = {k[1:] if k.startswith("_") else k: float(v) for k, v in metrics.items()
              if k != "epoch" and not is_run_value(k)}
    # the module's own *_dataloader may return several loaders: their suffixes tell how many
    n = max([n] + [int(k.rsplit("/dataloader_idx_", 1)[1]) + 1 for k in logged
                   if k.rsplit("/dataloader_idx_", 1)[-1].isdigit() and "/dataloader_idx_" in k])
    if n <= 1:
        return [logged]
    out: list[dict[str, float]] = [{} for _ in range(n)]
    for k, v in logged.items():
        idx = k.rsplit("/dataloader_idx_", 1)
        own = [int(idx[1])] if len(idx) == 2 and idx[1].isdigit() else [loader_of[k]] if k in loader_of else None
        for i in own if own is not None else range(n):
            out[i][k] = v
    return out


def lightning_row(trainer: Any, logs: dict[str, Any]) -> dict[str, Any] | None:
    """The part of a log row Lightning's loggers receive: ``logs`` without the run's own values; None for the
    end-of-run summary row (``train_runtime``: Lightning writes none) or when nothing is left."""
    if "train_runtime" in logs:
        return None
    row = {k: v for k, v in logs.items() if not is_run_value(k)}
    return row or None


def send_row(trainer: Any, row: dict[str, Any]) -> None:
    """``row`` into ``callback_metrics`` and ``logged_metrics`` (as tensors, without an ``epoch`` the module did not
    log) and to every logger with ``epoch`` (``current_epoch``, unless logged) at :func:`logger_step`, rank 0 only
    (Lightning's ``_LoggerConnector.log_metrics``)."""
    trainer.callback_metrics.update(row)
    trainer.logged_metrics.update(row)
    if not trainer.is_global_zero or trainer.args.fast_dev_run or not trainer.loggers:
        return
    scalars = {k: float(v) if isinstance(v, torch.Tensor) else v for k, v in row.items()}
    scalars.setdefault("epoch", trainer.current_epoch)
    step = logger_step(trainer)
    for lg in trainer.loggers:
        lg.log_metrics(metrics=scalars, step=step)  # by keyword, as Lightning calls it


def attach_logging(callbacks: list[Any], module: Any) -> None:
    """Give every callback the module's ``log`` and ``log_dict`` as its own (Lightning's
    ``_CallbackConnector._attach_model_logging_functions``, at the start of every trainer method): a callback may
    call ``self.log(...)``."""
    if module is None or not hasattr(module, "log"):
        return
    for cb in callbacks:
        cb.log, cb.log_dict = module.log, module.log_dict


def reset_metrics(trainer: Any) -> None:
    """Empty ``callback_metrics``, ``logged_metrics`` and the progress-bar values at the start of a trainer method
    (Lightning's ``_LoggerConnector.reset_metrics`` in ``Trainer._run``)."""
    trainer.callback_metrics.clear()
    trainer.logged_metrics.clear()
    for cb in trainer.callbacks:
        if isinstance(cb, ProgressBarNames):
            cb.eval_steps.clear()
            cb.names.clear()


def finalize_loggers(trainer: Any) -> None:
    """``finalize("success")`` of every logger on global rank 0 (Lightning's ``_call_teardown_hook``; a logger
    reopens its files on its next write)."""
    if trainer.is_global_zero:
        for lg in trainer.loggers:
            lg.finalize("success")


def _step_values(results: Any) -> dict[str, Any]:
    """The latest ``on_step`` values of ``results`` logged with ``logger=True`` (``name``, or ``name_step`` when
    also ``on_epoch``), as stored (tensors stay on their device: no host sync)."""
    out = {}
    for e in getattr(results, "values", {}).values():
        if e.on_step and e.logger and e.last is not None:
            out[e.key("_step" if e.on_epoch else "")] = e.last
    return out


class LoggedMetrics(Callback):
    """Keeps ``trainer.logged_metrics`` as Lightning does: after every training and evaluation batch the latest
    ``on_step`` values logged with ``logger=True`` (whatever ``log_every_n_steps`` says; evaluation step values
    too, which reach no logger here), not during the sanity check; epoch values arrive with their log rows
    (:func:`send_row`)."""

    monitors_epoch_end = True  # its on_train_epoch_end runs after the module's

    def __init__(self) -> None:
        #: the evaluation loader that logged each name without a ``/dataloader_idx_N`` suffix
        #: (``add_dataloader_idx=False``): Lightning returns it in that loader's result only
        self.loader_of: dict[str, int] = {}

    def _note(self, trainer: Any, module: Any) -> None:
        if not getattr(trainer, "sanity_checking", False):
            trainer.logged_metrics.update(_step_values(getattr(module, "_results", None)))

    def _note_eval(self, trainer: Any, module: Any) -> None:
        self._note(trainer, module)
        for e in getattr(getattr(module, "_results", None), "values", {}).values():
            if e.dataloader_idx is not None and not e.suffix:
                for key in (e.key(), e.key("_epoch")):
                    self.loader_of[key] = e.dataloader_idx

    def on_validation_start(self, fit: Any, module: Any) -> None:
        self.loader_of = {}

    def on_test_start(self, fit: Any, module: Any) -> None:
        self.loader_of = {}

    def _note_training(self, trainer: Any, module: Any) -> None:
        """Also the step values logged in ``on_train_batch_end`` hooks (after the loop wrote the step's) into
        ``callback_metrics``, as Lightning's ``on_batch_end`` does after the hooks; on several processes the
        ``sync_dist`` step values reduced over them every step (Lightning's per-step collective; the loop itself
        reduces them only on logging steps)."""
        self._note(trainer, module)
        results = getattr(module, "_results", None)
        if results is None or not results.values:
            return
        results.update_callback_metrics(trainer.callback_metrics, synced_too=trainer.world_size == 1)
        if trainer.world_size > 1 and not getattr(trainer, "sanity_checking", False):
            for e in list(results.values.values()):  # the same order on every process: matched collectives
                if e.sync_dist and e.on_step and e.last is not None:
                    value = results.synced_last(e)
                    trainer.callback_metrics[e.key()] = value
                    if e.on_epoch:
                        trainer.callback_metrics[e.key("_step")] = value
                    if e.logger:
                        trainer.logged_metrics[e.key("_step" if e.on_epoch else "")] = value

    def on_train_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._note_training(fit, module)

    def on_train_epoch_end(self, fit: Any, module: Any) -> None:
        self._note_training(fit, module)  # the epoch values are written after it (the loop)

    def on_validation_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self._note_eval(fit, module)

    def on_test_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        self._note_eval(fit, module)
