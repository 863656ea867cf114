"""The door's own callbacks, kept out of ``trainer.callbacks``: Lightning lists there only the callbacks a user
passes or Lightning adds in their place (checkpoint, timer, progress bar, model summary), while its loops, logger
connector and profiler are no callbacks. The door's equivalents (:class:`~taskfit.lightning.loop_schedule.LightningLoop`,
:class:`~taskfit.lightning.progress_metrics.ProgressBarNames`, :class:`~taskfit.lightning.logged.LoggedMetrics`, a
profiler, the prediction collector) are callbacks of the shared loops, so they live in ``trainer._internal_callbacks``
and the hook runner calls both lists (:class:`DoorAPI`)."""

from __future__ import annotations

from typing import Any

from taskfit.callbacks.base import HookRunner, LightningCallback
from taskfit.callbacks.model_checkpoint import ModelCheckpoint as ModelCheckpointBase
from taskfit.callbacks.profilers import Profiler
from taskfit.callbacks.progress import ProgressBar, TQDMProgressBar
from taskfit.callbacks.timer import Timer
from taskfit.fit.hf_api import HFTrainerAPI
from taskfit.lightning.logged import LoggedMetrics
from taskfit.lightning.loop_schedule import LightningLoop
from taskfit.lightning.progress_metrics import ProgressBarNames

INTERNAL = (LightningLoop, ProgressBarNames, LoggedMetrics, Profiler)
# Lightning's _CallbackConnector adds its implicit callbacks in this order (checkpoints move last after)
_IMPLICIT_RANK = ((ModelCheckpointBase, 0), (Timer, 1), (ProgressBar, 2))


def _rank(cb: Any) -> int:
    return next((r for t, r in _IMPLICIT_RANK if isinstance(cb, t)), 3)  # the model summary and the rest: after


def split_callbacks(callbacks: list[Any], given: list[Any]) -> tuple[list[Any], list[Any]]:
    """Split the callbacks ``Fit`` set up into what Lightning's ``trainer.callbacks`` shows and the door's own.

    Args:
        callbacks (list[Callback]): every callback of the run (the user's, the implicit ones, the door's own).
        given (list[Callback]): the user's ``Trainer(callbacks=)``, which keep their order and come first.

    Returns:
        tuple[list, list]: ``(visible, internal)``; visible in Lightning's order (the user's, then the implicit
        checkpoint, timer, progress bar, model summary; mirrors ``_CallbackConnector.on_trainer_init``; the
        checkpoint callbacks are moved last by the caller's ``lightning_order``). The implicit bar is a
        ``TQDMProgressBar``, Lightning's default bar class.
    """
    internal = [cb for cb in callbacks if isinstance(cb, INTERNAL) and not any(cb is g for g in given)]
    user = [cb for cb in callbacks if any(cb is g for g in given)]
    implicit = [TQDMProgressBar() if type(cb) is ProgressBar else cb for cb in callbacks
                if not any(cb is x for x in user + internal)]
    return user + sorted(implicit, key=_rank), internal


def dispatch_order(visible: list[Any], internal: list[Any]) -> list[Any]:
    """The order the hook runner calls: the tuner's finders, the loop schedule, the rest of the visible callbacks,
    the door's other own callbacks (logged metrics, progress-bar names, profiler, prediction collector), then the
    checkpoint callbacks, so a checkpoint holds what every other callback reached in that hook (Lightning's
    checkpoint-last rule)."""
    loops = [cb for cb in internal if isinstance(cb, LightningLoop)]
    others = [cb for cb in internal if not isinstance(cb, LightningLoop)]
    first = [cb for cb in visible if getattr(cb, "runs_first", False) is True]
    ckpts = [cb for cb in visible if isinstance(cb, ModelCheckpointBase)]
    middle = [cb for cb in visible if not any(cb is x for x in first + ckpts)]
    return first + loops + middle + others + ckpts


def check_state_keys(callbacks: list[Any]) -> None:
    """Refuse two stateful callbacks (``state_dict`` overridden) with one ``state_key``: the checkpoint would keep
    only one state (mirrors Lightning's ``_validate_callbacks_list``).

    Raises:
        RuntimeError: naming the callback's type, in Lightning's words.
    """
    seen: set[str] = set()
    for cb in callbacks:
        fn = getattr(type(cb), "state_dict", None)
        if fn is None or fn is LightningCallback.state_dict or not isinstance(cb, LightningCallback):
            continue
        if cb.state_key in seen:
            name = type(cb).__name__
            raise RuntimeError(
                f"Found more than one stateful callback of type `{name}`. In the current configuration, this "
                "callback does not support being saved alongside other instances of the same type. Please consult "
                f"the documentation of `{name}` regarding valid settings for the callback state to be "
                "checkpointable. HINT: The `callback.state_key` must be unique among all callbacks in the Trainer.")
        seen.add(cb.state_key)


class DoorAPI(HFTrainerAPI):
    """``Fit``'s member bodies with a hook runner over ``trainer.callbacks`` and the door's own callbacks
    (:func:`dispatch_order`)."""

    def hook_runner(self, module: Any = None) -> HookRunner:
        order = dispatch_order(self.fit.callbacks, self.fit._internal_callbacks)
        return HookRunner(order, module, hf_kwargs=self.event_kwargs)
