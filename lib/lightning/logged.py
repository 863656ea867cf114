"""What the Lightning door's ``trainer.logged_metrics``, ``trainer.callback_metrics`` and loggers receive: only what
``self.log`` wrote (the run's own loss, learning rate, speed and summary rows stay out), as tensors, with
``epoch`` added for the loggers only, at Lightning's logger step (``_batches_that_stepped``)."""

from __future__ import annotations

from typing import Any

import torch

from taskfit.callbacks.base import Callback
from taskfit.lightning.progress_metrics import ProgressBarNames
from taskfit.loggers.logger import Logger, lightning_hyperparams

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


def loggers_here(trainer: Any) -> list[Any]:
    """The loggers this process calls: every logger on every process, as Lightning (a logger of yours sees each
    process's values), except taskfit's own loggers (:class:`taskfit.loggers.logger.Logger` subclasses), which
    create their files on their first call and are called on global rank 0 only, as Lightning's own loggers write
    on rank 0 only."""
    return [lg for lg in trainer.loggers if trainer.is_global_zero or not isinstance(lg, Logger)]


def write_row(trainer: Any, scalars: dict[str, Any], step: int) -> None:
    """``logger.log_metrics(metrics=scalars, step=step)`` (by keyword, as Lightning calls it) and ``logger.save()``
    where a logger has it, for :func:`loggers_here` (Lightning's ``_LoggerConnector.log_metrics``)."""
    for lg in loggers_here(trainer):
        lg.log_metrics(metrics=scalars, step=step)
        _call_if_present(lg, "save")


def _call_if_present(logger: Any, name: str, *args: Any) -> None:
    """A method of Lightning's ``Logger`` that taskfit's loggers do not define (``save``, ``log_graph``)."""
    fn = getattr(logger, name, None)
    if callable(fn):
        fn(*args)


def send_row(trainer: Any, row: dict[str, Any]) -> None:
    """``row`` into ``callback_metrics`` and ``logged_metrics`` (as tensors, without an ``epoch`` the module did not
    log) and to the loggers (:func:`loggers_here`) with ``epoch`` (``current_epoch``, unless logged) at
    :func:`logger_step` (Lightning's ``_LoggerConnector.log_metrics``)."""
    trainer.callback_metrics.update(row)
    trainer.logged_metrics.update(row)
    if trainer.args.fast_dev_run or not trainer.loggers:
        return
    scalars = {k: float(v) if isinstance(v, torch.Tensor) else v for k, v in row.items()}
    scalars.setdefault("epoch", trainer.current_epoch)
    write_row(trainer, scalars, logger_step(trainer))


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
    for cb in trainer._internal_callbacks:
        if isinstance(cb, ProgressBarNames):
            cb.eval_steps.clear()
            cb.names.clear()


def finalize_loggers(trainer: Any) -> None:
    """``finalize("success")`` of the loggers this process calls (:func:`loggers_here`; Lightning's
    ``_call_teardown_hook``; a logger reopens its files on its next write)."""
    for lg in loggers_here(trainer):
        lg.finalize("success")


def _step_values(results: Any, dataloader_idx: int | None = None) -> dict[str, Any]:
    """The latest ``on_step`` values of ``results`` logged with ``logger=True`` (``name``, or ``name_step`` when
    also ``on_epoch``), as stored (tensors stay on their device: no host sync); with ``dataloader_idx``, only those
    of that evaluation loader (and those logged outside any)."""
    out = {}
    for e in getattr(results, "values", {}).values():
        if dataloader_idx is not None and e.dataloader_idx not in (None, dataloader_idx):
            continue
        if e.on_step and e.logger and e.last is not None:
            out[e.key("_step" if e.on_epoch else "")] = e.last
    return out


def start_loggers(trainer: Any, module: Any) -> None:
    """Lightning's ``_log_hyperparams`` as a trainer method starts: each logger (:func:`loggers_here`) gets
    ``log_hyperparams`` (:func:`lightning_hyperparams`, when there are any), ``log_graph(module)`` and ``save()``
    where it has them; nothing under ``fast_dev_run``."""
    if trainer.args.fast_dev_run:
        return
    params = lightning_hyperparams(module, getattr(trainer, "datamodule", None))
    for lg in loggers_here(trainer):
        if params is not None:
            lg.log_hyperparams(params)
        _call_if_present(lg, "log_graph", module)
        _call_if_present(lg, "save")


class LoggedMetrics(Callback):
    """Keeps ``trainer.logged_metrics`` as Lightning does: after every training and evaluation batch the latest
    ``on_step`` values logged with ``logger=True`` (whatever ``log_every_n_steps`` says), not during the sanity
    check; epoch values arrive with their log rows (:func:`send_row`). An evaluation batch's step values also go to
    the loggers (``name_step``, or ``name`` when not ``on_epoch``; no ``epoch`` key) at Lightning's evaluation step:
    the batches of that loader seen so far in this trainer method (during ``fit`` counted over all its
    validations). As each trainer method starts (``fit``, ``validate``, ``test``, ``predict``), the loggers get
    Lightning's ``_log_hyperparams`` calls (:func:`start_loggers`: here after the module's ``on_fit_start``; for
    ``validate``/``test``/``predict`` :func:`taskfit.lightning.eval_stage.eval_stage` makes them after set-up)."""

    monitors_epoch_end = True  # its on_train_epoch_end runs after the module's
    hooks_after_module = ("on_fit_start",)  # Lightning's _log_hyperparams follows the module's on_fit_start

    def __init__(self) -> None:
        #: the evaluation loader that logged each name without a ``/dataloader_idx_N`` suffix
        #: (``add_dataloader_idx=False``): Lightning returns it in that loader's result only
        self.loader_of: dict[str, int] = {}
        #: evaluation batches seen per (trainer method, stage, loader): the loggers' step of their step values
        self.eval_seen: dict[tuple[str, str, int], int] = {}

    def on_fit_start(self, fit: Any, module: Any) -> None:
        self.eval_seen = {}
        start_loggers(fit, module)

    def _note(self, trainer: Any, module: Any) -> None:
        if not getattr(trainer, "sanity_checking", False):
            trainer.logged_metrics.update(_step_values(getattr(module, "_results", None)))

    def _note_eval(self, trainer: Any, module: Any, stage: str, dataloader_idx: int) -> None:
        self._note(trainer, module)
        results = getattr(module, "_results", None)
        for e in getattr(results, "values", {}).values():
            if e.dataloader_idx is not None and not e.suffix:
                for key in (e.key(), e.key("_epoch")):
                    self.loader_of[key] = e.dataloader_idx
        if getattr(trainer, "sanity_checking", False):
            return
        fn = str(getattr(trainer.state.fn, "value", trainer.state.fn))
        seen = self.eval_seen.get((fn, stage, dataloader_idx), 0)
        self.eval_seen[(fn, stage, dataloader_idx)] = seen + 1
        if trainer.args.fast_dev_run or not trainer.loggers:
            return
        row = {k: float(v) for k, v in _step_values(results, dataloader_idx).items()}
        if row:  # Lightning's update_eval_step_metrics: the step values only, at the loader's batch count
            write_row(trainer, row, seen)

    def on_validation_start(self, fit: Any, module: Any) -> None:
        self._eval_start(fit, module)

    def on_test_start(self, fit: Any, module: Any) -> None:
        self._eval_start(fit, module)

    def _eval_start(self, trainer: Any, module: Any) -> None:
        self.loader_of = {}
        if str(getattr(trainer.state.fn, "value", trainer.state.fn)) != "fit":  # validate/test: counted anew
            self.eval_seen = {}  # (their loggers started in eval_stage, before the start hooks, as Lightning)

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
        self._note_eval(fit, module, "validation", dataloader_idx)

    def on_test_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        self._note_eval(fit, module, "test", dataloader_idx)
