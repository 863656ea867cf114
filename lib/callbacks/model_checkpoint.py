"""Checkpoints named from a template, kept by a monitored value (mirrors Lightning's ``ModelCheckpoint``)."""

from __future__ import annotations

import os

import math
import re
import time
from typing import Any

from taskfit.callbacks.base import Callback

_GROUP = re.compile(r"(\{.*?)[:}]")


class ModelCheckpoint(Callback):
    """Save taskfit checkpoint folders (manifest, exact resume) into ``dirpath`` and keep the ``save_top_k`` best
    by ``monitor``. Mirrors ``lightning.pytorch.callbacks.ModelCheckpoint``; the files are taskfit's checkpoint
    folders, so ``fit(..., resume_from_checkpoint=ckpt.best_model_path)`` continues exactly from one.

    Args:
        dirpath (str | os.PathLike | None): folder of the checkpoints (a local path or fsspec URL); None:
            ``output_dir/checkpoints``.
        filename (str | None): folder name template, e.g. ``"{epoch}-{step}-{val_loss:.2f}"`` -> ``epoch=0-step=
            10-val_loss=0.52`` (with ``auto_insert_metric_name``); fields: ``epoch`` (0-based), ``step`` (optimizer
            steps done) and any logged metric. None: ``"{epoch}-{step}"``.
        monitor (str | None): metric to rank by (a key of ``fit.callback_metrics``, e.g. ``"eval_loss"`` or a
            ``self.log`` name of ``validation_step``, found as ``eval_{name}``); None keeps the latest ``save_top_k``.
        mode (str): ``"min"`` or ``"max"``.
        save_top_k (int): how many to keep; -1 all, 0 none (only ``save_last``).
        save_last (bool): also write ``last`` (a full checkpoint folder) at every save.
        every_n_train_steps (int | None): save every N optimizer steps.
        every_n_epochs (int | None): save every N epochs (default 1 when no other trigger is set).
        train_time_interval (datetime.timedelta | float | None): save when this much time (seconds) has passed.
        save_on_train_epoch_end (bool | None): epoch saves at the end of the training epoch (True) or after
            validation (False); None: after validation when the run evaluates, else at the epoch end.
        auto_insert_metric_name (bool): write ``name=value`` for every template field.

    Attributes:
        best_model_path (str), best_model_score (float | None), last_model_path (str),
        best_k_models (dict[str, float]): kept checkpoints by score; all are in :meth:`state_dict`.

    Raises:
        ValueError: bad ``mode``, ``save_top_k`` < -1, ``save_top_k`` > 1 without ``monitor``, negative or
            several exclusive triggers.
    """

    CHECKPOINT_NAME_LAST = "last"

    def __init__(self, dirpath: str | os.PathLike | None = None, filename: str | None = None,
                 monitor: str | None = None,
                 verbose: bool = False, save_last: bool | None = None, save_top_k: int = 1, mode: str = "min",
                 auto_insert_metric_name: bool = True, every_n_train_steps: int | None = None,
                 train_time_interval: Any = None, every_n_epochs: int | None = None,
                 save_on_train_epoch_end: bool | None = None) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"ModelCheckpoint mode={mode!r} is not valid; choose 'min' or 'max'.")
        if not isinstance(save_top_k, int) or save_top_k < -1:
            raise ValueError(f"ModelCheckpoint save_top_k={save_top_k!r} must be an int >= -1.")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise ValueError(f"ModelCheckpoint save_top_k={save_top_k} needs a monitor; without one only -1, 0 "
                             "or 1 are valid.")
        for name, v in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
            if v is not None and (not isinstance(v, int) or v < 0):
                raise ValueError(f"ModelCheckpoint {name}={v!r} must be an int >= 0.")
        interval = getattr(train_time_interval, "total_seconds", lambda: train_time_interval)()
        set_triggers = sum(bool(x) for x in (every_n_train_steps, every_n_epochs, interval))
        if set_triggers > 1:
            raise ValueError("ModelCheckpoint: every_n_train_steps, every_n_epochs and train_time_interval are "
                             "mutually exclusive; set one.")
        # a pathlib.Path is accepted as Lightning does; kept as a str (local path or fsspec URL)
        dirpath = os.fspath(dirpath) if dirpath is not None else None
        self.dirpath, self.filename, self.monitor, self.verbose = dirpath, filename, monitor, verbose
        self.save_last, self.save_top_k, self.mode = save_last, save_top_k, mode
        self.auto_insert_metric_name = auto_insert_metric_name
        self.every_n_train_steps = every_n_train_steps or 0
        self.every_n_epochs = every_n_epochs if every_n_epochs is not None else (0 if set_triggers else 1)
        self.train_time_interval = float(interval) if interval else None
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.best_k_models: dict[str, float] = {}
        self.kth_best_model_path = ""
        self.best_model_path = ""
        self.best_model_score: float | None = None
        self.last_model_path = ""
        self._last_global_step_saved = -1
        self._last_step_seen = -1
        self._last_time = time.monotonic()
        self._fit: Any = None
        self._on_epoch_end = False

    #: saves at an epoch's end after the module's on_train_epoch_end (Lightning's monitoring callbacks), so the
    #: epoch's values logged there can be monitored and the other callbacks' epoch-end state is saved
    monitors_epoch_end = True

    @property
    def state_key(self) -> str:
        return f"ModelCheckpoint{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}}}"

    # ---------------------------------------------------------------------------------------- triggers ---
    def on_train_start(self, fit: Any, module: Any) -> None:
        self._fit = fit
        if self.dirpath is None:
            from taskfit.io.checkpoint_io import join

            self.dirpath = join(fit.args.output_dir, "checkpoints")
        self._on_epoch_end = (self.save_on_train_epoch_end if self.save_on_train_epoch_end is not None
                              else not (fit.run.eval_loaders and fit.args.eval_strategy != "no"))
        self._last_time = time.monotonic()

    def on_train_end(self, fit: Any, module: Any) -> None:
        self._fit = None

    def on_train_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = fit.state.global_step
        if step == self._last_step_seen or step == self._last_global_step_saved:
            return  # not the end of an accumulation window (the step did not advance)
        self._last_step_seen = step
        due = bool(self.every_n_train_steps) and step % self.every_n_train_steps == 0
        if self.train_time_interval is not None and time.monotonic() - self._last_time >= self.train_time_interval:
            due, self._last_time = True, time.monotonic()
        if due:
            self._save_all(fit)

    def on_train_epoch_end(self, fit: Any, module: Any) -> None:
        if self._on_epoch_end and self._epoch_due(fit):
            self._save_all(fit)  # the loop marked the epoch ended: the checkpoint resumes at the next epoch

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        fit = self._fit
        if fit is not None and not self._on_epoch_end and self._epoch_due(fit):
            self._save_all(fit)
        return control

    def _epoch_due(self, fit: Any) -> bool:
        return (bool(self.every_n_epochs) and (fit.state.current_epoch + 1) % self.every_n_epochs == 0
                and fit.state.global_step != self._last_global_step_saved)

    # ------------------------------------------------------------------------------------------ saving ---
    def _metrics(self, fit: Any) -> dict[str, Any]:
        m = dict(fit.callback_metrics)
        # a name logged with self.log in validation_step reaches the evaluation metrics as eval_{name}
        m.update({k[5:]: v for k, v in fit.callback_metrics.items() if k.startswith("eval_") and k[5:] not in m})
        m.update(epoch=fit.state.current_epoch, step=fit.state.global_step)
        return m

    def format_checkpoint_name(self, metrics: dict[str, Any]) -> str:
        """The folder name for ``metrics`` from the ``filename`` template (Lightning's rules; missing metrics
        format as 0)."""
        name = self.filename or "{epoch}-{step}"
        for group in _GROUP.findall(name):
            key = group[1:]
            if self.auto_insert_metric_name:
                name = name.replace(group, key + "=" + group, 1)
            metrics.setdefault(key, 0)
        return name.format(**{k: (float(v) if hasattr(v, "item") else v) for k, v in metrics.items()})

    def _better(self, current: float, reference: float) -> bool:
        return current < reference if self.mode == "min" else current > reference

    def _save_all(self, fit: Any) -> None:
        from taskfit.io.checkpoint_io import join

        if fit.args.fast_dev_run:
            return  # a debugging pass writes no checkpoints (Lightning)
        metrics = self._metrics(fit)
        self._last_global_step_saved = fit.state.global_step
        if self.save_top_k:
            if self.monitor is None:
                self._save_latest(fit, metrics)
            else:
                if self.monitor not in metrics:
                    raise KeyError(f"ModelCheckpoint monitors {self.monitor!r}, which is not among the logged "
                                   f"metrics {sorted(fit.callback_metrics)}.")
                self._save_top_k(fit, metrics)
        if self.save_last:
            path = join(self.dirpath, self.CHECKPOINT_NAME_LAST)
            self._save(fit, path)
            self.last_model_path = path

    def _path_for(self, metrics: dict[str, Any]) -> str:
        from taskfit.io.checkpoint_io import join

        path = join(self.dirpath, self.format_checkpoint_name(dict(metrics)))
        base, v = path, 1
        while path in self.best_k_models or (path == self.best_model_path and path):
            path, v = f"{base}-v{v}", v + 1
        return path

    def _save_latest(self, fit: Any, metrics: dict[str, Any]) -> None:
        path = self._path_for(metrics)
        previous = self.best_model_path
        self._save(fit, path)
        self.best_model_path = path
        if self.save_top_k == 1 and previous and previous != path:
            self._remove(fit, previous)

    def _save_top_k(self, fit: Any, metrics: dict[str, Any]) -> None:
        value = float(metrics[self.monitor])
        if math.isnan(value):  # never better than anything (Lightning maps NaN to the worst value)
            value = math.inf if self.mode == "min" else -math.inf
        k = self.save_top_k
        if k != -1 and len(self.best_k_models) >= k and not self._better(value, self.best_k_models[
                self.kth_best_model_path]):
            return
        path = self._path_for(metrics)
        self._save(fit, path)
        self.best_k_models[path] = value
        if k != -1 and len(self.best_k_models) > k:
            worst = self._kth()
            del self.best_k_models[worst]
            self._remove(fit, worst)
        self.kth_best_model_path = self._kth()
        pick = min if self.mode == "min" else max
        self.best_model_path = pick(self.best_k_models, key=self.best_k_models.__getitem__)
        self.best_model_score = self.best_k_models[self.best_model_path]

    def _kth(self) -> str:
        pick = max if self.mode == "min" else min
        return pick(self.best_k_models, key=self.best_k_models.__getitem__)

    def _save(self, fit: Any, path: str) -> None:
        fit.save_checkpoint(path)

    def _remove(self, fit: Any, path: str) -> None:
        from taskfit.checkpoint.writer import MANIFEST_NAME
        from taskfit.io.checkpoint_io import join

        if fit.is_global_zero:
            io = fit.strategy.checkpoint_io
            io.wait()  # the folder may still be written in the background
            io.remove_checkpoint(join(path, MANIFEST_NAME))  # incomplete first, as checkpoint rotation does
            io.remove_checkpoint(path)

    # ------------------------------------------------------------------------------------------- state ---
    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor, "best_model_score": self.best_model_score,
                "best_model_path": self.best_model_path, "kth_best_model_path": self.kth_best_model_path,
                "best_k_models": dict(self.best_k_models), "last_model_path": self.last_model_path,
                "dirpath": self.dirpath, "last_global_step_saved": self._last_global_step_saved}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath") not in (None, self.dirpath) and self.dirpath is not None:
            return  # another folder: its paths mean nothing here (Lightning keeps only the last path then)
        self.dirpath = state_dict.get("dirpath", self.dirpath)
        self.best_model_score = state_dict.get("best_model_score")
        self.best_model_path = state_dict.get("best_model_path", "")
        self.kth_best_model_path = state_dict.get("kth_best_model_path", "")
        self.best_k_models = dict(state_dict.get("best_k_models", {}))
        self.last_model_path = state_dict.get("last_model_path", "")
        self._last_global_step_saved = state_dict.get("last_global_step_saved", -1)
