"""``trainer.state`` of ``taskfit.lightning.Trainer``: the run's loop state (``global_step``, ``current_epoch``...)
plus Lightning's ``TrainerState`` fields (``fn``, ``status``, ``stage``, ``finished``, ``stopped``); and the
datamodule's part of a run: its ``state_dict`` in checkpoints, its hooks timed by the trainer's profiler."""

from __future__ import annotations

import contextlib
import enum
import logging
import sys
from typing import Any, Iterator


class TrainerFn(str, enum.Enum):
    """The trainer method running (Lightning's ``TrainerFn``)."""
    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class TrainerStatus(str, enum.Enum):
    """Where the trainer method is (Lightning's ``TrainerStatus``)."""
    INITIALIZING = "initializing"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"


class RunningStage(str, enum.Enum):
    """The loop running (Lightning's ``RunningStage``)."""
    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


def peer_enum(ours: type[enum.Enum]) -> type[enum.Enum]:
    """Lightning's class of the same name from ``lightning.pytorch.trainer.states`` when the program already
    imported it (an Enum with members cannot be subclassed, so the peer's own class is used: ``type(stage)`` and
    ``isinstance`` read as under Lightning), else ``ours``; the members' values are equal. Never imports Lightning."""
    return getattr(sys.modules.get("lightning.pytorch.trainer.states"), ours.__name__, ours)


def trainer_fn(name: str) -> enum.Enum:
    """The ``TrainerFn`` member of ``name`` (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``): what
    ``setup(stage)``/``teardown(stage)`` receive, as Lightning passes ``trainer.state.fn`` (it equals the string).

    Raises:
        ValueError: ``name`` is not one of the four.
    """
    return peer_enum(TrainerFn)(name)


_STAGE = {"fit": RunningStage.TRAINING, "validate": RunningStage.VALIDATING, "test": RunningStage.TESTING,
          "predict": RunningStage.PREDICTING}
_OWN = ("fn", "status", "stage")
_PROFILED = ("prepare_data", "setup", "teardown", "train_dataloader", "val_dataloader", "test_dataloader",
             "predict_dataloader")


class LightningState:
    """What ``trainer.state`` returns: Lightning's ``TrainerState`` fields here, everything else read from and
    written to the run's loop state (``FitState``).

    Attributes:
        fn (TrainerFn | None): the method running or last run; status (TrainerStatus); stage (RunningStage | None).
    """

    def __init__(self, trainer: Any, loop_state: Any) -> None:
        object.__setattr__(self, "_trainer", trainer)
        object.__setattr__(self, "_loop_state", loop_state)

    def __getattr__(self, name: str) -> Any:
        if name in ("_trainer", "_loop_state"):  # not set yet: unpickling (a spawned worker's copy) asks first
            raise AttributeError(name)
        return getattr(self._loop_state, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            self._trainer._lightning_status[name] = value
        else:
            setattr(self._loop_state, name, value)

    def __eq__(self, other: object) -> bool:
        """Equal to any state with equal ``fn``, ``status`` and ``stage`` (Lightning's ``TrainerState`` too, as
        ``trainer.state == TrainerState()`` compares under Lightning)."""
        if isinstance(other, LightningState) or all(hasattr(other, a) for a in _OWN):
            return all(getattr(self, a) == getattr(other, a) for a in _OWN)
        return NotImplemented

    __hash__ = object.__hash__  # one view per loop state: identity, as before

    @property
    def fn(self) -> TrainerFn | None:
        return _as_peer(self._trainer._lightning_status["fn"])

    @property
    def status(self) -> TrainerStatus:
        return _as_peer(self._trainer._lightning_status["status"])

    @property
    def stage(self) -> RunningStage | None:
        stage = self._trainer._lightning_status["stage"]
        if stage == RunningStage.TRAINING and self._trainer.sanity_checking:
            stage = RunningStage.SANITY_CHECKING
        elif stage == RunningStage.TRAINING and self._trainer.validating:
            stage = RunningStage.VALIDATING
        return _as_peer(stage)

    @property
    def finished(self) -> bool:
        """True once the last trainer method returned normally."""
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        """True when the last trainer method was interrupted (an exception, Ctrl-C)."""
        return self.status == TrainerStatus.INTERRUPTED


def _as_peer(member: Any) -> Any:
    """``member`` of one of this module's enums as the member of Lightning's class when Lightning is imported
    (:func:`peer_enum`); anything else (None, a value a user set) as it is."""
    mine = {TrainerFn: TrainerFn, TrainerStatus: TrainerStatus, RunningStage: RunningStage}.get(type(member))
    return member if mine is None else peer_enum(mine)(member.value)


def new_status() -> dict[str, Any]:
    """A trainer's Lightning status before any method ran."""
    return {"fn": None, "status": TrainerStatus.INITIALIZING, "stage": None}


@contextlib.contextmanager
def running(trainer: Any, fn: str) -> Iterator[None]:
    """``trainer.state`` through one trainer method ``fn`` (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``):
    running, then finished, or interrupted when it raises (the exception goes on; a ``KeyboardInterrupt`` becomes
    ``SystemExit(1)`` after Lightning's "graceful shutdown" info line, as Lightning's
    ``_call_and_handle_interrupt``; its tear-down then puts the SIGINT handler back as it was, so it is left alone).

    Raises:
        SystemExit: code 1, for a ``KeyboardInterrupt`` raised inside.
    """
    status = trainer._lightning_status
    status.update(fn=TrainerFn(fn), status=TrainerStatus.RUNNING, stage=_STAGE[fn])
    try:
        yield
    except KeyboardInterrupt:  # after the run's exception hooks and tear-down: Lightning's graceful shutdown
        status.update(status=TrainerStatus.INTERRUPTED)
        logging.getLogger("taskfit").info("\nDetected KeyboardInterrupt, attempting graceful shutdown ...")
        raise SystemExit(1) from None
    except BaseException:
        status.update(status=TrainerStatus.INTERRUPTED)
        raise
    status.update(status=TrainerStatus.FINISHED, stage=None)


class DataModuleState:
    """The datamodule's ``state_dict()`` saved in every checkpoint under its class's qualified name and given back
    to ``load_state_dict`` on resume (Lightning's checkpoint key), each timed by the trainer's profiler. Not a
    callback: Lightning's ``trainer.callbacks`` holds no entry for it, so the door's always-present
    :class:`~taskfit.lightning.loop_schedule.LightningLoop` carries it for one trainer method."""

    def __init__(self, datamodule: Any, profiler: Any) -> None:
        self.datamodule, self.profiler = datamodule, profiler

    def _action(self, hook: str) -> str:
        return f"[LightningDataModule]{type(self.datamodule).__name__}.{hook}"

    def save(self, checkpoint: dict[str, Any]) -> None:
        """Put the datamodule's non-empty ``state_dict()`` into ``checkpoint``."""
        with self.profiler.profile(self._action("state_dict")):
            state = self.datamodule.state_dict()
        if state:
            checkpoint[type(self.datamodule).__qualname__] = state

    def load(self, checkpoint: dict[str, Any]) -> None:
        """Give the datamodule its part of ``checkpoint`` (nothing when the checkpoint has none)."""
        key = type(self.datamodule).__qualname__
        if key in checkpoint:
            with self.profiler.profile(self._action("load_state_dict")):
                self.datamodule.load_state_dict(checkpoint[key])


@contextlib.contextmanager
def profiled_datamodule(datamodule: Any, profiler: Any) -> Iterator[None]:
    """Inside, ``datamodule``'s ``prepare_data``, ``setup``, ``teardown`` and ``*_dataloader`` are timed by
    ``profiler`` as ``[LightningDataModule]<Class>.<hook>`` (Lightning's action names); the methods are restored
    after."""
    from taskfit.callbacks.profilers import PassThroughProfiler

    if datamodule is None or isinstance(profiler, PassThroughProfiler):  # nothing to record: methods untouched
        yield
        return
    own = {n: datamodule.__dict__[n] for n in _PROFILED if n in datamodule.__dict__}
    for name in _PROFILED:
        method = getattr(datamodule, name)
        action = f"[LightningDataModule]{type(datamodule).__name__}.{name}"

        def timed(*args: Any, _m: Any = method, _a: str = action, **kwargs: Any) -> Any:
            with profiler.profile(_a):
                return _m(*args, **kwargs)

        setattr(datamodule, name, timed)
    try:
        yield
    finally:
        for name in _PROFILED:
            if name in own:
                setattr(datamodule, name, own[name])
            else:
                datamodule.__dict__.pop(name, None)
