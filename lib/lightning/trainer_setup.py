"""What the Lightning door's ``Trainer`` sets up before it hands over to ``Fit``: Lightning's implicit callbacks
and default logger, the ``PL_TRAINER_*`` environment defaults of its constructor, the checks of what ``fit`` was
given (a datamodule, an overridden validation hook), and the callback that keeps ``predict``'s outputs."""

from __future__ import annotations

import functools
import logging
from typing import Any

from lightning_utilities.core.overrides import is_overridden as _is_overridden

import taskfit.lightning.callbacks as _cb
import taskfit.lightning.loggers as _lg
from taskfit.callbacks.base import Callback
from taskfit.callbacks.model_checkpoint import ModelCheckpoint as ModelCheckpointBase
from taskfit.core.module import TaskModule
from taskfit.data.loaders import DataModule
from taskfit.errors import configuration_error
from taskfit.lightning.flags import env_defaults
from taskfit.lightning.logged import LoggedMetrics
from taskfit.lightning.loop_schedule import LightningLoop as _LightningLoop
from taskfit.lightning.progress_metrics import ProgressBarNames


class _Predictions(Callback):
    """Keeps every ``predict_step`` output of a ``Trainer.predict`` call, per dataloader (Lightning's return)."""

    def __init__(self) -> None:
        self.outputs: dict[int, list[Any]] = {}

    def on_predict_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:
        self.outputs.setdefault(dataloader_idx, []).append(outputs)


def _default_callbacks(f: dict[str, Any], given: list[Any]) -> list[Any]:
    """Lightning's implicit callbacks: a checkpoint every epoch (into the first logger's
    ``save_dir/name/version/checkpoints``, or ``default_root_dir/checkpoints`` without a logger, resolved at
    setup), the model summary, a ``Timer`` for ``max_time``, a profiler object. Raises Lightning's configuration
    errors for two progress bars, or one with ``enable_progress_bar=False`` (also ``ModelCheckpoint`` with
    ``enable_checkpointing=False``)."""
    out = [_LightningLoop(f["max_epochs"] if f["max_steps"] not in (None, -1) else None, f["val_check_interval"],
                          f["check_val_every_n_epoch"]), *given, ProgressBarNames(), LoggedMetrics()]
    bars = [c for c in given if isinstance(c, _cb.ProgressBar)]
    if len(bars) > 1:
        raise configuration_error("You added multiple progress bar callbacks to the Trainer, but currently only one"
                                  " progress bar is supported.")  # Lightning's message
    if bars and f["enable_progress_bar"] is False:
        raise configuration_error("Trainer was configured with `enable_progress_bar=False` but found "
                                  f"`{type(bars[0]).__name__}` in callbacks list.")  # Lightning's message
    if f["barebones"]:
        return out
    found = any(isinstance(c, ModelCheckpointBase) for c in given)
    if f["enable_checkpointing"] is False and found:
        raise configuration_error(
            "Trainer was configured with `enable_checkpointing=False` but found `ModelCheckpoint` in "
            "callbacks list.")  # Lightning's message
    if f["enable_checkpointing"] is not False and not found:
        out.append(_cb.ModelCheckpoint())  # its folder is resolved at setup from the loggers, as Lightning
    if f["enable_model_summary"] is not False and not any(isinstance(c, _cb.ModelSummary) for c in given):
        out.append(_cb.ModelSummary())
    if f["max_time"] is not None and any(isinstance(c, _cb.Timer) for c in given):
        logging.getLogger("taskfit").info("Ignoring `Trainer(max_time=...)`, callbacks list already contains a Timer.")
    elif f["max_time"] is not None:
        out.append(_cb.Timer(duration=f["max_time"]))
    if f["profiler"] is not None and not isinstance(f["profiler"], str):
        out.append(f["profiler"])
    return out


def _default_logger(logger: Any, root: str, barebones: bool) -> list[Any]:
    """Lightning's ``logger=``: None/True -> ``TensorBoardLogger(root)`` when tensorboard is installed, else
    ``CSVLogger(root)``; False -> none; a logger or an iterable of them as given."""
    if logger is False or barebones:
        return []
    if logger is None or logger is True:
        try:
            import tensorboard  # noqa: F401
            return [_lg.TensorBoardLogger(root)]
        except ImportError:
            return [_lg.CSVLogger(root)]
    return list(logger) if isinstance(logger, (list, tuple)) else [logger]


def _is_datamodule(obj: Any) -> bool:
    return isinstance(obj, DataModule) or not isinstance(obj, TaskModule) and all(
        hasattr(obj, n) for n in ("train_dataloader", "setup", "prepare_data"))


def _overrides(obj: Any, name: str, base: type) -> bool:
    """Lightning's ``is_overridden(name, obj, base)``, which decides whether there is a validation step or loader:
    an attribute set to None on the instance means none; one wrapped on the instance (``Mock(wraps=...)``,
    ``functools.partial``, ``functools.wraps``) counts as what it wraps, so a recorder around the default is not
    an override (the hooks themselves are called whenever Lightning calls them, wrappers included)."""
    if obj is None or getattr(obj, name, None) is None:
        return False
    if getattr(base, name, None) is None:  # no default on the base: any such method is the user's own
        return True
    return _is_overridden(name, obj, base)


def _env_defaults(init: Any) -> Any:
    """``Trainer.__init__`` with defaults from ``PL_TRAINER_*`` environment variables (:func:`env_defaults`; the
    arguments given win), as Lightning's ``_defaults_from_env_vars``."""
    @functools.wraps(init)
    def insert_env_defaults(self: Any, **kwargs: Any) -> None:
        init(self, **env_defaults(type(self), kwargs))

    return insert_env_defaults
