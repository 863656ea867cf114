"""What ``taskfit validate|test|predict`` leave on disk: each evaluation logs into its own folder (never into the
training run's ``metrics.csv``), and ``predict`` writes its predictions and metrics under ``output_dir``."""

from __future__ import annotations

import json
import os
from typing import Any

#: files ``taskfit predict`` writes into its folder (the metrics file is named as HF's ``save_metrics("predict")``)
PREDICTIONS_NAME = "predictions.pt"
METRICS_NAME = "predict_results.json"


def evaluation_name(command: str, ckpt_path: str | None) -> str:
    """The folder name of one evaluation outside ``fit``: ``"validate-checkpoint-16"`` for ``taskfit validate
    --ckpt_path last`` resolved to ``.../checkpoint-16``; the command alone (``"test"``) without a checkpoint.

    Args:
        command (str): ``"validate"``, ``"test"`` or ``"predict"``.
        ckpt_path (str | None): the resolved checkpoint folder (path or URL), or None.
    """
    if not ckpt_path:
        return command
    return f"{command}-{os.path.basename(ckpt_path.rstrip('/'))}"


def evaluation_logging_dir(args: Any, command: str, ckpt_path: str | None) -> str:
    """``<logging_dir>/<evaluation_name>``: where an evaluation outside ``fit`` logs. The training run's
    ``metrics.csv`` (and its ``hparams.yaml``) stay as ``fit`` left them, so its curves never bend back to step 0
    where a fresh run's evaluation logs (Lightning's ``trainer.validate`` logs beside the run, not into its curves)."""
    return os.path.join(args.resolved_logging_dir, evaluation_name(command, ckpt_path))


def _tensors(value: Any) -> Any:
    """numpy arrays (and nested lists/tuples/dicts of them) as tensors, so ``torch.load(weights_only=True)`` reads
    them back; other values unchanged."""
    import numpy as np
    import torch

    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, dict):
        return {k: _tensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_tensors(v) for v in value)
    return value


def save_predictions(result: Any, metrics: dict[str, Any], folder: str) -> tuple[str, str]:
    """Write ``folder/predictions.pt`` (``{"predictions", "label_ids"}`` as tensors, numpy arrays converted; read
    it with ``torch.load(path, weights_only=True)``) and ``folder/predict_results.json`` (the metrics).

    Args:
        result: ``Fit.predict``'s ``PredictionOutput`` (``predictions``, ``label_ids``) or a list of per-batch
            predictions.
        metrics (dict): the run's metrics (JSON-able values; others written with ``str``).
        folder (str): local folder (created when needed).

    Returns:
        ``(predictions_path, metrics_path)``.
    """
    import torch

    os.makedirs(folder, exist_ok=True)
    if hasattr(result, "predictions"):
        payload = {"predictions": result.predictions, "label_ids": getattr(result, "label_ids", None)}
    else:
        payload = {"predictions": result, "label_ids": None}
    pred_path = os.path.join(folder, PREDICTIONS_NAME)
    torch.save(_tensors(payload), pred_path)
    metrics_path = os.path.join(folder, METRICS_NAME)
    with open(metrics_path, "w") as f:
        json.dump(metrics, f, indent=2, default=lambda v: v.item() if hasattr(v, "item") else str(v))
    return pred_path, metrics_path
