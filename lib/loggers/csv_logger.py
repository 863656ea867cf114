"""CSV logger: ``metrics.csv``, ``summary.json`` and ``hparams.yaml`` in the logging folder (``report_to="csv"``)."""

from __future__ import annotations

import csv
import json
import logging
import os
from typing import Any

import fsspec
from lightning_utilities.core.imports import RequirementCache

from taskfit.loggers.logger import Logger


class CSVLogger(Logger):
    """Append one row per ``log_metrics`` call to ``<save_dir>/metrics.csv`` (columns grow as new names appear:
    the file is rewritten with the wider header, as Lightning's ``CSVLogger`` does).

    The end-of-run summary (``train_runtime``, ``train_loss`` averaged over the run, ...) goes to
    ``summary.json``, not to ``metrics.csv``, so a column such as a user's own ``train_loss`` holds only that
    user's values. On resume the rows the checkpoint had seen are kept and the ones the stopped run wrote after
    it are dropped, so ``metrics.csv`` covers the whole run once.

    At :meth:`finalize` (the end of ``fit``) it draws ``training_curves.png`` next to ``metrics.csv``: every
    logged scalar against ``global_step`` (see :func:`taskfit.loggers.plots.plot_history`), when matplotlib (extra
    ``plots``) is installed and ``plot`` is True. A failed drawing is logged as a warning, never raised.

    Args:
        save_dir (str): folder for ``metrics.csv`` and ``hparams.yaml`` (created when needed); a local path or an
            fsspec URL (``s3://...``, ``memory://...``; the PNG is drawn for local folders only).
        flush_every (int): rows buffered before writing (1 writes every row at once).
        plot (bool): draw the PNG at the end of fit (default True; skipped without matplotlib).
    """

    name = "csv"

    def __init__(self, save_dir: str, flush_every: int = 1, plot: bool = True) -> None:
        self.save_dir = save_dir
        self._fs = fsspec.core.url_to_fs(str(save_dir))[0]
        self.plot = plot
        self.plot_path: str | None = None
        self.path = os.path.join(save_dir, "metrics.csv")
        self.flush_every = max(1, int(flush_every))
        self.columns: list[str] = ["step"]
        self.rows: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []
        self._read = False  # whether rows an earlier process wrote to metrics.csv were read (kept, never erased)

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        import yaml

        self._fs.makedirs(self.save_dir, exist_ok=True)
        with self._fs.open(os.path.join(self.save_dir, "hparams.yaml"), "w") as f:
            yaml.safe_dump(params, f, sort_keys=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._pending.append({"step": step, **metrics})
        if len(self._pending) >= self.flush_every:
            self.save()

    def log_summary(self, metrics: dict[str, float], step: int) -> None:
        """Write ``summary.json`` (the summary values plus ``step``)."""
        self._fs.makedirs(self.save_dir, exist_ok=True)
        values = {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
        with self._fs.open(os.path.join(self.save_dir, "summary.json"), "w") as f:
            json.dump({**values, "step": step}, f, indent=2, default=str)

    def resume(self, step: int, log_history: list[dict[str, Any]]) -> None:
        """Keep the rows of ``metrics.csv`` up to the checkpoint: every row before ``step`` and, at ``step``,
        as many rows as the checkpoint's history has there (one row per logged dict)."""
        self.save()
        self._read = True
        if not self._fs.isfile(self.path):
            return
        header, rows = self._read_file()
        at_step = sum(1 for row in log_history if row.get("step") == step)
        kept: list[dict[str, Any]] = []
        for row in rows:
            try:
                row_step = int(float(row.get("step") or -1))
            except ValueError:
                continue
            if row_step < step or (row_step == step and at_step > 0):
                at_step -= row_step == step
                kept.append({k: v for k, v in row.items() if v not in (None, "")})
        self.columns = header if "step" in header else ["step", *header]
        self.rows = kept
        with self._fs.open(self.path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writeheader()
            writer.writerows(kept)

    def _read_file(self) -> tuple[list[str], list[dict[str, Any]]]:
        with self._fs.open(self.path, "r", newline="") as f:
            reader = csv.DictReader(f)
            return list(reader.fieldnames or ["step"]), list(reader)

    def save(self) -> None:
        """Write buffered rows (rewriting the file when new columns appeared). The first write of this logger
        keeps the rows already in ``metrics.csv`` (an earlier process's run, e.g. before a resume in a script that
        evaluates first): a log is appended to, never erased."""
        if not self._pending:
            return
        self._fs.makedirs(self.save_dir, exist_ok=True)
        if not self._read:
            self._read = True
            if self._fs.isfile(self.path):
                header, rows = self._read_file()
                self.columns = [*(["step"] if "step" not in header else []), *header,
                                *(c for c in self.columns if c not in header and c != "step")]
                self.rows = [{k: v for k, v in row.items() if v not in (None, "")} for row in rows] + self.rows
        new_cols = [k for row in self._pending for k in row if k not in self.columns]
        rewrite = bool(new_cols) or not self._fs.exists(self.path)
        for k in new_cols:
            if k not in self.columns:
                self.columns.append(k)
        self.rows.extend(self._pending)
        rows, self._pending = (self.rows if rewrite else self._pending), []
        with self._fs.open(self.path, "w" if rewrite else "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            if rewrite:
                writer.writeheader()
            writer.writerows(rows)

    def finalize(self, status: str) -> None:
        self.save()
        if self.plot and os.path.exists(self.path) and RequirementCache(module="matplotlib"):
            from taskfit.loggers.plots import plot_run

            try:
                self.plot_path = plot_run(self.path)
            except Exception as err:  # a plot must never turn a finished run into a failure
                logging.getLogger("taskfit").warning("Could not draw the training curves: %s", err)
