"""Lightning's order of a trainer's callbacks: the tuner's finders first, checkpoint callbacks last."""

from __future__ import annotations

import logging
from typing import Any

from taskfit.callbacks.base import Callback, LightningCallback
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


def merge_model_callbacks(callbacks: list[Any], extra: list[Any], by_subclass: bool = False) -> list[Any]:
    """The trainer's ``callbacks`` joined by the module's ``configure_callbacks()`` result ``extra`` (appended),
    which replaces trainer callbacks of the same class.

    Args:
        callbacks (list[Callback]): the trainer's callbacks.
        extra (list[Callback]): what ``configure_callbacks`` returned.
        by_subclass (bool): Lightning's rule (``_CallbackConnector._attach_model_callbacks``): a returned
            callback also replaces those whose class it subclasses (a custom ``TQDMProgressBar`` replaces the
            trainer's ``TQDMProgressBar``; the bare ``Callback`` class is never replaced) and the replaced class
            names are logged at INFO; False replaces only callbacks of exactly a returned class.

    Returns:
        list[Callback]: a new list, the same objects.
    """
    if not by_subclass:
        types = {type(cb) for cb in extra}
        return [cb for cb in callbacks if type(cb) not in types] + list(extra)
    trainer_types = [t for t in dict.fromkeys(type(cb) for cb in callbacks) if t not in (Callback, LightningCallback)]
    override = set()
    for model_type in dict.fromkeys(type(cb) for cb in extra):
        match = next((t for t in trainer_types if issubclass(model_type, t)), None)
        if match is not None:
            override.add(match)
    if override:
        logging.getLogger("taskfit").info(
            "The following callbacks returned in `LightningModule.configure_callbacks` will override existing "
            f"callbacks passed to Trainer: {', '.join(sorted(t.__name__ for t in override))}")  # Lightning's line
    return [cb for cb in callbacks if type(cb) not in override] + list(extra)
