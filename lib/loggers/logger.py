"""Logger interface: where metrics and hyperparameters go (F-OBS-2). Mirrors Lightning's ``Logger``."""

from __future__ import annotations

import json
import math
from numbers import Number
from typing import Any

from lightning_utilities.core.imports import RequirementCache


class Logger:
    """Receives hyperparameters once and metric dicts keyed by ``global_step``. Only rank zero logs: ``Fit``
    calls these methods on global rank 0 only, and loggers create their files/runs lazily on the first call,
    so a logger built on another rank writes nothing (F-STRAT-8)."""

    name = "logger"

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        """Record the run's arguments (a flat dict of scalars)."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` (name -> float) at optimizer step ``step``."""

    def log_summary(self, metrics: dict[str, float], step: int) -> None:
        """Record the end-of-run summary (``train_runtime``, ``train_loss`` as the mean over the run, ...) apart
        from the per-step metrics, so a user's own ``self.log("train_loss")`` curve keeps its name and values.
        Default: the values go to :meth:`log_metrics` under ``summary/<name>`` at the final ``step``."""
        self.log_metrics({f"{SUMMARY_PREFIX}{k}": v for k, v in metrics.items()}, step)

    def resume(self, step: int, log_history: list[dict[str, Any]]) -> None:
        """Continue the run that a checkpoint at optimizer step ``step`` belongs to (called on global rank 0
        before anything is logged; ``log_history`` is the checkpoint's history, each entry with ``step``).
        Points the stopped run logged after the checkpoint are dropped where the backend allows it."""

    def finalize(self, status: str) -> None:
        """Flush and close; ``status`` is ``"success"``, ``"failed"`` or ``"interrupted"``."""


#: prefix of the end-of-run summary keys in loggers that keep one namespace for all values
SUMMARY_PREFIX = "summary/"


def entries_at(log_history: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """The ``log_history`` entries logged at optimizer step ``step``, without their ``step`` key."""
    return [{k: v for k, v in row.items() if k != "step"} for row in log_history if row.get("step") == step]


def read_run_id(save_dir: str, name: str) -> str | None:
    """The run id a tracker logger recorded in ``save_dir`` (see :func:`write_run_id`), or None."""
    import os

    path = os.path.join(save_dir, f".{name}_run_id")
    if os.path.isfile(path):
        with open(path) as f:
            return f.read().strip() or None
    return None


def write_run_id(save_dir: str, name: str, run_id: str) -> None:
    """Record a tracker's run id in ``save_dir`` so a resumed run logs into the same run."""
    import os

    os.makedirs(save_dir, exist_ok=True)
    with open(os.path.join(save_dir, f".{name}_run_id"), "w") as f:
        f.write(run_id)


def require(package: str, extra: str, what: str) -> None:
    """Raise a clear error when an optional ``package`` is missing.

    Raises:
        ModuleNotFoundError: naming the extra to install (``pip install 'taskfit[extra]'``).
    """
    available = RequirementCache(module=package)
    if not available:
        raise ModuleNotFoundError(f"{what} needs the '{package}' package, which is not installed: "
                                  f"pip install 'taskfit[{extra}]'")


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite-or-not numeric items of ``metrics`` as floats (strings, lists and None are dropped; bools
    count as 0/1). Loggers that only take numbers use this."""
    out = {}
    for k, v in metrics.items():
        if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:
            v = v.item()
        if isinstance(v, Number) and not isinstance(v, complex):
            out[k] = float(v)
    return out


#: prefix of a module hyperparameter whose name an argument of the run already holds
HPARAMS_PREFIX = "hparams/"


def json_hparams(module: Any) -> dict[str, Any] | None:
    """The JSON-serialisable values of ``module.hparams`` (what a checkpoint's ``config.json`` stores and loggers
    receive), read without calling a method of the module, so a user's hook recorder sees no call Lightning does
    not make. None for an object without Lightning's ``save_hyperparameters`` members (a plain ``nn.Module``).

    Args:
        module (Any): a ``TaskModule``, a ``DataModule`` or any object.

    Returns:
        dict[str, Any] | None: the values that ``json.dumps`` accepts (others are left out), in ``hparams`` order.
    """
    if not hasattr(type(module), "hparams_for_checkpoint"):
        return None
    out = {}
    for k, v in (vars(module).get("_hparams") or {}).items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        out[k] = v
    return out


def run_hyperparams(args: dict[str, Any], module: Any) -> dict[str, Any]:
    """What ``log_hyperparams`` receives: the run's arguments plus the module's ``save_hyperparameters`` values
    (its JSON-able ``hparams``, unless saved with ``logger=False``; mirrors Lightning, which logs the module's
    hparams). A module value under a name the arguments hold keeps both: it goes in as ``hparams/<name>``.

    Args:
        args (dict): the arguments as a flat dict (``FitArguments.to_sanitized_dict()``).
        module: the ``TaskModule`` (any object; without ``save_hyperparameters`` only ``args`` are returned).
    """
    out = dict(args)
    saved = json_hparams(module)
    if saved is None or not getattr(module, "_log_hyperparams", True):
        return out
    for k, v in saved.items():
        out[HPARAMS_PREFIX + k if k in args and args[k] != v else k] = v
    return out


def lightning_hyperparams(module: Any, datamodule: Any = None) -> dict[str, Any] | None:
    """What Lightning's ``Trainer`` hands ``log_hyperparams`` (``loggers/utilities.py`` ``_log_hyperparams``): the
    module's ``hparams_initial`` merged with the datamodule's (each only when saved with ``logger=True``), values as
    saved (not only JSON ones); None when neither logs any.

    Raises:
        RuntimeError: a name both hold with different values ("Error while merging hparams: ...", Lightning's).
    """
    def initial(obj: Any) -> dict[str, Any] | None:
        # Lightning's _log_hyperparams is False until save_hyperparameters(logger=True) sets it
        if obj is None or not hasattr(type(obj), "hparams_initial"):
            return None
        if not vars(obj).get("_log_hyperparams", False):
            return None
        return dict(obj.hparams_initial)

    mine, data = initial(module), initial(datamodule)
    if mine is not None and data is not None:
        clash = [k for k in mine.keys() & data.keys() if k != "_class_path" and not _same_value(mine[k], data[k])]
        if clash:
            raise RuntimeError(f"Error while merging hparams: the keys {clash} are present in both the "
                               "LightningModule's and LightningDataModule's hparams but have different values.")
        merged: dict[str, Any] | None = {**mine, **data}
    else:
        merged = mine if mine is not None else data
    return None if merged is None else {k: v for k, v in merged.items() if k != "_class_path"}


def _same_value(a: Any, b: Any) -> bool:
    import torch

    if type(a) is not type(b) or (isinstance(a, torch.Tensor) and a is not b):
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values without a truth value: not the same
        return False


def flat_params(params: dict[str, Any], max_len: int = 500) -> dict[str, Any]:
    """``params`` with values a tracker accepts: numbers, bools and strings kept, None as ``"None"``, anything
    else as its ``str`` cut to ``max_len`` characters (MLflow/TensorBoard hparams only take scalars)."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        if isinstance(v, bool) or (isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))):
            out[k] = v
        else:
            out[k] = str(v)[:max_len]
    return out
