"""Lightning's order of the user's hooks around ``Trainer.validate``/``test``/``predict`` (the door's side: ``Fit``
runs its own stage, this wraps it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from taskfit.callbacks.base import Callback
from taskfit.callbacks.order import lightning_order, merge_model_callbacks
from taskfit.core.hook_logging import running
from taskfit.core.hooks import overrides
from taskfit.lightning.logged import start_loggers
from taskfit.lightning.trainer_state import trainer_fn
from taskfit.lightning.utilities import is_overridden

LOADER_OF = {"validate": "val_dataloader", "test": "test_dataloader", "predict": "predict_dataloader"}
LIMIT_OF = {"validate": "limit_val_batches", "test": "limit_test_batches", "predict": "limit_predict_batches"}


def _hooked(cb: Any, name: str) -> bool:
    if name in getattr(cb, "__dict__", ()):  # set on the instance: Lightning calls it
        return cb.__dict__[name] is not None
    return getattr(type(cb), name, None) is not getattr(Callback, name, None)


def _configure_callbacks(trainer: Any, module: Any) -> None:
    """The module's ``configure_callbacks()`` joined to the trainer's (one of the same type is replaced), as
    Lightning does at the start of every stage."""
    if module is None or not overrides(module, "configure_callbacks"):
        return
    with running(module, "configure_callbacks"):
        extra = module.configure_callbacks()
    extra = list(extra) if isinstance(extra, (list, tuple)) else [extra] if extra else []
    if extra:  # in every stage, checkpoint callbacks last (Lightning's _attach_model_callbacks)
        merged = merge_model_callbacks(trainer.callbacks, extra, trainer.loop_policy.model_callbacks_by_subclass)
        trainer.callbacks = lightning_order(merged)


@contextlib.contextmanager
def eval_stage(trainer: Any, model: Any, stage: str, datamodule: Any, data: Any) -> Iterator[tuple[Any, bool]]:
    """Around one ``validate``/``test``/``predict`` of the Lightning door, in Lightning's order:
    ``configure_callbacks``, ``prepare_data`` (datamodule, module), ``setup(stage=)`` (datamodule, callbacks,
    module), ``configure_model``, ``zero_grad``, the loggers' start calls (``log_hyperparams``, ``log_graph``,
    ``save``); then the body; then ``teardown(stage=)`` (datamodule, callbacks,
    module).

    Args:
        trainer (taskfit.lightning.Trainer): the door's trainer (its callbacks, ``args`` and last module).
        model (TaskModule | None): the module given to the call (None: the trainer's last one).
        stage (str): ``"validate"``, ``"test"`` or ``"predict"``.
        datamodule (LightningDataModule | None): the datamodule given to the call (None: the trainer's last one,
            ``trainer.datamodule``, gets the set-up and tear-down hooks only).
        data (Any): the loaders given to the call, or None.

    Yields:
        tuple[Any, bool]: the stage's data (``data``, else the datamodule's loader of the stage, fetched after
        ``zero_grad`` as Lightning does; None leaves the module's own loader to ``Fit``) and whether the stage
        runs at all (False for ``limit_*_batches=0``: Lightning then asks for no loader and calls no loop hook).
    """
    module = model if model is not None else trainer.module
    fn = trainer_fn(stage)  # Lightning passes its TrainerFn member (equal to the name)
    _configure_callbacks(trainer, module)
    hooked = [cb for cb in trainer.callbacks if _hooked(cb, "setup") or _hooked(cb, "teardown")]
    # Lightning keeps the last datamodule attached (trainer.datamodule): a stage given none still runs its set-up
    # and tear-down hooks, though the stage's data comes from its own arguments or the module
    hooks_dm = datamodule if datamodule is not None else getattr(trainer, "datamodule", None)
    if hooks_dm is not None:
        hooks_dm.prepare_data()
    if module is not None:
        with running(module, "prepare_data"):
            module.prepare_data()
    if hooks_dm is not None:
        hooks_dm.setup(stage=fn)
    with running(module, "setup"):
        for cb in hooked:
            cb.setup(trainer, module, stage=fn)
        if module is not None:
            module.setup(stage=fn)
    if module is not None:
        if is_overridden("configure_model", module):  # Lightning calls it only when overridden
            with running(module, "configure_model"):
                module.configure_model()
        module.zero_grad()
        start_loggers(trainer, module)  # Lightning's _log_hyperparams: after set-up, before loaders and start hooks
    runs = getattr(trainer.args, LIMIT_OF[stage], None) != 0
    try:
        if runs and data is None and datamodule is not None:
            data = getattr(datamodule, LOADER_OF[stage])()
        yield data, runs
    finally:
        if hooks_dm is not None:
            hooks_dm.teardown(stage=fn)
        with running(module, "teardown"):
            for cb in hooked:
                cb.teardown(trainer, module, stage=fn)
            if module is not None:
                module.teardown(stage=fn)
