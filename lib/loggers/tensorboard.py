"""TensorBoard logger (``report_to="tensorboard"``, extra ``tensorboard``), over ``torch.utils.tensorboard``."""

from __future__ import annotations

from typing import Any

from taskfit.loggers.logger import Logger, flat_params, require, scalar_metrics


class TensorBoardLogger(Logger):
    """Write TensorBoard event files: one scalar per metric at its ``global_step`` and the hyperparameters
    (HParams plugin plus a text summary). Mirrors Lightning's ``TensorBoardLogger`` and HF's
    ``TensorBoardCallback`` (``logging_dir`` is the event folder).

    Args:
        save_dir (str): folder of the event files (created on the first write).
        flush_secs (int): seconds between flushes of the writer (``SummaryWriter(flush_secs=...)``).

    Raises:
        ModuleNotFoundError: ``tensorboard`` is not installed (extra ``tensorboard``); raised at construction.
    """

    name = "tensorboard"

    def __init__(self, save_dir: str, flush_secs: int = 30) -> None:
        require("tensorboard", "tensorboard", "TensorBoardLogger (report_to='tensorboard')")
        self.save_dir, self.flush_secs = save_dir, flush_secs
        self._writer: Any = None

    @property
    def experiment(self) -> Any:
        """The ``torch.utils.tensorboard.SummaryWriter`` (created on first use, so only rank zero makes files)."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=self.save_dir, flush_secs=self.flush_secs)
        return self._writer

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        clean = flat_params(params)
        writer = self.experiment
        for summary in hparams(clean, {}):
            writer.file_writer.add_summary(summary)
        writer.add_text("hparams", "\n".join(f"    {k}: {v}" for k, v in sorted(clean.items())))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        writer = self.experiment
        for k, v in scalar_metrics(metrics).items():
            writer.add_scalar(k, v, global_step=step)

    def finalize(self, status: str) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
