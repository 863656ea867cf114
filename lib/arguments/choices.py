"""The option tables: the valid choices of each enum-like option of ``FitArguments`` (HF's names and values)."""

import importlib.util
import os
from functools import cache

from taskfit.optim.names import LR_SCHEDULER_NAMES as LR_SCHEDULERS  # noqa: F401  (a table of its own)
from taskfit.optim.names import OPTIMIZER_NAMES as OPTIMIZERS  # noqa: F401  (a table of its own)

INTERVAL_STRATEGIES = ("no", "steps", "epoch")

SAVE_STRATEGIES = ("no", "steps", "epoch", "best")
HUB_STRATEGIES = ("end", "every_save", "checkpoint", "all_checkpoints")
PRECISIONS = ("32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")
PRECISION_ALIASES = {"32": "32-true", "64": "64-true", "16": "16-mixed", "bf16": "bf16-mixed", "half": "16-true",
                     "double": "64-true"}
LOG_LEVELS = ("debug", "info", "warning", "error", "critical", "passive")
REPORT_TO = ("none", "all", "csv", "tensorboard", "mlflow", "wandb", "kubeflow")
#: Every logger ``report_to`` can name. ``"all"`` expands to ``csv`` plus those whose package is installed (HF:
#: "all installed integrations"), see :func:`installed_loggers`. The default ``None`` means ``csv`` only: a cheap
#: local log that the plots read (HF v5 made its default "none" for the same reason: no surprise MLflow/W&B runs).
BUILT_LOGGERS = ("csv", "tensorboard", "mlflow", "wandb")
#: ``report_to`` names run as transformers' own integration callbacks (not taskfit loggers).
HF_CALLBACK_REPORTERS = ("kubeflow",)


@cache
def transformers_installed() -> bool:
    """Whether transformers (optional for taskfit) is installed; found, not imported."""
    return importlib.util.find_spec("transformers") is not None


def kubeflow_available() -> bool:
    """HF's ``transformers.integrations.is_kubeflow_available`` rule (a Kubeflow TrainJob injects
    ``KUBEFLOW_TRAINER_SERVER_URL``; ``DISABLE_KUBEFLOW_INTEGRATION=TRUE`` opts out), read from the environment
    here so that building arguments never imports transformers."""
    if os.getenv("DISABLE_KUBEFLOW_INTEGRATION", "FALSE").upper() == "TRUE":
        return False
    return os.getenv("KUBEFLOW_TRAINER_SERVER_URL") is not None


@cache
def installed_loggers() -> tuple[str, ...]:
    """``csv`` and every other logger of :data:`BUILT_LOGGERS` whose package is installed (no import is done)."""
    return tuple(n for n in BUILT_LOGGERS if n == "csv" or importlib.util.find_spec(n) is not None)
FSDP_OPTIONS = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2", "offload", "auto_wrap")
DEBUG_OPTIONS = ("underflow_overflow", "tpu_metrics_debug")
HALF_PRECISION_BACKENDS = ("auto", "apex", "cpu_amp")
DDP_BACKENDS = ("nccl", "gloo", "mpi", "ccl", "hccl", "xccl")
#: HF 5 ``train_sampling_strategy`` values; ``batch_rebalance`` is refused (see :func:`_validate`).
TRAIN_SAMPLING_STRATEGIES = ("random", "sequential", "group_by_length", "batch_rebalance")
INCLUDE_FOR_METRICS = ("inputs", "loss")
TOKENS_SEEN = ("no", "all", "non_padding")
MULTIPROCESSING_CONTEXTS = ("fork", "spawn", "forkserver")
