"""Lightning's order of a trainer's callbacks: the tuner's finders first, checkpoint callbacks last."""

from __future__ import annotations

from typing import Any

from taskfit.callbacks.model_checkpoint import ModelCheckpoint


def lightning_order(callbacks: list[Any]) -> list[Any]:
    """``callbacks`` with those marked ``runs_first`` (``BatchSizeFinder``/``LearningRateFinder``) first and
    ``ModelCheckpoint``s last, each group in its given order (mirrors Lightning's
    ``_CallbackConnector._reorder_callbacks``). Checkpoints run last at every hook, so a checkpoint written at an
    epoch's end or after a validation holds the state the other callbacks (``EarlyStopping``'s patience) reached in
    that hook.

    Args:
        callbacks (list[Callback]): the trainer's callbacks.

    Returns:
        list[Callback]: a new list, the same objects.
    """
    # HF callbacks lack the flag; `is True`: a stand-in object (a Mock) answering every name is not a finder
    tuner = [cb for cb in callbacks if getattr(cb, "runs_first", False) is True]
    checkpoints = [cb for cb in callbacks if isinstance(cb, ModelCheckpoint)]
    moved = {id(cb) for cb in tuner + checkpoints}
    return tuner + [cb for cb in callbacks if id(cb) not in moved] + checkpoints
