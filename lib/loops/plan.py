"""The run plan: what a training run is set to do, derived from its arguments and its train loader, never
restored from a checkpoint (DESIGN.md: "load, then continue"; F-LOOP-6).

:class:`RunPlan` holds the step budget, the trigger intervals, the batch layout and which process this is. The run
holds one (``Run.plan``); the loop state (:class:`~taskfit.loops.state.FitState`) reads HF ``TrainerState``'s
attributes of the same names from it, so HF-style callbacks and ``trainer_state.json`` see HF's layout. A re-plan
(a new train loader every n epochs, the batch-size finder) replaces the plan with a new one.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class RunPlan:
    """The plan of one training run (frozen: a re-plan makes a new one with :meth:`replace`).

    Attributes:
        max_steps (int): optimizer steps the run takes in all (HF ``TrainerState.max_steps``).
        num_train_epochs (int): epochs the run is planned for (0 for data without a length).
        batches_per_epoch (int | None): micro-batches per epoch of this process (None without a length); a resume
            compares the checkpoint's with its own.
        logging_steps / eval_steps / save_steps (int): the resolved trigger intervals, in optimizer steps.
        train_batch_size (int | None): the per-device batch size (samples).
        is_local_process_zero / is_world_process_zero (bool): which process this is.
    """

    max_steps: int = 0
    num_train_epochs: int = 0
    batches_per_epoch: int | None = None
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True

    def replace(self, **changes: Any) -> "RunPlan":
        """A new plan with ``changes`` (field name -> value); this one is not changed.

        Raises:
            TypeError: a name that is no field of the plan.
        """
        return dataclasses.replace(self, **changes)

    def state_dict(self) -> dict[str, Any]:
        """Every field by name (what a checkpoint records for the runs that resume from it)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunPlan":
        """A plan from :meth:`state_dict` output or any dict holding some of its fields (an old flat loop state,
        HF's ``trainer_state.json``); other keys are ignored, missing fields take their defaults."""
        return cls(**{k: values[k] for k in FIELDS if k in values})


#: the names of :class:`RunPlan`'s fields
FIELDS = tuple(f.name for f in dataclasses.fields(RunPlan))


def training_plan(args: Any, loader: Any, steps: tuple[int | None, int, int], batch_size: int | None,
                  local_zero: bool = True, world_zero: bool = True) -> RunPlan:
    """The plan of a run over ``loader`` taking ``steps`` (:func:`plan_steps`' ``(steps_per_epoch, max_steps,
    num_epochs)``, or a resume's re-count); the intervals are HF's (``TrainerState.compute_steps``: a value below 1
    is a ratio of ``max_steps``; ``eval_steps=None`` is ``logging_steps`` under ``eval_strategy="steps"``, else 500).

    Args:
        args (FitArguments): ``logging_steps``, ``eval_steps``, ``eval_strategy``, ``save_steps``.
        loader (Any): the train loader (its length is ``batches_per_epoch`` when the data has one).
        steps (tuple): ``(steps_per_epoch, max_steps, num_epochs)``.
        batch_size (int | None): the per-device batch size (samples).
        local_zero / world_zero (bool): whether this is the node's / the world's first process.
    """
    steps_per_epoch, max_steps, num_epochs = steps
    eval_steps = args.eval_steps if args.eval_steps is not None else (
        args.logging_steps if args.eval_strategy == "steps" else 500)
    return RunPlan(max_steps=max_steps, num_train_epochs=num_epochs if steps_per_epoch else 0,
                   batches_per_epoch=steps_per_epoch and len(loader),
                   logging_steps=resolve_interval(args.logging_steps, max_steps),
                   eval_steps=resolve_interval(eval_steps, max_steps),
                   save_steps=resolve_interval(args.save_steps, max_steps), train_batch_size=batch_size,
                   is_local_process_zero=local_zero, is_world_process_zero=world_zero)


def resolve_interval(value: float | None, max_steps: int) -> int:
    """HF rule for ``logging_steps``/``eval_steps``/``save_steps``: a value < 1 is a ratio of ``max_steps``."""
    if value is None:
        return max_steps
    return max(1, math.ceil(value * max_steps)) if value < 1 else int(value)


def accumulation_schedule(callbacks: Any) -> Callable[[int], int] | None:
    """The accumulation per epoch (0-based) a callback sets (Lightning's ``GradientAccumulationScheduler``:
    its ``get_accumulate_grad_batches(epoch)``); None when no callback schedules it."""
    for cb in callbacks or ():
        per_epoch = getattr(cb, "get_accumulate_grad_batches", None)
        if callable(per_epoch):
            return per_epoch
    return None


def plan_steps(loader: Any, args: Any, accumulation: Callable[[int], int] | None = None
               ) -> tuple[int | None, int, int]:
    """``(steps_per_epoch, max_steps, num_epochs)`` for a training loader (HF ``max_steps`` rules: ``max_steps``
    > 0 wins, else ``ceil(num_train_epochs * steps_per_epoch)``; the last window of an epoch may be short).
    With an ``accumulation`` schedule (epoch -> micro-batches per step) that changes between epochs, the plan
    counts each epoch's windows: ``steps_per_epoch`` is the first epoch's, ``max_steps`` the sum over the
    ``ceil(num_train_epochs)`` epochs (a fractional last epoch is not cut: Lightning counts whole epochs).

    Raises:
        ValueError: a loader without batches, or without a length while ``max_steps`` is not set.
    """
    try:
        n_batches = len(loader)
    except TypeError:
        n_batches = None
    if n_batches == 0:
        raise ValueError("The train DataLoader yields no batches (dataset smaller than one batch with "
                         "dataloader_drop_last=True?).")
    accum_at = accumulation or (lambda epoch: args.gradient_accumulation_steps)
    steps_per_epoch = math.ceil(n_batches / accum_at(0)) if n_batches else None
    epochs = math.ceil(args.num_train_epochs)
    per_epoch = [math.ceil(n_batches / accum_at(e)) for e in range(epochs)] if n_batches and accumulation else []
    if args.max_steps and args.max_steps > 0:
        max_steps = args.max_steps
    elif steps_per_epoch is None:
        raise ValueError("The train data has no length (IterableDataset); set max_steps > 0.")
    elif len(set(per_epoch)) > 1:
        max_steps = sum(per_epoch)
    else:
        max_steps = max(1, math.ceil(args.num_train_epochs * steps_per_epoch))
    if len(set(per_epoch)) > 1:  # the epoch in which the max_steps-th step falls
        total, num_epochs = 0, 0
        while total < max_steps:
            total += math.ceil(n_batches / accum_at(num_epochs))
            num_epochs += 1
    else:
        num_epochs = math.ceil(max_steps / steps_per_epoch) if steps_per_epoch else sys.maxsize
    return steps_per_epoch, max_steps, num_epochs
