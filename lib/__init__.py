"""taskfit: a PyTorch training framework. Write a ``TaskModule`` (what to compute), hand it to ``Fit`` (how to
run it); ``FitArguments`` holds every option under its Hugging Face ``TrainingArguments`` name.

Imports are lazy so that ``import taskfit`` stays fast; ``from taskfit import Fit`` loads what ``Fit`` needs.

``__all__`` lists the handful of names users import first. The other names below still resolve from ``taskfit``
(so no older import breaks), but their documented home is their package: ``taskfit.callbacks.EarlyStopping``,
``taskfit.loggers.CSVLogger``, ``taskfit.io.CheckpointError``, ``taskfit.efficiency.estimate.estimate_memory``, ...
"""

from __future__ import annotations

import importlib
from typing import Any

from taskfit.__about__ import __version__
from taskfit.redact import install_log_filter as _install_log_filter

_install_log_filter()  # no record of the taskfit logger shows a credential

_EXPORTS = {
    "Fit": "taskfit.fit.fit", "TrainOutput": "taskfit.fit.fit",
    "FitArguments": "taskfit.arguments.fit_arguments",
    "TaskModule": "taskfit.core.module",
    "Callback": "taskfit.callbacks.base", "EarlyStopping": "taskfit.callbacks.early_stopping",
    "EarlyStoppingCallback": "taskfit.callbacks.hf_early_stopping", "ProgressBar": "taskfit.callbacks.progress",
    "ThroughputMonitor": "taskfit.callbacks.throughput",
    "DeviceStatsMonitor": "taskfit.callbacks.device_stats",
    "DataModule": "taskfit.data.loaders",
    "EvalPrediction": "taskfit.metrics", "PredictionOutput": "taskfit.metrics",
    "FitState": "taskfit.loops.state", "FitControl": "taskfit.loops.state",
    "CSVLogger": "taskfit.loggers.csv_logger", "Logger": "taskfit.loggers.logger",
    "TensorBoardLogger": "taskfit.loggers.tensorboard", "MLFlowLogger": "taskfit.loggers.mlflow",
    "WandbLogger": "taskfit.loggers.wandb",
    "seed_everything": "taskfit.seed",
    "CheckpointError": "taskfit.io.checkpoint_io", "UnsafeCheckpointError": "taskfit.io.checkpoint_io",
    "NonFiniteError": "taskfit.loops.finite",
    "Engine": "taskfit.engine.engine",
    "estimate_memory": "taskfit.efficiency.estimate", "MemoryEstimate": "taskfit.efficiency.estimate",
}

#: The names users import first: a run (Fit, FitArguments, TrainOutput), the code they write (TaskModule,
#: DataModule, Callback), their own loop (Engine), seeding and the HF metric types of compute_metrics.
__all__ = ["Callback", "DataModule", "Engine", "EvalPrediction", "Fit", "FitArguments", "PredictionOutput", "TaskModule",
           "TrainOutput", "__version__", "seed_everything"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'taskfit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
