"""Weights & Biases logger (``report_to="wandb"``, extra ``wandb``): offline by default."""

from __future__ import annotations

import os
from typing import Any

from taskfit.loggers.logger import SUMMARY_PREFIX, Logger, read_run_id, require, scalar_metrics, write_run_id

_EXIT = {"success": 0, "failed": 1, "interrupted": 255}


class WandbLogger(Logger):
    """Log to a W&B run: the hyperparameters as the run config, metrics with ``step=global_step``. The run is
    offline unless ``mode`` or ``$WANDB_MODE`` says otherwise, so nothing leaves the machine: the run folder
    ``<save_dir>/wandb/offline-run-*`` can be uploaded later with ``wandb sync``. Mirrors HF's ``WandbCallback``
    (``$WANDB_PROJECT``) and Lightning's ``WandbLogger``. The end-of-run summary goes to the run's summary as
    ``summary/<name>``. The run id is recorded in ``<save_dir>/.wandb_run_id``; a run resumed from a checkpoint
    continues that W&B run (``wandb.init(id=..., resume="allow")``; offline, the resumed part is a second
    ``offline-run-*`` folder with the same run id, which ``wandb sync`` merges).

    Args:
        save_dir (str): folder under which wandb writes ``wandb/``.
        project (str | None): project name; default ``$WANDB_PROJECT`` or ``"taskfit"``.
        run_name (str | None): the run's display name.
        mode (str | None): ``"offline"`` (default), ``"online"`` or ``"disabled"``.

    Attributes:
        run_dir (str | None): the run's folder once it exists.

    Raises:
        ModuleNotFoundError: ``wandb`` is not installed (extra ``wandb``); raised at construction.
        ValueError: an unknown ``mode``.
    """

    name = "wandb"
    MODES = ("offline", "online", "disabled")

    def __init__(self, save_dir: str, project: str | None = None, run_name: str | None = None,
                 mode: str | None = None) -> None:
        require("wandb", "wandb", "WandbLogger (report_to='wandb')")
        mode = mode or os.environ.get("WANDB_MODE") or "offline"
        if mode not in self.MODES:
            raise ValueError(f"WandbLogger mode={mode!r} is not valid; choose one of {self.MODES}.")
        self.save_dir, self.mode, self.run_name = save_dir, mode, run_name
        self.project = project or os.environ.get("WANDB_PROJECT") or "taskfit"
        self.run_dir: str | None = None
        self._run: Any = None
        self._config: dict[str, Any] = {}
        self.run_id: str | None = None

    @property
    def experiment(self) -> Any:
        """The ``wandb`` run, started on first use (rank zero only)."""
        if self._run is None:
            import wandb

            os.makedirs(self.save_dir, exist_ok=True)
            resume = {"id": self.run_id, "resume": "allow"} if self.run_id else {}
            self._run = wandb.init(project=self.project, name=self.run_name, dir=self.save_dir, mode=self.mode,
                                   config=self._config, reinit="create_new",
                                   settings=wandb.Settings(silent=True, console="off"), **resume)
            self.run_dir = os.path.dirname(self._run.dir)  # .../offline-run-*/files -> the run folder
            self.run_id = self._run.id
            write_run_id(self.save_dir, "wandb", self.run_id)
        return self._run

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        self._config = {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
                        for k, v in params.items()}
        if self._run is not None:
            self._run.config.update(self._config, allow_val_change=True)
        else:
            self.experiment  # noqa: B018  starts the run with the config

    def resume(self, step: int, log_history: list[dict[str, Any]]) -> None:
        """Continue the W&B run recorded in ``save_dir`` (unless ``$WANDB_RUN_ID`` names one)."""
        if self._run is None:
            self.run_id = os.environ.get("WANDB_RUN_ID") or read_run_id(self.save_dir, "wandb")

    def log_summary(self, metrics: dict[str, float], step: int) -> None:
        self.experiment.summary.update({SUMMARY_PREFIX + k: v for k, v in scalar_metrics(metrics).items()})

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        values = scalar_metrics(metrics)
        if values:
            self.experiment.log(values, step=step)

    def finalize(self, status: str) -> None:
        if self._run is not None:
            self._run.finish(exit_code=_EXIT.get(status, 0))
            self._run = None
