"""CSV logger: ``metrics.csv`` and ``hparams.yaml`` in the logging folder (``report_to="csv"``)."""

from __future__ import annotations

import csv
import logging
import os
from typing import Any

from lightning_utilities.core.imports import RequirementCache

from taskfit.loggers.logger import Logger


class CSVLogger(Logger):
    """Append one row per ``log_metrics`` call to ``<save_dir>/metrics.csv`` (columns grow as new names appear:
    the file is rewritten with the wider header, as Lightning's ``CSVLogger`` does).

    At :meth:`finalize` (the end of ``fit``) it draws ``training_curves.png`` next to ``metrics.csv``: training
    loss, learning rate and every evaluation metric against ``global_step`` (F-OBS-3), when matplotlib (extra
    ``plots``) is installed and ``plot`` is True. A failed drawing is logged as a warning, never raised.

    Args:
        save_dir (str): folder for ``metrics.csv`` and ``hparams.yaml`` (created when needed).
        flush_every (int): rows buffered before writing (1 writes every row at once).
        plot (bool): draw the PNG at the end of fit (default True; skipped without matplotlib).
    """

    name = "csv"

    def __init__(self, save_dir: str, flush_every: int = 1, plot: bool = True) -> None:
        self.save_dir = save_dir
        self.plot = plot
        self.plot_path: str | None = None
        self.path = os.path.join(save_dir, "metrics.csv")
        self.flush_every = max(1, int(flush_every))
        self.columns: list[str] = ["step"]
        self.rows: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        import yaml

        os.makedirs(self.save_dir, exist_ok=True)
        with open(os.path.join(self.save_dir, "hparams.yaml"), "w") as f:
            yaml.safe_dump(params, f, sort_keys=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._pending.append({"step": step, **metrics})
        if len(self._pending) >= self.flush_every:
            self.save()

    def save(self) -> None:
        """Write buffered rows (rewriting the file when new columns appeared)."""
        if not self._pending:
            return
        os.makedirs(self.save_dir, exist_ok=True)
        new_cols = [k for row in self._pending for k in row if k not in self.columns]
        rewrite = bool(new_cols) or not os.path.exists(self.path)
        for k in new_cols:
            if k not in self.columns:
                self.columns.append(k)
        self.rows.extend(self._pending)
        rows, self._pending = (self.rows if rewrite else self._pending), []
        with open(self.path, "w" if rewrite else "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            if rewrite:
                writer.writeheader()
            writer.writerows(rows)

    def finalize(self, status: str) -> None:
        self.save()
        if self.plot and os.path.exists(self.path) and RequirementCache(module="matplotlib"):
            from taskfit.plots import plot_run

            try:
                self.plot_path = plot_run(self.path)
            except Exception as err:  # a plot must never turn a finished run into a failure
                logging.getLogger("taskfit").warning("Could not draw the training curves: %s", err)
