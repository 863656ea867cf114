"""``lightning.pytorch.callbacks.ModelCheckpoint`` under ``taskfit.lightning``: Lightning's signature, names, triggers
and attributes over :class:`taskfit.callbacks.ModelCheckpoint` (the checkpoints stay taskfit's folders)."""

import math
import os
import re
import shutil
import time
import warnings
import weakref
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, Optional, Union

from taskfit.callbacks.model_checkpoint import ModelCheckpoint as _Base
from taskfit.errors import configuration_error
from taskfit.loggers.lightning_style import _Versioned

_GROUPS = re.compile(r"(\{.*?)[:}]")


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _tensor(value: Any) -> Any:
    import torch

    return value if isinstance(value, torch.Tensor) else torch.tensor(value)


def default_dir(trainer: Any) -> str:
    """Where a ``ModelCheckpoint`` without ``dirpath`` saves: the first logger's ``save_dir/name/version/checkpoints``
    (``version_N`` for an int version; ``default_root_dir`` when its ``save_dir`` is None), else
    ``default_root_dir/checkpoints``; Lightning's ``ModelCheckpoint.__resolve_ckpt_dir``, for any logger object."""
    loggers = getattr(trainer, "loggers", None) or []
    if not loggers:
        return os.path.join(trainer.default_root_dir, "checkpoints")
    lg = loggers[0]
    if isinstance(lg, _Versioned):  # the door's file loggers write into save_dir/name/version already (log_dir)
        return os.path.join(lg.log_dir, "checkpoints")
    save_dir = getattr(lg, "save_dir", None)
    version = getattr(lg, "version", "")
    version = version if isinstance(version, str) else f"version_{version}"
    return os.path.join(trainer.default_root_dir if save_dir is None else save_dir, str(getattr(lg, "name", "")),
                        version, "checkpoints")


class ModelCheckpoint(_Base):
    """``lightning.pytorch.callbacks.ModelCheckpoint`` with Lightning 2.x's arguments, defaults, file names
    (``epoch=0-step=10.ckpt``, ``last.ckpt``, ``-v1`` versions of names already taken), triggers and attributes
    (``best_model_path``, ``best_model_score`` and ``current_score`` as 0-dim tensors, ``best_k_models``,
    ``kth_best_model_path``, ``kth_value``, ``last_model_path``, ``state_key``, ``state_dict`` keys, ``to_yaml``).
    Each checkpoint is a taskfit checkpoint folder under that name (``.ckpt`` is the folder's name ending, as
    ``FILE_EXTENSION``), which ``Trainer.fit(ckpt_path=...)`` and ``load_from_checkpoint`` take.

    Args:
        dirpath (str | os.PathLike | None): the folder (``~`` expanded, local paths made absolute); None: the
            first logger's ``save_dir/name/version/checkpoints``, else ``default_root_dir/checkpoints``.
        filename (str | None): name template (``"{epoch}-{val_loss:.2f}"``); None: ``"{epoch}-{step}"``.
        monitor (str | None): the ``self.log`` name to rank by; None keeps the latest.
        verbose (bool): log each save.
        save_last (bool | "link" | None): also keep ``last.ckpt`` (``"link"``: a symbolic link to the newest
            checkpoint, local folders only).
        save_top_k (int): checkpoints kept (-1 all, 0 none).
        save_on_exception (bool): write ``<filename>.ckpt`` when training raises.
        save_weights_only (bool): only False (a taskfit checkpoint is always complete).
        mode (str): ``"min"`` or ``"max"``.
        auto_insert_metric_name (bool): write ``name=value`` for each template field.
        every_n_train_steps (int | None), train_time_interval (datetime.timedelta | None), every_n_epochs
            (int | None): the trigger (at most one; default every epoch).
        save_on_train_epoch_end (bool | None): save at the training epoch's end (True) or after validation.
        enable_version_counter (bool): add ``-v1``, ``-v2``... to a name already on disk (False: overwrite).

    Raises:
        ValueError: ``save_top_k`` < -1, a negative trigger, several triggers, ``save_top_k`` > 1 without a
            monitor, a bad ``mode`` (Lightning's messages; Lightning raises ``MisconfigurationException``), or
            ``save_last="link"`` with a remote ``dirpath`` (at ``setup``).
        NotImplementedError: ``save_weights_only=True``.
    """

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1

    def __init__(self, dirpath: Any = None, filename: Optional[str] = None, monitor: Optional[str] = None,
                 verbose: bool = False, save_last: Optional[Union[bool, Literal["link"]]] = None,
                 save_top_k: int = 1, save_on_exception: bool = False, save_weights_only: bool = False,
                 mode: str = "min", auto_insert_metric_name: bool = True, every_n_train_steps: Optional[int] = None,
                 train_time_interval: Optional[timedelta] = None, every_n_epochs: Optional[int] = None,
                 save_on_train_epoch_end: Optional[bool] = None, enable_version_counter: bool = True) -> None:
        _validate(save_top_k, every_n_train_steps, every_n_epochs, train_time_interval, monitor, mode)
        if save_weights_only:
            raise NotImplementedError("ModelCheckpoint(save_weights_only=True) is not supported by taskfit.lightning: "
                                      "a checkpoint is always complete; load only the weights with "
                                      "LightningModule.load_from_checkpoint(path).")
        if dirpath and _is_local(os.fspath(dirpath)):
            dirpath = os.path.realpath(os.path.expanduser(dirpath))
        super().__init__(dirpath=dirpath, filename=filename, monitor=monitor, verbose=verbose,
                         save_last=save_last, save_top_k=save_top_k, mode=mode,
                         auto_insert_metric_name=auto_insert_metric_name, every_n_train_steps=every_n_train_steps,
                         train_time_interval=train_time_interval, every_n_epochs=every_n_epochs,
                         save_on_train_epoch_end=save_on_train_epoch_end)
        self.save_on_exception, self.save_weights_only = save_on_exception, save_weights_only
        if every_n_train_steps is not None or every_n_epochs is not None or train_time_interval is not None:
            self.every_n_epochs = every_n_epochs or 0  # Lightning: once one trigger is given, no epoch default
        self._enable_version_counter = enable_version_counter
        self._train_time_interval = train_time_interval
        self._last_global_step_saved = 0  # nothing to save before a step was taken (Lightning)
        self._last_time_checked: Optional[float] = None
        self._last_checkpoint_saved = ""
        self._val_has_run = False
        self.current_score: Any = None
        self.kth_value: Any = _tensor(math.inf if mode == "min" else -math.inf)
        self.ckpt_path: Optional[str] = None

    # ------------------------------------------------------------------------------- Lightning's names ---
    @property
    def state_key(self) -> str:
        """``ModelCheckpoint{'monitor': ..., 'mode': ..., 'every_n_train_steps': ..., 'every_n_epochs': ...,
        'train_time_interval': ...}`` (Lightning's key of the callback's checkpoint state)."""
        return f"{type(self).__qualname__}" + repr({
            "monitor": self.monitor, "mode": self.mode, "every_n_train_steps": self.every_n_train_steps,
            "every_n_epochs": self.every_n_epochs, "train_time_interval": self._train_time_interval})

    @property
    def _every_n_train_steps(self) -> int:
        return self.every_n_train_steps

    @property
    def _every_n_epochs(self) -> int:
        return self.every_n_epochs

    def _format_checkpoint_name(self, filename: Optional[str], metrics: dict[str, Any], prefix: Optional[str] = None,
                                auto_insert_metric_name: bool = True) -> str:
        """A name from the template without folder and extension (Lightning's rules: the longest fields first,
        dots allowed in names, a missing metric formats as 0)."""
        if not filename:
            filename = "{epoch}" + self.CHECKPOINT_JOIN_CHAR + "{step}"
        for group in sorted(_GROUPS.findall(filename), key=len, reverse=True):
            name = group[1:]
            if auto_insert_metric_name:
                filename = filename.replace(group, name + self.CHECKPOINT_EQUALS_CHAR + "{" + name)
            filename = filename.replace(group, f"{{0[{name}]")  # names with dots or slashes
            metrics.setdefault(name, 0)
        values = {k: (v.item() if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1 else v)
                  for k, v in metrics.items()}
        filename = filename.format(values)
        return self.CHECKPOINT_JOIN_CHAR.join([prefix, filename]) if prefix is not None else filename

    def format_checkpoint_name(self, metrics: dict[str, Any], filename: Optional[str] = None,
                               ver: Optional[int] = None, prefix: Optional[str] = None) -> str:
        """The checkpoint's path: ``dirpath/<name>[-v<ver>].ckpt`` (just the name without ``dirpath``), as
        Lightning's ``format_checkpoint_name``."""
        name = self._format_checkpoint_name(filename or self.filename, dict(metrics), prefix=prefix,
                                            auto_insert_metric_name=self.auto_insert_metric_name)
        if ver is not None:
            name = self.CHECKPOINT_JOIN_CHAR.join((name, f"v{ver}"))
        name += self.FILE_EXTENSION
        return os.path.join(self.dirpath, name) if self.dirpath else name

    def to_yaml(self, filepath: Any = None) -> None:
        """Write ``best_k_models`` (path -> score) as YAML to ``filepath`` (default ``dirpath/best_k_models.yaml``)."""
        import yaml

        best_k = {k: float(v) for k, v in self.best_k_models.items()}
        with open(filepath or os.path.join(self.dirpath, "best_k_models.yaml"), "w") as f:
            yaml.dump(best_k, f)

    # ------------------------------------------------------------------------------------------ hooks ---
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Resolve ``dirpath`` (Lightning's order: given, the first logger's folder, ``default_root_dir``).

        Raises:
            ValueError: ``save_last="link"`` with a folder that is not local.
        """
        self.dirpath = self._resolve_dir(trainer)
        if self.save_last == "link" and not _is_local(str(self.dirpath)):
            raise ValueError("`ModelCheckpoint(save_last='link')` is only supported for local file paths, got "
                             f"`dirpath={self.dirpath}`.")

    def _resolve_dir(self, trainer: Any) -> str:
        return self.dirpath if self.dirpath is not None else default_dir(trainer)

    def on_train_start(self, fit: Any, module: Any) -> None:
        # rank 0's folder on every process, as Lightning broadcasts it at setup (a logger's name or version may
        # differ between processes); here, because the process group is up only after setup
        self.dirpath = fit.strategy.broadcast(self._resolve_dir(fit))
        super().on_train_start(fit, module)
        self._last_time_checked = time.monotonic()
        self.ckpt_path = getattr(fit, "ckpt_path", None)

    def _should_save_on_train_epoch_end(self, trainer: Any) -> bool:
        """Lightning's rule: as given; else not when validation is not every epoch, yes without validation,
        else only when validation runs once at the epoch's end."""
        if self.save_on_train_epoch_end is not None:
            return self.save_on_train_epoch_end
        if getattr(trainer, "check_val_every_n_epoch", 1) != 1:
            return False
        loop = getattr(trainer, "_loop", None)
        run = getattr(trainer, "run", None)
        validates = bool(run is not None and run.eval_loaders) and (
            trainer.args.eval_strategy != "no" or bool(loop is not None and loop.scheduled))
        return not validates or getattr(trainer, "val_check_interval", 1.0) == 1.0

    def _should_skip(self, fit: Any) -> bool:
        return bool(fit.args.fast_dev_run) or getattr(fit, "sanity_checking", False) or \
            self._last_global_step_saved == fit.state.global_step

    def on_train_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = fit.state.global_step
        skip_batch = self.every_n_train_steps < 1 or step % self.every_n_train_steps != 0
        skip_time, now = True, time.monotonic()
        if self.train_time_interval is not None and self._last_time_checked is not None:
            skip_time = now - self._last_time_checked < self.train_time_interval
        if skip_batch and skip_time:
            return
        if not skip_time:
            self._last_time_checked = now
        candidates = self._monitor_candidates(fit)
        if self.monitor is not None and self.monitor not in candidates:
            return  # a validation-only metric: the save waits for validation (Lightning defers it)
        if not self._should_skip(fit):
            self._save_topk_checkpoint(fit, candidates)
            self._save_last_checkpoint(fit, candidates)

    def on_train_epoch_end(self, fit: Any, module: Any) -> None:
        if not self._should_skip(fit) and self._should_save_on_train_epoch_end(fit):
            self._epoch_save(fit)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """After validation inside ``fit`` (not the sanity check): the epoch's save when it is not taken at the
        training epoch's end (Lightning's hook, so a subclass overriding ``on_train_start`` keeps it)."""
        run = getattr(trainer, "run", None)
        if getattr(trainer, "sanity_checking", False) or run is None or run.stage != "fit":
            return
        self._val_has_run = True
        if not self._should_skip(trainer) and not self._should_save_on_train_epoch_end(trainer):
            self._epoch_save(trainer)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return control  # the save after validation is on_validation_end's

    def _epoch_save(self, fit: Any) -> None:
        candidates = self._monitor_candidates(fit)
        if self.every_n_epochs >= 1 and (fit.state.current_epoch + 1) % self.every_n_epochs == 0:
            self._save_topk_checkpoint(fit, candidates)
        if self._last_global_step_saved == fit.state.global_step or (
                self.save_last == "link" and self._last_checkpoint_saved):
            self._save_last_checkpoint(fit, candidates)  # last only when a checkpoint was written now

    def on_exception(self, fit: Any, module: Any, exception: BaseException) -> None:
        """With ``save_on_exception``: write ``<filename>.ckpt`` (and ``last``) unless this step is saved."""
        if not self.save_on_exception or fit.args.fast_dev_run or getattr(fit, "sanity_checking", False) or \
                self._last_global_step_saved == fit.state.global_step:
            return
        candidates = self._monitor_candidates(fit)
        path = self.format_checkpoint_name(candidates)
        self._save_checkpoint(fit, path)
        self._save_last_checkpoint(fit, candidates)
        warnings.warn(f"An {type(exception).__name__} was raised with message: {exception}, saved checkpoint to "
                      f"{path}", UserWarning, stacklevel=2)

    def on_train_end(self, fit: Any, module: Any) -> None:
        if self.save_last and not self._last_checkpoint_saved and not fit.args.fast_dev_run:
            self._save_last_checkpoint(fit, self._monitor_candidates(fit))  # save_last holds whatever else ran
        super().on_train_end(fit, module)

    # ----------------------------------------------------------------------------------------- saving ---
    def _monitor_candidates(self, fit: Any) -> dict[str, Any]:
        out = {k: v for k, v in self._metrics(fit).items() if k not in ("epoch", "step")}
        out["epoch"], out["step"] = _tensor(int(fit.state.current_epoch)), _tensor(int(fit.state.global_step))
        return out

    def _save_checkpoint(self, fit: Any, filepath: str) -> None:
        fit.save_checkpoint(filepath, self.save_weights_only)
        self._last_global_step_saved = fit.state.global_step
        self._last_checkpoint_saved = filepath
        if fit.is_global_zero:  # Lightning notifies the loggers that have the method (taskfit's have none)
            for lg in fit.loggers:
                notify = getattr(lg, "after_save_checkpoint", None)
                if callable(notify):
                    notify(weakref.proxy(self))

    def _save_all(self, fit: Any) -> None:
        candidates = self._monitor_candidates(fit)
        self._save_topk_checkpoint(fit, candidates)
        self._save_last_checkpoint(fit, candidates)

    def file_exists(self, filepath: str, trainer: Any) -> bool:
        """Whether ``filepath`` exists (a file or a checkpoint folder)."""
        return os.path.exists(filepath) if _is_local(filepath) else trainer.strategy.checkpoint_io.exists(filepath)

    def _free_name(self, candidates: dict[str, Any], trainer: Any, taken_ok: Optional[str],
                   filename: Optional[str] = None) -> str:
        path = self.format_checkpoint_name(candidates, filename)
        if self._enable_version_counter:
            ver = self.STARTING_VERSION
            while self.file_exists(path, trainer) and path != taken_ok:
                path, ver = self.format_checkpoint_name(candidates, filename, ver=ver), ver + 1
        return path

    def _save_topk_checkpoint(self, trainer: Any, candidates: dict[str, Any]) -> None:
        """Keep the ``save_top_k`` best (or the latest without a monitor).

        Raises:
            ValueError: the monitored name was never logged although validation ran (Lightning's message).
        """
        if self.save_top_k == 0:
            return
        if self.monitor is None:
            path = self._free_name(candidates, trainer, self.best_model_path)
            previous, self.best_model_path = self.best_model_path, path
            self._save_checkpoint(trainer, path)
            if self.save_top_k == 1 and previous and self._should_remove_checkpoint(trainer, previous, path):
                self._remove(trainer, previous)
            return
        if self.monitor not in candidates:
            m = (f"`ModelCheckpoint(monitor={self.monitor!r})` could not find the monitored key in the returned "
                 f"metrics: {list(candidates)}. HINT: Did you call `log({self.monitor!r}, value)` in the "
                 "`LightningModule`?")
            if self._val_has_run:
                raise ValueError(m)
            warnings.warn(m, UserWarning, stacklevel=2)
            return
        current = _tensor(float(candidates[self.monitor]))
        if self._in_top_k(current):
            self._update_best_and_save(current, trainer, candidates)

    def _in_top_k(self, current: Any) -> bool:
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        kth = float(self.best_k_models[self.kth_best_model_path])
        return float(current) < kth if self.mode == "min" else float(current) > kth

    def _update_best_and_save(self, current: Any, trainer: Any, candidates: dict[str, Any]) -> None:
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        dropped = None
        if len(self.best_k_models) == k and k > 0:
            dropped = self.kth_best_model_path
            self.best_k_models.pop(dropped)
        if math.isnan(float(current)):  # NaN is never better: the worst value (Lightning)
            current = _tensor(math.inf if self.mode == "min" else -math.inf)
        path = self._free_name(candidates, trainer, dropped)
        self.current_score = current
        self.best_k_models[path] = current
        worst, best = (max, min) if self.mode == "min" else (min, max)
        if len(self.best_k_models) == k:
            self.kth_best_model_path = worst(self.best_k_models, key=lambda p: float(self.best_k_models[p]))
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        self.best_model_path = best(self.best_k_models, key=lambda p: float(self.best_k_models[p]))
        self.best_model_score = self.best_k_models[self.best_model_path]
        self._save_checkpoint(trainer, path)
        if dropped and self._should_remove_checkpoint(trainer, dropped, path):
            self._remove(trainer, dropped)

    def _save_last_checkpoint(self, trainer: Any, candidates: dict[str, Any]) -> None:
        if not self.save_last:
            return
        path = self._free_name(candidates, trainer, self.last_model_path, self.CHECKPOINT_NAME_LAST)
        previous, self.last_model_path = self.last_model_path, path  # part of the state being saved
        if self.save_last == "link" and self._last_checkpoint_saved and self.save_top_k != 0:
            self._link_checkpoint(trainer, self._last_checkpoint_saved, path)
        else:
            self._save_checkpoint(trainer, path)
        if previous and self._should_remove_checkpoint(trainer, previous, path):
            self._remove(trainer, previous)

    @staticmethod
    def _link_checkpoint(trainer: Any, filepath: str, linkpath: str) -> None:
        """Point ``linkpath`` at ``filepath`` with a relative symbolic link (a copy where links are not allowed)."""
        if getattr(trainer, "is_global_zero", True) and os.path.abspath(filepath) != os.path.abspath(linkpath):
            if os.path.islink(linkpath) or os.path.isfile(linkpath):
                os.remove(linkpath)
            elif os.path.isdir(linkpath):
                shutil.rmtree(linkpath)
            try:
                os.symlink(os.path.relpath(filepath, os.path.dirname(linkpath)), linkpath)
            except OSError:  # Windows without the privilege
                (shutil.copytree if os.path.isdir(filepath) else shutil.copy)(filepath, linkpath)
        trainer.strategy.barrier()

    def _should_remove_checkpoint(self, trainer: Any, previous: str, current: str) -> bool:
        """Not the current one, not the checkpoint this run resumed from, and inside ``dirpath`` (Lightning)."""
        if previous == current:
            return False
        if not _is_local(previous):
            return True
        old = Path(previous).absolute()
        resumed = getattr(trainer, "ckpt_path", None) or self.ckpt_path
        if resumed is not None and old == Path(resumed).absolute():
            return False
        return Path(self.dirpath).absolute() in old.parents

    def _remove(self, fit: Any, path: str) -> None:
        if os.path.islink(path):
            if fit.is_global_zero:
                os.remove(path)  # a save_last="link" link, not a checkpoint
            return
        super()._remove(fit, path)

    def _find_last_checkpoints(self, trainer: Any) -> set[str]:
        """The ``last`` checkpoints (``last.ckpt``, ``last-v1.ckpt``...) in the checkpoint folder."""
        folder = self._resolve_dir(trainer)
        pattern = rf"^{self.CHECKPOINT_NAME_LAST}(-(\d+))?"
        if not os.path.isdir(folder):
            return set()
        return {os.path.normpath(os.path.join(folder, p)) for p in os.listdir(folder)
                if Path(p).suffix == self.FILE_EXTENSION and re.match(pattern, Path(p).stem)}

    # ------------------------------------------------------------------------------------------ state ---
    def state_dict(self) -> dict[str, Any]:
        """Lightning's keys (``current_score``, ``kth_value`` included)."""
        return {**super().state_dict(), "best_k_models": self.best_k_models, "current_score": self.current_score,
                "kth_value": self.kth_value}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As Lightning: everything from the same ``dirpath``; from another one only ``best_model_path``, with
        Lightning's warning."""
        saved_dir = state_dict.get("dirpath", self.dirpath)
        if self.dirpath == saved_dir:
            self.best_model_score = state_dict["best_model_score"]
            self.kth_best_model_path = state_dict.get("kth_best_model_path", self.kth_best_model_path)
            self.kth_value = state_dict.get("kth_value", self.kth_value)
            self.best_k_models = state_dict.get("best_k_models", self.best_k_models)
            self.last_model_path = state_dict.get("last_model_path", self.last_model_path)
        else:
            warnings.warn(f"The dirpath has changed from {saved_dir!r} to {self.dirpath!r}, therefore "
                          "`best_model_score`, `kth_best_model_path`, `kth_value`, `last_model_path` and "
                          "`best_k_models` won't be reloaded. Only `best_model_path` will be reloaded.", UserWarning,
                          stacklevel=2)
        self.best_model_path = state_dict["best_model_path"]


def _validate(save_top_k: Any, every_n_train_steps: Any, every_n_epochs: Any, interval: Any, monitor: Any,
              mode: str) -> None:
    """Lightning's checks and messages.

    Raises:
        MisconfigurationException: (``taskfit.errors.ConfigurationError``, a ValueError) as :class:`ModelCheckpoint`.
    """
    if mode not in ("min", "max"):
        raise configuration_error(f"`mode` can be min, max but got {mode}")
    steps, epochs = every_n_train_steps or 0, every_n_epochs or 0
    if every_n_train_steps is None and every_n_epochs is None and interval is None:
        epochs = 1
    if save_top_k < -1:
        raise configuration_error(f"Invalid value for save_top_k={save_top_k}. Must be >= -1")
    if steps < 0:
        raise configuration_error(f"Invalid value for every_n_train_steps={steps}. Must be >= 0")
    if epochs < 0:
        raise configuration_error(f"Invalid value for every_n_epochs={epochs}. Must be >= 0")
    if (steps >= 1) + (epochs >= 1) + (interval is not None) > 1:
        raise configuration_error(f"Combination of parameters every_n_train_steps={steps}, every_n_epochs={epochs} and "
                                  f"train_time_interval={interval} should be mutually exclusive.")
    if monitor is None and save_top_k not in (-1, 0, 1):
        raise configuration_error(
            f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) is not a valid configuration. No "
            "quantity for top_k to track.")


def last_checkpoint(trainer: Any) -> Optional[str]:
    """``fit(ckpt_path="last")``: the newest complete ``last`` checkpoint of the trainer's ``ModelCheckpoint``
    callbacks (``last_model_path``, or ``last.ckpt`` in their ``dirpath`` from an earlier run); None with Lightning's
    warning when there is none (training then starts from scratch, as Lightning)."""
    from taskfit.checkpoint.writer import CheckpointError, read_manifest
    from taskfit.io.checkpoint_io import join

    io = trainer.strategy.checkpoint_io
    found: list[str] = []
    for cb in trainer.checkpoint_callbacks:
        folder = cb.dirpath if cb.dirpath is not None else default_dir(trainer)
        last = cb.CHECKPOINT_NAME_LAST + getattr(cb, "FILE_EXTENSION", "")
        for path in (cb.last_model_path, join(str(folder), last)):
            try:
                if path and path not in found and read_manifest(io, str(path)) is not None:
                    found.append(str(path))
            except (CheckpointError, FileNotFoundError, OSError):
                continue
    if not found:
        warnings.warn('.fit(ckpt_path="last") is set, but there is no last checkpoint available. No checkpoint will '
                      "be loaded. HINT: Set `ModelCheckpoint(..., save_last=True)`.", UserWarning,
                      stacklevel=4)  # Lightning's warning
        return None
    local = [p for p in found if os.path.exists(p)]
    return max(local, key=os.path.getmtime) if local else found[0]


def check_checkpoint_exists(ckpt_path: Any) -> None:
    """Refuse a local ``ckpt_path`` that is not there, before any work, with Lightning's error (``"best"``,
    ``"last"``, None and remote paths pass).

    Raises:
        FileNotFoundError: "Checkpoint file not found: <path>" (Lightning's message).
    """
    if ckpt_path is None or isinstance(ckpt_path, bool) or ckpt_path in ("best", "last", "hpc", "registry"):
        return
    path = os.fspath(ckpt_path)
    if _is_local(path) and not os.path.exists(path.removeprefix("file://")):
        raise FileNotFoundError(f"Checkpoint file not found: {path}")
