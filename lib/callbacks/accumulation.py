"""Gradient accumulation that changes at epoch boundaries (mirrors Lightning's ``GradientAccumulationScheduler``)."""

from __future__ import annotations

import warnings
from typing import Any

from taskfit.callbacks.base import Callback


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
        ValueError: a negative or non-int epoch, or a factor that is not an int >= 1.
        RuntimeError (at fit start): manual optimization, or a strategy whose engine runs the step (DeepSpeed:
            its accumulation is fixed when the engine is built); ValueError when ``gradient_accumulation_steps``
            is set too (as Lightning).

    Example::

        GradientAccumulationScheduler(scheduling={0: 4, 2: 2})  # epochs 0-1: 4 micro-batches per step, then 2
    """

    def __init__(self, scheduling: dict[int, int]) -> None:
        if not scheduling:
            raise TypeError("GradientAccumulationScheduler needs a non-empty scheduling dict {epoch: factor}.")
        if any(not isinstance(k, int) or isinstance(k, bool) or k < 0 for k in scheduling):
            raise ValueError(f"GradientAccumulationScheduler epochs must be ints >= 0; got {list(scheduling)}.")
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in scheduling.values()):
            raise ValueError(f"GradientAccumulationScheduler factors must be ints >= 1; got "
                             f"{list(scheduling.values())}.")
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

    def setup(self, fit: Any, module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if not module.automatic_optimization:
            raise RuntimeError("GradientAccumulationScheduler is not supported with manual optimization "
                               "(automatic_optimization = False): remove the callback or accumulate in "
                               "training_step.")
        if fit.strategy.engine_owns_step:
            raise RuntimeError(f"{type(fit.strategy).__name__} does not support gradient accumulation changing "
                               "between epochs (its engine fixes it when built); use gradient_accumulation_steps.")
        if fit.args.gradient_accumulation_steps != 1:
            raise ValueError(f"gradient_accumulation_steps={fit.args.gradient_accumulation_steps} is set and a "
                             "GradientAccumulationScheduler is given: remove one of them.")
        if self.going_to_accumulate_grad_batches() and (type(module).optimizer_step is not _base_hook(
                "optimizer_step") or type(module).optimizer_zero_grad is not _base_hook("optimizer_zero_grad")):
            warnings.warn("With gradient accumulation, the module's optimizer_step / optimizer_zero_grad run "
                          "once per optimizer step, not on every batch.", UserWarning, stacklevel=2)


def _base_hook(name: str) -> Any:
    from taskfit.core.module import TaskModule

    return getattr(TaskModule, name, None)
