"""Lightning's order of the user's set-up and tear-down hooks around a stage (``configure_callbacks``,
``prepare_data``, ``setup``, ``configure_model``; ``teardown``), run by the facade."""

from __future__ import annotations

from typing import Any

from taskfit.callbacks.order import lightning_order, merge_model_callbacks
from taskfit.core.hook_logging import running
from taskfit.core.hooks import overrides


def start_stage(fit: Any, module: Any, datamodule: Any, stage: str) -> None:
    """Lightning's order at the start of a stage: ``configure_callbacks`` (fit), ``prepare_data`` (datamodule,
    then module, on local rank 0), ``setup`` (datamodule, callbacks, module), ``configure_model``."""
    if stage == "fit" and overrides(module, "configure_callbacks"):
        with running(module, "configure_callbacks"):
            extra = module.configure_callbacks()
        extra = list(extra) if isinstance(extra, (list, tuple)) else [extra] if extra else []
        if extra:
            fit.callbacks = merge_model_callbacks(fit.callbacks, extra, fit.loop_policy.model_callbacks_by_subclass)
            if fit.loop_policy.checkpoint_callbacks_last:
                fit.callbacks = lightning_order(fit.callbacks)
            fit._hooks = fit._api.hook_runner(module)
    if fit.strategy.local_rank == 0:
        if datamodule is not None:
            datamodule.prepare_data()
        with running(module, "prepare_data"):
            module.prepare_data()
    if fit.strategy.world_size > 1:
        fit.strategy.barrier("prepare_data")  # the other processes wait for the data local rank 0 prepared
    stage = fit.loop_policy.stage_argument(stage)  # Lightning's door: its TrainerFn member
    if datamodule is not None:
        datamodule.setup(stage=stage)  # by keyword, as Lightning calls it
    fit._hooks.call("setup", fit, module, stage=stage)
    fit.strategy.prepare_for_configure_model(module)  # model parallel: checks the module, builds the mesh
    with running(module, "configure_model"):
        module.configure_model()


def end_stage(fit: Any, module: Any, datamodule: Any, stage: str) -> None:
    """Lightning's order at the end of a stage: ``teardown`` of the datamodule, the callbacks, the module."""
    stage = fit.loop_policy.stage_argument(stage)
    if datamodule is not None and hasattr(datamodule, "teardown"):
        datamodule.teardown(stage=stage)
    fit._hooks.call("teardown", fit, module, stage=stage)
