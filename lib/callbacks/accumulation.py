"""Gradient accumulation that changes at epoch boundaries (mirrors Lightning's ``GradientAccumulationScheduler``)."""

from __future__ import annotations

import warnings
from typing import Any

from taskfit.callbacks.base import Callback
from taskfit.errors import configuration_error


class GradientAccumulationScheduler(Callback):
    """Accumulate ``scheduling[e]`` micro-batches per optimizer step from epoch ``e`` (0-based) on, until the next
    key; epochs before the smallest key accumulate 1. The fit loop reads the value once per epoch (no per-step
    cost); the step plan (``max_steps``, ``estimated_stepping_batches``, the progress bar's total) counts each
    epoch's windows, so a schedule never cuts training short.

    Mirrors ``lightning.pytorch.callbacks.GradientAccumulationScheduler``. One difference: Lightning's
    ``trainer.estimated_stepping_batches`` counts every epoch with the Trainer's ``accumulate_grad_batches``
    (1), taskfit counts the scheduled windows exactly.

    Args:
        scheduling (dict[int, int]): epoch (>= 0) -> micro-batches per optimizer step (>= 1).

    Raises:
        TypeError: an empty ``scheduling``.
        ValueError: a negative or non-int epoch, or a factor that is not an int >= 1 (Lightning's messages;
            Lightning raises its ``MisconfigurationException``).
        RuntimeError (at ``on_train_start``, as Lightning): manual optimization, or a strategy whose engine runs the
            step (DeepSpeed: its accumulation is fixed when the engine is built); ValueError there when
            ``gradient_accumulation_steps`` (Lightning: ``accumulate_grad_batches``) is set too.

    Example::

        GradientAccumulationScheduler(scheduling={0: 4, 2: 2})  # epochs 0-1: 4 micro-batches per step, then 2
    """

    def __init__(self, scheduling: dict[int, int]) -> None:
        if not scheduling:
            raise TypeError("GradientAccumulationScheduler needs a non-empty scheduling dict {epoch: factor}.")
        # Lightning's messages (Lightning raises its MisconfigurationException)
        if any(not isinstance(k, int) or isinstance(k, bool) or k < 0 for k in scheduling):
            raise configuration_error(f"Epoch should be an int greater than or equal to 0. Got {list(scheduling)}.")
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in scheduling.values()):
            raise configuration_error(
                f"Accumulation factor should be an int greater than 0. Got {list(scheduling.values())}.")
        self.scheduling = dict(scheduling)
        if 0 not in self.scheduling:  # Lightning: the epochs before the first key accumulate 1
            self.scheduling[0] = 1
        self.epochs = sorted(self.scheduling)

    def going_to_accumulate_grad_batches(self) -> bool:
        """True when some epoch accumulates more than one micro-batch."""
        return any(v > 1 for v in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """Micro-batches per optimizer step in ``epoch`` (0-based)."""
        for start in reversed(self.epochs):
            if epoch >= start:
                return self.scheduling[start]
        return 1

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Refuse what cannot follow the schedule, before the first step (Lightning's checks and messages)."""
        if not pl_module.automatic_optimization:
            raise RuntimeError("Automatic gradient accumulation and the `GradientAccumulationScheduler` is not "
                               "supported for manual optimization. Please remove the callback or switch to "
                               "automatic optimization.")
        if self.going_to_accumulate_grad_batches() and (type(pl_module).optimizer_step is not _base_hook(
                "optimizer_step") or type(pl_module).optimizer_zero_grad is not _base_hook("optimizer_zero_grad")):
            warnings.warn("When using `Trainer(accumulate_grad_batches != 1)` and overriding "
                          "`LightningModule.optimizer_{step,zero_grad}`, the hooks will not be called on every batch "
                          "(rather, they are called on every optimization step).", UserWarning, stacklevel=2)
        if trainer.strategy.engine_owns_step:  # DeepSpeed: its engine fixes the accumulation when built
            raise RuntimeError(f"The `{type(trainer.strategy).__name__}` does not support `accumulate_grad_batches` "
                               "changing between epochs.")
        if trainer.args.gradient_accumulation_steps != 1:
            raise ValueError("You have set `accumulate_grad_batches` and are using the `GradientAccumulationScheduler` "
                             "callback. Either remove `accumulate_grad_batches` from the Trainer (`Fit`: "
                             "gradient_accumulation_steps) or remove the callback.")


def _base_hook(name: str) -> Any:
    from taskfit.core.module import TaskModule

    return getattr(TaskModule, name, None)
