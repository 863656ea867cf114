"""Loggers by name (``report_to``, F-OBS-2): ``csv``, ``tensorboard``, ``mlflow``, ``wandb``. The optional
packages are imported only when a logger writes, so importing this package stays cheap."""

from __future__ import annotations

from typing import Any

from taskfit.loggers.csv_logger import CSVLogger
from taskfit.loggers.logger import Logger
from taskfit.loggers.mlflow import MLFlowLogger
from taskfit.loggers.tensorboard import TensorBoardLogger
from taskfit.loggers.wandb import WandbLogger

#: ``report_to`` name -> logger class.
LOGGERS: dict[str, type[Logger]] = {"csv": CSVLogger, "tensorboard": TensorBoardLogger, "mlflow": MLFlowLogger,
                                    "wandb": WandbLogger}


def build_loggers(args: Any, loggers: list[Any] | None = None) -> list[Logger]:
    """The loggers of a run: the given logger objects, plus one per name in ``args.report_to`` whose class is
    not among them yet (so ``loggers=[CSVLogger(...)]`` with ``report_to="csv"`` gives one CSV logger).

    Built loggers write under ``args.resolved_logging_dir``; MLflow and W&B runs are named
    ``args.resolved_run_name`` (HF ``run_name``).

    Args:
        args (FitArguments): ``report_to`` (a list of names, already normalised), ``logging_dir``, ``run_name``.
        loggers (list[Logger] | None): logger objects given to ``Fit(loggers=...)``.

    Raises:
        TypeError: a given logger has no ``log_metrics`` method (names its type).
        ModuleNotFoundError: a named logger's package is missing (names the extra to install).
    """
    out = list(loggers or [])
    for lg in out:
        if not callable(getattr(lg, "log_metrics", None)):
            raise TypeError(f"loggers must be Logger objects (with log_metrics/log_hyperparams/finalize); got "
                            f"{type(lg).__name__}. Names go to report_to: {sorted(LOGGERS)}.")
    folder, run_name = args.resolved_logging_dir, args.resolved_run_name
    for name in args.report_to:
        cls = LOGGERS.get(name)
        if cls is None:  # a name run as transformers' own callback ("kubeflow"): see taskfit.callbacks.reporting
            continue
        if any(isinstance(lg, cls) for lg in out):
            continue
        out.append(cls(folder) if name in ("csv", "tensorboard") else cls(folder, run_name=run_name))
    return out


def resume_loggers(loggers: list[Any], step: int, log_history: list[dict[str, Any]]) -> None:
    """Tell every logger that the run continues from a checkpoint at optimizer step ``step`` (rank zero only;
    see :meth:`Logger.resume`). Logger objects without a ``resume`` method are left as they are."""
    for lg in loggers:
        if callable(getattr(lg, "resume", None)):
            lg.resume(step, log_history)


def send_summary(loggers: list[Any], metrics: dict[str, Any], step: int) -> None:
    """Hand the end-of-run summary to every logger's ``log_summary`` (objects without one get ``log_metrics``
    with ``summary/``-prefixed names, so the summary never overwrites a per-step curve)."""
    from taskfit.loggers.logger import SUMMARY_PREFIX

    for lg in loggers:
        if callable(getattr(lg, "log_summary", None)):
            lg.log_summary(dict(metrics), step)
        else:
            lg.log_metrics({SUMMARY_PREFIX + k: v for k, v in metrics.items()}, step)


__all__ = ["LOGGERS", "CSVLogger", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger", "build_loggers", "resume_loggers",
           "send_summary"]
