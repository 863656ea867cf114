"""Logger interface: where metrics and hyperparameters go (F-OBS-2). Mirrors Lightning's ``Logger``."""

from __future__ import annotations

from typing import Any


class Logger:
    """Receives hyperparameters once and metric dicts keyed by ``global_step``. Only rank zero logs."""

    name = "logger"

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        """Record the run's arguments (a flat dict of scalars)."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` (name -> float) at optimizer step ``step``."""

    def finalize(self, status: str) -> None:
        """Flush and close; ``status`` is ``"success"``, ``"failed"`` or ``"interrupted"``."""
