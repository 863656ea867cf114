"""Stop training after a time budget, with a checkpoint (mirrors Lightning's ``Timer``)."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

from taskfit.callbacks.base import Callback
from taskfit.errors import configuration_error


def parse_duration(duration: Any) -> float | None:
    """Seconds of ``duration``: ``"DD:HH:MM:SS"``, a ``timedelta``, a dict of ``timedelta`` arguments
    (``{"hours": 2}``), a number of seconds, or None (no limit).

    Raises:
        ValueError: any other value.
    """
    if duration is None:
        return None
    if isinstance(duration, timedelta):
        return duration.total_seconds()
    if isinstance(duration, dict):
        return timedelta(**duration).total_seconds()
    if isinstance(duration, (int, float)) and not isinstance(duration, bool) and duration >= 0:
        return float(duration)
    if isinstance(duration, str) and re.fullmatch(r"\d+:\d{1,2}:\d{1,2}:\d{1,2}", duration.strip()):
        d, h, m, s = (int(v) for v in duration.strip().split(":"))
        return timedelta(days=d, hours=h, minutes=m, seconds=s).total_seconds()
    # Lightning's words
    raise configuration_error(f"`Timer(duration={duration!r})` is not a valid duration. Expected a string in the "
                              "format DD:HH:MM:SS, a timedelta, a dict such as {'hours': 2}, or seconds >= 0.")


class Timer(Callback):
    """Stop training once ``duration`` has passed: the run ends after the current step (``interval="step"``) or
    epoch (``"epoch"``) and writes a checkpoint there, so it resumes exactly. Time already trained is saved in the
    checkpoint and counted again after a resume (as Lightning).

    Args:
        duration (str | timedelta | dict | float | None): the budget (see :func:`parse_duration`).
        interval (str): ``"step"`` or ``"epoch"``: when the budget is checked.
        verbose (bool): log when the budget is reached.

    Raises:
        ValueError: bad ``duration`` or ``interval`` (Lightning's messages; Lightning raises its
            ``MisconfigurationException``).
    """

    _STAGES = ("train", "sanity_check", "validate", "test", "predict")  # Lightning's RunningStage values

    def __init__(self, duration: Any = None, interval: str = "step", verbose: bool = True) -> None:
        if interval not in ("step", "epoch"):
            raise configuration_error(f"Unsupported parameter value `Timer(interval={interval})`. Possible choices "
                                      "are: step, epoch")  # Lightning's words
        self.duration, self.interval, self.verbose = parse_duration(duration), interval, verbose
        self._start: dict[str, float | None] = {}
        self._end: dict[str, float | None] = {}
        self._offset = 0.0
        self.stopped_step: int | None = None

    def start_time(self, stage: str = "train") -> float | None:
        """``time.monotonic()`` when ``stage`` started (None before)."""
        return self._start.get(stage)

    def end_time(self, stage: str = "train") -> float | None:
        """``time.monotonic()`` when ``stage`` ended (None while running)."""
        return self._end.get(stage)

    def time_elapsed(self, stage: str = "train") -> float:
        """Seconds spent in ``stage`` (training includes the time restored from a checkpoint)."""
        start, end = self._start.get(stage), self._end.get(stage)
        offset = self._offset if stage == "train" else 0.0
        if start is None:
            return offset
        return offset + ((end if end is not None else time.monotonic()) - start)

    def time_remaining(self, stage: str = "train") -> float | None:
        """Seconds left of the budget (None without one)."""
        return None if self.duration is None else self.duration - self.time_elapsed(stage)

    # Lightning's parameter names (trainer, pl_module): callers may pass them by keyword
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._start["train"], self._end["train"] = time.monotonic(), None
        if trainer is not None and getattr(trainer, "control", None) is not None:
            self._check(trainer, at_start=True)  # the time restored from a checkpoint (after on_fit_start)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._end["train"] = time.monotonic()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._start["validate"], self._end["validate"] = time.monotonic(), None

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._end["validate"] = time.monotonic()

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._start["test"], self._end["test"] = time.monotonic(), None

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._end["test"] = time.monotonic()

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._check(trainer, at_start=True)  # a budget spent already (zero, or restored): no step (Lightning)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.interval == "step":
            self._check(trainer)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.interval == "epoch":
            self._check(trainer)

    def _check(self, fit: Any, at_start: bool = False) -> None:
        """Request the stop once the budget is spent. At the start of fit/training no step was taken yet: the
        request alone (the Lightning door stops before any step; ``Fit`` after the next step, as HF, which then
        saves it here)."""
        if self.duration is None or self.time_elapsed("train") < self.duration:
            return
        control = fit.control
        if not control.should_training_stop:
            control.should_training_stop = True
            if self.verbose:
                import logging

                elapsed = timedelta(seconds=int(self.time_elapsed("train")))
                logging.getLogger("taskfit").info(  # Lightning's message
                    "Time limit reached. Elapsed time is %s. Signaling Trainer to stop.", elapsed)
        if not at_start and self.stopped_step is None:
            control.should_save = True  # the loop saves right after this hook, then stops
            self.stopped_step = fit.state.global_step

    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in self._STAGES}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = float(state_dict.get("time_elapsed", {}).get("train", 0.0))
